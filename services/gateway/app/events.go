package app

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/shizu-gpu/shizu/shared/rentalview"
)

const (
	// appearWait is how long the event stream of a rental the read model
	// does not hold yet waits for it (one just created) before it is 404.
	appearWait = 3 * time.Second
	// keepAlive is how often an idle event stream sends a comment, so
	// proxies keep it open.
	keepAlive = 15 * time.Second
)

// followRental streams the tenant's rental as Server-Sent Events: as it
// is, then after each change, until it ends or the client leaves. The
// watch is on the tenant's own key of the read model, so another
// tenant's rental never appears: it is 404 like an unknown one.
func (g *Gateway) followRental(w http.ResponseWriter, r *http.Request, c *call) {
	id := c.params["rental_id"]
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel() // stops the watch: no consumer is left behind
	updates, err := g.views.Watch(ctx, c.tenant, id)
	if err != nil {
		writeProblem(w, r, http.StatusNotFound, probNotFound, "no rental "+id+" (list yours with GET /v1/rentals)")
		return
	}
	first, ok := waitFirst(ctx, updates)
	if !ok {
		writeProblem(w, r, http.StatusNotFound, probNotFound, "no rental "+id+" (list yours with GET /v1/rentals)")
		return
	}
	flusher, _ := w.(http.Flusher)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	tick := time.NewTicker(keepAlive)
	defer tick.Stop()
	for rr := first; ; {
		if err := writeEvent(w, rr); err != nil {
			return
		}
		if flusher != nil {
			flusher.Flush()
		}
		if ended(rr) {
			return
		}
		for next := (*rentalview.Rental)(nil); next == nil; {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
					return
				}
				if flusher != nil {
					flusher.Flush()
				}
			case n, ok := <-updates:
				if !ok {
					return
				}
				next = n
			}
			rr = next
		}
	}
}

func waitFirst(ctx context.Context, updates <-chan *rentalview.Rental) (*rentalview.Rental, bool) {
	t := time.NewTimer(appearWait)
	defer t.Stop()
	select {
	case rr, ok := <-updates:
		return rr, ok
	case <-t.C:
		return nil, false
	case <-ctx.Done():
		return nil, false
	}
}

// writeEvent writes one "rental" event: the whole rental as JSON, with
// its read-model sequence as the event id.
func writeEvent(w http.ResponseWriter, rr *rentalview.Rental) error {
	b, err := json.Marshal(toBody(rr))
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "event: rental\nid: %d\ndata: %s\n\n", rr.Seq, b)
	return err
}
