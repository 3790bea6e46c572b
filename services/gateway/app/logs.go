package app

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/shizu-gpu/shizu/shared/rentallogs"
)

// defaultTail is how many lines GET /v1/rentals/{id}/logs returns
// without ?tail.
const defaultTail = 100

func logRoutes(g *Gateway) []route {
	return []route{{method: http.MethodGet, path: "/v1/rentals/{rental_id}/logs", access: tenantRead, handle: g.rentalLogs}}
}

// logLine is the API's LogLine.
type logLine struct {
	Seq       uint64    `json:"seq"`
	Attempt   int32     `json:"attempt"`
	Node      string    `json:"node,omitempty"`
	At        time.Time `json:"at,omitzero"`
	Text      string    `json:"text"`
	Truncated bool      `json:"truncated,omitempty"`
	Dropped   int64     `json:"dropped,omitempty"`
	End       bool      `json:"end,omitempty"`
}

func toLine(l rentallogs.Line) logLine {
	return logLine{Seq: l.Seq, Attempt: l.Attempt, Node: l.NodeID, At: l.At, Text: l.Text, Truncated: l.Truncated,
		Dropped: l.Dropped, End: l.End}
}

// logPage is the API's LogPage.
type logPage struct {
	Lines []logLine `json:"lines"`
	// Next is the stream sequence that follows the last line (what a
	// follower continues from).
	Next uint64 `json:"next_seq"`
}

// rentalLogs answers the last lines of the tenant's rental's output and,
// with follow=true, streams what follows as Server-Sent Events. The
// rental is looked up in the read model first under the key's tenant, so
// another tenant's rental is 404 like an unknown one; the logs are then
// read from that tenant's subject only.
func (g *Gateway) rentalLogs(w http.ResponseWriter, r *http.Request, c *call) {
	rr, ok := g.lookup(w, r, c)
	if !ok {
		return
	}
	q := r.URL.Query()
	n := defaultTail
	if s := q.Get("tail"); s != "" {
		n, _ = strconv.Atoi(s) // the document checked it: 1..100000
	}
	follow := q.Get("follow") == "true"
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	lines, next, err := rentallogs.Tail(ctx, g.bus.JetStream(), c.tenant, rr.ID, n)
	cancel()
	if err != nil {
		c.log.Error("rental logs", "err", err, "rental_id", rr.ID)
		writeProblem(w, r, http.StatusInternalServerError, probInternal, "the rental's logs could not be read; retry later")
		return
	}
	if !follow {
		out := logPage{Lines: make([]logLine, 0, len(lines)), Next: next}
		for _, l := range lines {
			out.Lines = append(out.Lines, toLine(l))
		}
		writeJSON(w, http.StatusOK, out)
		return
	}
	g.followLogs(w, r, c, lines, next)
}

// followLogs writes the tail, then every line that follows, each as a
// "log" event; it ends when the client leaves, or at the end of a run's
// output once the rental has ended.
func (g *Gateway) followLogs(w http.ResponseWriter, r *http.Request, c *call, tail []rentallogs.Line, next uint64) {
	flusher, _ := w.(http.Flusher)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	flush := func() {
		if flusher != nil {
			flusher.Flush()
		}
	}
	for _, l := range tail {
		if writeLog(w, l) != nil {
			return
		}
	}
	flush()
	if len(tail) > 0 && tail[len(tail)-1].End && g.rentalEnded(r.Context(), c) {
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	lines := make(chan rentallogs.Line, 64)
	done := make(chan error, 1)
	go func() {
		done <- rentallogs.Follow(ctx, g.bus.JetStream(), c.tenant, c.params["rental_id"], next, func(l rentallogs.Line) error {
			select {
			case lines <- l:
				return nil
			case <-ctx.Done():
				return rentallogs.ErrStop
			}
		})
	}()
	tick := time.NewTicker(keepAlive)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case err := <-done:
			if err != nil {
				c.log.Error("follow rental logs", "err", err)
			}
			return
		case <-tick.C:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return
			}
			flush()
		case l := <-lines:
			if writeLog(w, l) != nil {
				return
			}
			flush()
			if l.End && g.rentalEnded(r.Context(), c) {
				return
			}
		}
	}
}

// rentalEnded says whether the read model has the call's rental ended.
func (g *Gateway) rentalEnded(ctx context.Context, c *call) bool {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	rr, err := g.views.Get(ctx, c.tenant, c.params["rental_id"])
	return err == nil && ended(rr)
}

// writeLog writes one "log" event: the line (schema LogLine) as JSON,
// with its stream sequence as the event id.
func writeLog(w http.ResponseWriter, l rentallogs.Line) error {
	b, err := json.Marshal(toLine(l))
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "event: log\nid: %d\ndata: %s\n\n", l.Seq, b)
	return err
}
