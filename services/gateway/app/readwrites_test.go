package app_test

import (
	"net/http"
	"testing"

	"github.com/shizu-gpu/shizu/services/gateway/identity"
)

// A rental just created is there for its creator's next call on any
// replica, before any projector has folded its request: the gateway
// seeds the read model with what it published. Here no replica runs the
// projector at all, so only the seed can answer.
func TestACreatedRentalIsReadableAtOnceOnEveryReplica(t *testing.T) {
	t.Parallel()
	opts := testOptions()
	opts.Projector = false
	h := newHarness(t, 2, opts)
	key := h.tenant("acme", identity.ReadWrite)
	id := h.create(key)
	for replica := range 2 {
		a := h.do(req{method: "GET", path: "/v1/rentals/" + id, key: key, replica: replica})
		if a.Status != http.StatusOK {
			t.Fatalf("GET on replica %d right after the POST: %d %s", replica, a.Status, a.Body)
		}
		var r struct {
			State string `json:"state"`
		}
		a.json(t, &r)
		if r.State != "requested" {
			t.Fatalf("replica %d: state %q, want requested", replica, r.State)
		}
	}
	other := h.tenant("globex", identity.ReadWrite)
	if a := h.do(req{method: "GET", path: "/v1/rentals/" + id, key: other}); a.Status != http.StatusNotFound {
		t.Fatalf("another tenant's GET of a seeded rental: %d, want 404", a.Status)
	}
}
