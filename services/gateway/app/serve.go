package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"mime"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"

	"github.com/shizu-gpu/shizu/services/gateway/identity"
)

// call is what the middleware learned about a request for its handler.
type call struct {
	key    identity.Key
	tenant string
	params map[string]string
	log    *slog.Logger
	// rentalID is the rental a state-changing call concerns, for the
	// audit record (set by the handler when it makes one).
	rentalID string
}

type ctxKey struct{}

// requestID is the request's id (set by ServeHTTP before anything else).
func requestID(ctx context.Context) string {
	id, _ := ctx.Value(ctxKey{}).(string)
	return id
}

var clientRequestID = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

func newRequestID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "req-" + hex.EncodeToString(b)
}

// maxBody bounds a request body.
const maxBody = 1 << 20

// ServeHTTP answers one call: request id, route, API key and access,
// rate limit, audit (state-changing calls), the OpenAPI document's
// validation, idempotency (POSTs with an Idempotency-Key), then the
// route's handler.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := g.now()
	rid := r.Header.Get("X-Request-Id")
	if !clientRequestID.MatchString(rid) {
		rid = newRequestID()
	}
	w.Header().Set("X-Request-Id", rid)
	r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, rid))
	sw := &statusWriter{ResponseWriter: w}
	c := &call{log: g.log.With("request_id", rid)}
	routeName, method := "unknown", "other" // a client's own method is no label
	defer func() {
		took := g.now().Sub(start)
		c.log.Info("request", "method", r.Method, "path", r.URL.Path, "status", sw.status, "key_id", c.key.ID,
			"tenant", c.tenant, "duration_ms", float64(took.Microseconds())/1000)
		attrs := routeAttrs(routeName, method, sw.status)
		g.metrics.requests.Add(r.Context(), 1, attrs)
		g.metrics.duration.Record(r.Context(), took.Seconds(), attrs)
	}()
	rt, kr, ok := g.route(sw, r)
	if !ok {
		return
	}
	routeName, method = rt.path, rt.method
	c.params = kr.params
	if !g.authorize(sw, r, rt, c) {
		return
	}
	if rt.action != "" {
		defer g.audit(r, rt, c, sw)
	}
	if !g.validate(sw, r, kr) {
		return
	}
	if r.Method == http.MethodPost && r.Header.Get("Idempotency-Key") != "" {
		g.idempotent(sw, r, c, rt)
		return
	}
	rt.handle(sw, r, c)
}

// kinRoute is the document's operation a request matched.
type kinRoute struct {
	route  *routers.Route
	params map[string]string
}

// route finds the operation; an unknown path is 404, a known path with
// another method 405.
func (g *Gateway) route(w http.ResponseWriter, r *http.Request) (route, kinRoute, bool) {
	kr, params, err := g.router.FindRoute(r)
	if err != nil {
		if errors.Is(err, routers.ErrMethodNotAllowed) {
			writeProblem(w, r, http.StatusMethodNotAllowed, probNoMethod, r.Method+" is not served on "+r.URL.Path)
		} else {
			writeProblem(w, r, http.StatusNotFound, probNotFound, "no endpoint "+r.URL.Path+" (see /v1/openapi.json)")
		}
		return route{}, kinRoute{}, false
	}
	rt, ok := g.routes[r.Method+" "+kr.Path]
	if !ok {
		writeProblem(w, r, http.StatusNotFound, probNotFound, r.Method+" "+kr.Path+" is documented but not served by this gateway")
		return route{}, kinRoute{}, false
	}
	return rt, kinRoute{route: kr, params: params}, true
}

// authorize checks the API key against the route's access.
func (g *Gateway) authorize(w http.ResponseWriter, r *http.Request, rt route, c *call) bool {
	if rt.access == public {
		return true
	}
	scheme, token, _ := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	if !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		w.Header().Set("WWW-Authenticate", `Bearer realm="shizu"`)
		writeProblem(w, r, http.StatusUnauthorized, probUnauthorized, "send an API key: Authorization: Bearer shz_...")
		return false
	}
	k, err := g.dir.Authenticate(r.Context(), strings.TrimSpace(token))
	if err != nil {
		if !errors.Is(err, identity.ErrUnauthenticated) {
			c.log.Error("authenticate", "err", err)
			writeProblem(w, r, http.StatusInternalServerError, probInternal, "the key could not be checked; retry later")
			return false
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="shizu", error="invalid_token"`)
		writeProblem(w, r, http.StatusUnauthorized, probUnauthorized, "the API key is not valid (unknown, revoked or mistyped)")
		return false
	}
	c.key, c.tenant = k, k.Tenant
	if k.Scope == identity.Operator {
		c.tenant = identity.OperatorTenant
	}
	switch {
	case rt.access == operatorOnly && k.Scope != identity.Operator:
		writeProblem(w, r, http.StatusForbidden, probForbidden, "this endpoint needs an operator key; this is a tenant key")
		return false
	case rt.access != operatorOnly && k.Scope == identity.Operator:
		writeProblem(w, r, http.StatusForbidden, probForbidden, "this endpoint is for tenant keys; an operator key acts for no tenant")
		return false
	case rt.access == tenantWrite && !k.CanWrite():
		writeProblem(w, r, http.StatusForbidden, probForbidden, "this key is read-only; this call needs a read-write key")
		return false
	}
	if wait, ok := g.limits.allow(k.ID, g.now()); !ok {
		secs := max(1, int((wait+time.Second-1)/time.Second))
		g.metrics.rateLimited.Add(r.Context(), 1)
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		writeProblem(w, r, http.StatusTooManyRequests, probRateLimited,
			"this key's rate limit is spent; retry after "+strconv.Itoa(secs)+" s")
		return false
	}
	return true
}

// validate checks the request against the document: parameters, headers
// and body (a body must be JSON).
func (g *Gateway) validate(w http.ResponseWriter, r *http.Request, kr kinRoute) bool {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	if r.ContentLength != 0 && kr.route.Operation.RequestBody != nil {
		mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if err != nil || mt != "application/json" {
			writeProblem(w, r, http.StatusUnsupportedMediaType, probMediaType,
				"send the body as JSON with Content-Type: application/json", fieldError{Field: "header Content-Type", Reason: "want application/json"})
			return false
		}
	}
	in := &openapi3filter.RequestValidationInput{Request: r, PathParams: kr.params, Route: kr.route,
		Options: &openapi3filter.Options{MultiError: true, AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}
	if err := openapi3filter.ValidateRequest(r.Context(), in); err != nil {
		errs := fieldErrors(err)
		detail := "the request does not match the API's schema"
		if len(errs) > 0 {
			detail = errs[0].Field + ": " + errs[0].Reason
			if len(errs) > 1 {
				detail += " (and " + strconv.Itoa(len(errs)-1) + " more)"
			}
		}
		writeProblem(w, r, http.StatusBadRequest, probInvalid, detail, errs...)
		return false
	}
	return true
}

// statusWriter remembers the status a handler answered with.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Flush lets event streams through.
func (s *statusWriter) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
