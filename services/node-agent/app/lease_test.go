package app

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/node-agent/app/agenttest"
	"github.com/shizu-gpu/shizu/shared/capacity"
)

var errCapacityUnavailable = fmt.Errorf("capacity: %w: redis down", capacity.ErrUnavailable)

// held decodes the events held on subject of b.
func held[E proto.Message](t *testing.T, b *agenttest.Bus, subject string, newE func() E) []E {
	t.Helper()
	var out []E
	for _, data := range b.Held(subject) {
		ev := newE()
		if err := proto.Unmarshal(data, ev); err != nil {
			t.Fatal(err)
		}
		out = append(out, ev)
	}
	return out
}

func registeredEvents(t *testing.T, b *agenttest.Bus) []*shizuv1.NodeRegistered {
	return held(t, b, "node.n1.registered", func() *shizuv1.NodeRegistered { return &shizuv1.NodeRegistered{} })
}

func drainedEvents(t *testing.T, b *agenttest.Bus) []*shizuv1.NodeDrained {
	return held(t, b, "node.n1.drained", func() *shizuv1.NodeDrained { return &shizuv1.NodeDrained{} })
}

func TestANodeFencedUnderItsAgentRegistersAgainAtTheNewEpoch(t *testing.T) {
	t.Parallel()
	a, b, _, c := withFakes(t)
	if err := a.register(t.Context()); err != nil {
		t.Fatal(err)
	}
	a.lease(t.Context())
	if a.epochNow() != 1 || len(registeredEvents(t, b)) != 1 {
		t.Fatalf("a lease at the current epoch registered again: epoch %d, %d registrations", a.epochNow(), len(registeredEvents(t, b)))
	}
	if err := c.Fence("n1", 1); err != nil {
		t.Fatal(err)
	}
	a.lease(t.Context())
	regs := registeredEvents(t, b)
	if a.epochNow() != 2 || len(regs) != 2 || regs[1].GetEpoch() != 2 || regs[1].GetMeta().GetEventId() != "node:n1:registered:2" {
		t.Fatalf("after the fence: epoch %d, registrations %v", a.epochNow(), regs)
	}
	if err := regs[1].Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestAStoreThatCannotBeReadLeavesTheRegistrationAlone(t *testing.T) {
	t.Parallel()
	a, b, _, c := withFakes(t)
	if err := a.register(t.Context()); err != nil {
		t.Fatal(err)
	}
	c.Refuse(func(method string) error {
		if method == "Node" {
			return errCapacityUnavailable
		}
		return nil
	})
	a.lease(t.Context())
	if a.epochNow() != 1 || len(registeredEvents(t, b)) != 1 {
		t.Fatalf("an unreachable store made the agent register again: epoch %d", a.epochNow())
	}
}

func TestADrainingNodeAnnouncesItIsDrainedOnceItHoldsNothing(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		holding bool
		want    int
	}{
		{"an empty draining node announces it once", false, 1},
		{"a draining node whose store still holds an allocation does not", true, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a, b, _, c := withFakes(t)
			if err := a.register(t.Context()); err != nil {
				t.Fatal(err)
			}
			if tc.holding {
				if err := c.Reserve("r-left", "n1", 1); err != nil {
					t.Fatal(err)
				}
			}
			if err := a.beginDrain(t.Context(), "scale-in of pool web"); err != nil {
				t.Fatal(err)
			}
			a.lease(t.Context())
			a.lease(t.Context())
			got := drainedEvents(t, b)
			if len(got) != tc.want {
				t.Fatalf("%d NodeDrained, want %d", len(got), tc.want)
			}
			if tc.want == 1 && (got[0].GetReason() != "scale-in of pool web" || got[0].GetEpoch() != 1) {
				t.Fatalf("drained = %v", got[0])
			}
		})
	}
}
