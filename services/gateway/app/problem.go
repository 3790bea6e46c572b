package app

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// fieldError names one field of a request and what is wrong with it.
type fieldError struct {
	Field  string `json:"field"`
	Reason string `json:"reason"`
}

// problem is an RFC 9457 problem document.
type problem struct {
	Type      string       `json:"type"`
	Title     string       `json:"title"`
	Status    int          `json:"status"`
	Detail    string       `json:"detail,omitempty"`
	Instance  string       `json:"instance,omitempty"`
	RequestID string       `json:"request_id"`
	Errors    []fieldError `json:"errors,omitempty"`
}

// The kinds of problem, each a URN and a title.
var (
	probInvalid      = kind{"invalid-request", "The request is not valid"}
	probUnauthorized = kind{"unauthorized", "An API key is needed"}
	probForbidden    = kind{"forbidden", "The API key may not do this"}
	probNotFound     = kind{"not-found", "Not found"}
	probNoMethod     = kind{"method-not-allowed", "Method not allowed"}
	probInProgress   = kind{"idempotency-in-progress", "A request with this Idempotency-Key is still being answered"}
	probReused       = kind{"idempotency-key-reused", "The Idempotency-Key was used with another request"}
	probMediaType    = kind{"unsupported-media-type", "The body must be application/json"}
	probRateLimited  = kind{"rate-limited", "Too many requests"}
	probInternal     = kind{"internal", "The gateway could not answer"}
)

type kind struct{ slug, title string }

// writeProblem answers with a problem of kind k.
func writeProblem(w http.ResponseWriter, r *http.Request, status int, k kind, detail string, errs ...fieldError) {
	p := problem{Type: "urn:shizu:problem:" + k.slug, Title: k.title, Status: status, Detail: detail,
		Instance: r.URL.Path, RequestID: requestID(r.Context()), Errors: errs}
	b, _ := json.Marshal(p) // plain strings and ints: never fails
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// writeJSON answers with v as JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "encode the answer", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
