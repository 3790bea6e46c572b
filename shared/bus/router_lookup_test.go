package bus_test

import (
	"context"
	"testing"

	"github.com/shizu-gpu/shizu/shared/bus"
)

// Lookup finds a delivery's handler by its event header, falls back to
// the event registered for its subject, and reports no handler for an
// event nobody handles.
func TestRouterLookupNamesEventAndHandler(t *testing.T) {
	t.Parallel()
	r := bus.NewRouter()
	var called string
	r.Handle("shizu.v1.A", func(context.Context, bus.Delivery) error { called = "A"; return nil })
	r.Handle("shizu.v1.B", func(context.Context, bus.Delivery) error { called = "B"; return nil })
	r.EventForSubject("b.*.x", "shizu.v1.B")
	for _, tc := range []struct {
		name, event, subject, wantEvent, wantCall string
	}{
		{"the header names the event", "shizu.v1.A", "b.t1.x", "shizu.v1.A", "A"},
		{"without a header the subject names it", "", "b.t1.x", "shizu.v1.B", "B"},
		{"an unknown event has no handler", "shizu.v1.C", "c", "shizu.v1.C", ""},
		{"an unknown subject without a header has none", "", "c", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			called = ""
			event, h := r.Lookup(bus.Delivery{Event: tc.event, Subject: tc.subject})
			if event != tc.wantEvent {
				t.Fatalf("event = %q, want %q", event, tc.wantEvent)
			}
			if (h == nil) != (tc.wantCall == "") {
				t.Fatalf("handler = %v, want one calling %q", h != nil, tc.wantCall)
			}
			if h != nil {
				_ = h(t.Context(), bus.Delivery{})
				if called != tc.wantCall {
					t.Fatalf("called %q, want %q", called, tc.wantCall)
				}
			}
		})
	}
}
