package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/shizu-gpu/shizu/services/gateway/api"
	"github.com/shizu-gpu/shizu/services/gateway/app"
	"github.com/shizu-gpu/shizu/services/gateway/identity"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// decoders registers, once, a decoder for event streams: response
// validation reads them as text.
var decoders sync.Once

// harness is a platform (NATS with the topology's users, provisioned) and
// n gateway replicas, each on its own connection as the gateway user and
// behind its own HTTP server. Every answer it reads is validated against
// the OpenAPI document.
type harness struct {
	t      testing.TB
	d      *testkit.Deployment
	admin  *bus.Conn
	doc    *openapi3.T
	router routers.Router
	gws    []*app.Gateway
	urls   []string
	logs   *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testOptions are the defaults with a rate limit no test but the rate
// limit's reaches.
func testOptions() app.Options {
	o := app.DefaultOptions()
	o.RatePerSecond, o.RateBurst = 1e6, 1e6
	return o
}

func newHarness(t testing.TB, replicas int, opts app.Options) *harness {
	t.Helper()
	return newHarnessOn(t, replicas, opts)
}

// newHarnessOn is newHarness on a platform started with popts.
func newHarnessOn(t testing.TB, replicas int, opts app.Options, popts ...testkit.PlatformOption) *harness {
	t.Helper()
	decoders.Do(func() { openapi3filter.RegisterBodyDecoder("text/event-stream", openapi3filter.PlainBodyDecoder) })
	d := testkit.Platform(t, popts...)
	doc, err := api.Load(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, d: d, admin: d.Admin, doc: doc, router: router, logs: &syncBuffer{}}
	log := slog.New(slog.NewJSONHandler(h.logs, nil))
	for range replicas {
		conn := d.Connect(t, topology.Gateway)
		ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
		t.Cleanup(cancel)
		g, err := app.Open(ctx, conn, opts, log, nil)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(g)
		t.Cleanup(srv.Close)
		h.gws = append(h.gws, g)
		h.urls = append(h.urls, srv.URL)
	}
	return h
}

// tenant records a tenant and returns a key of it with scope.
func (h *harness) tenant(id string, scope identity.Scope) string {
	h.t.Helper()
	dir := h.gws[0].Identity()
	if _, err := dir.GetTenant(h.t.Context(), id); err != nil {
		if _, err := dir.CreateTenant(h.t.Context(), id, ""); err != nil {
			h.t.Fatal(err)
		}
	}
	return h.key(id, scope)
}

func (h *harness) key(tenant string, scope identity.Scope) string {
	h.t.Helper()
	_, secret, err := h.gws[0].Identity().CreateKey(h.t.Context(), tenant, scope, "test")
	if err != nil {
		h.t.Fatal(err)
	}
	for _, g := range h.gws[1:] {
		testkit.Eventually(h.t, 5*time.Second, func() error {
			_, err := g.Identity().Authenticate(h.t.Context(), secret)
			return err
		})
	}
	return secret
}

// answer is one response, read whole.
type answer struct {
	Status int
	Header http.Header
	Body   []byte
}

func (a answer) json(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(a.Body, v); err != nil {
		t.Fatalf("decode %s: %v", a.Body, err)
	}
}

// problem decodes a problem answer.
func (a answer) problem(t testing.TB) problemDoc {
	t.Helper()
	if ct := a.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("content type %q, want application/problem+json: %s", ct, a.Body)
	}
	var p problemDoc
	a.json(t, &p)
	return p
}

type problemDoc struct {
	Type, Title, Detail, Instance string
	Status                        int
	RequestID                     string `json:"request_id"`
	Errors                        []struct{ Field, Reason string }
}

func (p problemDoc) names(field string) bool {
	for _, e := range p.Errors {
		if e.Field == field {
			return true
		}
	}
	return false
}

// req is one call to replica 0 (see on).
type req struct {
	method, path, key string
	body              any
	header            map[string]string
	replica           int
}

// do sends r and validates the answer against the document.
func (h *harness) do(r req) answer {
	h.t.Helper()
	var body io.Reader
	switch b := r.body.(type) {
	case nil:
	case string:
		body = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			h.t.Fatal(err)
		}
		body = bytes.NewReader(j)
	}
	hr, err := http.NewRequestWithContext(h.t.Context(), r.method, h.urls[r.replica]+r.path, body)
	if err != nil {
		h.t.Fatal(err)
	}
	if body != nil {
		hr.Header.Set("Content-Type", "application/json")
	}
	if r.key != "" {
		hr.Header.Set("Authorization", "Bearer "+r.key)
	}
	for k, v := range r.header {
		hr.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	a := answer{Status: resp.StatusCode, Header: resp.Header, Body: b}
	if err := h.validate(r.method, r.path, a); err != nil {
		h.t.Fatalf("%s %s answered %d, which the OpenAPI document does not allow: %v\n%s", r.method, r.path, a.Status, err, b)
	}
	if a.Header.Get("X-Request-Id") == "" {
		h.t.Fatalf("%s %s: no X-Request-Id", r.method, r.path)
	}
	return a
}

// validate checks an answer against the document's operation for
// method and path (kin-openapi's ValidateResponse, status included).
func (h *harness) validate(method, path string, a answer) error {
	hr := httptest.NewRequest(method, path, nil)
	route, params, err := h.router.FindRoute(hr)
	if err != nil {
		return err
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: hr, PathParams: params, Route: route},
		Status:                 a.Status, Header: a.Header, Body: io.NopCloser(bytes.NewReader(a.Body)),
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	if err := openapi3filter.ValidateResponse(h.t.Context(), in); err != nil {
		return err
	}
	// kin-openapi lets an empty body through; every answer of this API has one.
	if resp := route.Operation.Responses.Status(a.Status); resp != nil && resp.Value != nil && len(resp.Value.Content) > 0 && len(a.Body) == 0 {
		return errors.New("an empty body where the document declares content")
	}
	return nil
}

// validRental checks one JSON document against the Rental schema.
func (h *harness) validRental(data []byte) error {
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	return h.doc.Components.Schemas["Rental"].Value.VisitJSON(v)
}

// count is how many messages the stream holds on subj.
func (h *harness) count(stream, subj string) int {
	h.t.Helper()
	s, err := h.admin.JetStream().Stream(h.t.Context(), stream)
	if err != nil {
		h.t.Fatal(err)
	}
	info, err := s.Info(h.t.Context(), jetstream.WithSubjectFilter(subj))
	if err != nil {
		h.t.Fatal(err)
	}
	return int(info.State.Subjects[subj])
}

// last decodes the last message of the stream on subj into ev.
func (h *harness) last(stream, subj string, ev proto.Message) *jetstream.RawStreamMsg {
	h.t.Helper()
	s, err := h.admin.JetStream().Stream(h.t.Context(), stream)
	if err != nil {
		h.t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(h.t.Context(), subj)
	if err != nil {
		h.t.Fatalf("last message on %s: %v", subj, err)
	}
	if ev != nil {
		if err := proto.Unmarshal(m.Data, ev); err != nil {
			h.t.Fatal(err)
		}
	}
	return m
}

// publish sends ev as the admin (as the platform's services would).
func (h *harness) publish(form, tenant string, ev proto.Message) {
	h.t.Helper()
	subj, err := subject.Format(form, tenant)
	if err != nil {
		h.t.Fatal(err)
	}
	if _, err := h.admin.Publish(h.t.Context(), subj, ev); err != nil {
		h.t.Fatal(err)
	}
}

// create rents one GPU for key and returns the rental id.
func (h *harness) create(key string) string {
	h.t.Helper()
	a := h.do(req{method: "POST", path: "/v1/rentals", key: key, body: map[string]any{"gpu_count": 1}})
	if a.Status != http.StatusCreated {
		h.t.Fatalf("create: %d %s", a.Status, a.Body)
	}
	var r struct {
		ID string `json:"rental_id"`
	}
	a.json(h.t, &r)
	return r.ID
}

// projected waits until the read model has the rental (replica 0).
func (h *harness) projected(key, id string) {
	h.t.Helper()
	testkit.Eventually(h.t, 5*time.Second, func() error {
		a := h.do(req{method: "GET", path: "/v1/rentals/" + id, key: key})
		if a.Status != http.StatusOK {
			return errStatus(a)
		}
		return nil
	})
}

type statusErr struct{ a answer }

func (e statusErr) Error() string { return http.StatusText(e.a.Status) + ": " + string(e.a.Body) }

func errStatus(a answer) error { return statusErr{a} }
