package app

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// pendingTakeover is how long a request may hold its Idempotency-Key
// unanswered before a retry takes it over (the replica answering it died).
const pendingTakeover = 30 * time.Second

// idemRecord is a POST's first answer, kept under its tenant and
// Idempotency-Key in the IDEMPOTENCY bucket (which drops it after a day).
type idemRecord struct {
	Fingerprint string    `json:"fingerprint"`
	Done        bool      `json:"done"`
	At          time.Time `json:"at"`
	Status      int       `json:"status,omitempty"`
	ContentType string    `json:"content_type,omitempty"`
	Body        []byte    `json:"body,omitempty"`
}

// idempotent answers a POST carrying an Idempotency-Key: the stored
// answer when the key was used with the same request, 422 when it was
// used with another, 409 while the first is still being answered, else
// the handler's answer, stored (unless it is a failure worth retrying).
func (g *Gateway) idempotent(w http.ResponseWriter, r *http.Request, c *call, rt route) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		writeProblem(w, r, http.StatusBadRequest, probInvalid, "the body could not be read", fieldError{Field: "body", Reason: err.Error()})
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	sum := sha256.Sum256([]byte(r.Header.Get("Idempotency-Key")))
	k := c.tenant + "." + hex.EncodeToString(sum[:])
	fsum := sha256.Sum256(append([]byte(r.Method+" "+r.URL.Path+"\n"), body...))
	fp := hex.EncodeToString(fsum[:])
	rev, ok := g.claim(w, r, c, k, fp)
	if !ok {
		return
	}
	rec := &recorder{header: http.Header{}}
	rt.handle(rec, r, c)
	for h, v := range rec.header {
		w.Header()[h] = v
	}
	w.WriteHeader(rec.status)
	_, _ = w.Write(rec.body.Bytes())
	// The answer is kept even if the client left meanwhile: that client's
	// retry is what it is for.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), requestTimeout)
	defer cancel()
	if rec.status >= 500 || rec.status == http.StatusTooManyRequests {
		if err := g.idem.Delete(ctx, k, jetstream.LastRevision(rev)); err != nil {
			c.log.Warn("idempotency: release the key", "err", err)
		}
		return
	}
	done, _ := json.Marshal(idemRecord{Fingerprint: fp, Done: true, At: g.now().UTC(), Status: rec.status,
		ContentType: rec.header.Get("Content-Type"), Body: rec.body.Bytes()})
	if _, err := g.idem.Update(ctx, k, done, rev); err != nil {
		c.log.Error("idempotency: the first answer was not stored", "err", err)
	}
}

// claim takes the key for this request (its revision, true), or answers
// from what the key holds already (false).
func (g *Gateway) claim(w http.ResponseWriter, r *http.Request, c *call, k, fp string) (uint64, bool) {
	ctx := r.Context()
	pending, _ := json.Marshal(idemRecord{Fingerprint: fp, At: g.now().UTC()})
	for range 3 {
		rev, err := g.idem.Create(ctx, k, pending)
		if err == nil {
			return rev, true
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			c.log.Error("idempotency: claim", "err", err)
			writeProblem(w, r, http.StatusInternalServerError, probInternal, "the Idempotency-Key could not be checked; retry later")
			return 0, false
		}
		e, err := g.idem.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			continue // released meanwhile: claim again
		}
		var prev idemRecord
		if err == nil {
			err = json.Unmarshal(e.Value(), &prev)
		}
		if err != nil {
			c.log.Error("idempotency: read", "err", err)
			writeProblem(w, r, http.StatusInternalServerError, probInternal, "the Idempotency-Key could not be checked; retry later")
			return 0, false
		}
		switch {
		case prev.Fingerprint != fp:
			writeProblem(w, r, http.StatusUnprocessableEntity, probReused,
				"this Idempotency-Key was used with another request (method, path or body); use a new key for a new request",
				fieldError{Field: "header Idempotency-Key", Reason: "used before with another request"})
			return 0, false
		case prev.Done:
			w.Header().Set("Content-Type", prev.ContentType)
			w.Header().Set("Content-Length", strconv.Itoa(len(prev.Body)))
			g.metrics.replayed.Add(ctx, 1)
			w.Header().Set("Idempotency-Replayed", "true")
			w.WriteHeader(prev.Status)
			_, _ = w.Write(prev.Body)
			return 0, false
		case g.now().Sub(prev.At) > pendingTakeover:
			if rev, err := g.idem.Update(ctx, k, pending, e.Revision()); err == nil {
				return rev, true
			}
		default:
			writeProblem(w, r, http.StatusConflict, probInProgress, "the first request with this Idempotency-Key is still being answered; retry shortly",
				fieldError{Field: "header Idempotency-Key", Reason: "in use by a request not answered yet"})
			return 0, false
		}
	}
	writeProblem(w, r, http.StatusConflict, probInProgress, "the Idempotency-Key is contended; retry shortly",
		fieldError{Field: "header Idempotency-Key", Reason: "contended"})
	return 0, false
}

// recorder keeps a handler's answer so it can be stored and replayed.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}
func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(b)
}
