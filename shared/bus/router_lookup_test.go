package bus_test

import (
	"context"
	"strings"
	"testing"

	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/fault"
)

// Lookup finds a delivery's handler by the event its subject carries,
// which a header must agree with, falls back to the event registered for
// a subject outside the contract, and gives every delivery it cannot use
// a handler that dead-letters it with the reason.
func TestRouterLookupNamesEventAndHandler(t *testing.T) {
	t.Parallel()
	r := bus.NewRouter()
	var called string
	r.Handle("shizu.v1.RentalRequested", func(context.Context, bus.Delivery) error { called = "requested"; return nil })
	r.Handle("shizu.v1.B", func(context.Context, bus.Delivery) error { called = "B"; return nil })
	r.EventForSubject("b.*.x", "shizu.v1.B")
	for _, tc := range []struct {
		name, event, subject, wantEvent, wantCall, wantReason string
	}{
		{"the header names the subject's event", "shizu.v1.RentalRequested", "rental.t1.requested", "shizu.v1.RentalRequested", "requested", ""},
		{"without a header the subject names it", "", "rental.t1.requested", "shizu.v1.RentalRequested", "requested", ""},
		{"a registered subject outside the contract names it", "", "b.t1.x", "shizu.v1.B", "B", ""},
		{"a header the subject contradicts is unusable", "shizu.v1.B", "rental.t1.requested", "", "", "which carries shizu.v1.RentalRequested"},
		{"an unknown type on a declared subject is unusable", "shizu.v9.New", "rental.t1.requested", "", "", "which carries"},
		{"a subject's event without a handler", "", "rental.t1.stopped", "shizu.v1.RentalStopped", "", "no handler for event shizu.v1.RentalStopped"},
		{"an unknown type on an unknown subject has no handler", "shizu.v1.C", "c", "shizu.v1.C", "", "no handler"},
		{"an unknown subject without a header has no type", "", "c", "", "", "no event type"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			called = ""
			event, h := r.Lookup(bus.Delivery{Event: tc.event, Subject: tc.subject})
			if event != tc.wantEvent {
				t.Fatalf("event = %q, want %q", event, tc.wantEvent)
			}
			if h == nil {
				t.Fatal("no handler: every delivery gets one")
			}
			err := h(t.Context(), bus.Delivery{})
			if called != tc.wantCall {
				t.Fatalf("called %q, want %q", called, tc.wantCall)
			}
			if tc.wantReason == "" && err != nil || tc.wantReason != "" && (!fault.IsInvalid(err) || !strings.Contains(err.Error(), tc.wantReason)) {
				t.Fatalf("outcome %v, want a dead letter saying %q", err, tc.wantReason)
			}
		})
	}
}
