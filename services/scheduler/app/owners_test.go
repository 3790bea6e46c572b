package app_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// publishRaw stores data on subj as the admin, with event id id.
func (e *env) publishRaw(t *testing.T, subj, id string, data []byte) {
	t.Helper()
	m := nats.NewMsg(subj)
	m.Data = data
	m.Header.Set(jetstream.MsgIDHeader, id)
	if _, err := e.Admin.JetStream().PublishMsg(t.Context(), m); err != nil {
		t.Fatal(err)
	}
}

// publishAs stores ev on subj as the admin (subj need not be the one the
// event's tenant would give it).
func (e *env) publishAs(t *testing.T, subj string, ev proto.Message) {
	t.Helper()
	b := e.Admin.NewBatch()
	if err := b.Publish(t.Context(), subj, ev); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// schedulerDeadLetter waits for the scheduler's dead letter of the
// message with event id msgID and returns its reason.
func (e *env) schedulerDeadLetter(t *testing.T, msgID string) string {
	t.Helper()
	var reason string
	testkit.Eventually(t, 30*time.Second, func() error {
		stream, err := e.Admin.JetStream().Stream(t.Context(), topology.StreamDeadLetter)
		if err != nil {
			return err
		}
		info, err := stream.Info(t.Context())
		if err != nil {
			return err
		}
		for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
			m, err := stream.GetMsg(t.Context(), seq)
			if err == nil && m.Subject == "dlq.RENTALS.scheduler" && m.Header.Get(bus.HeaderDLQOriginal+jetstream.MsgIDHeader) == msgID {
				reason = m.Header.Get(bus.HeaderDLQReason)
				return nil
			}
		}
		return fmt.Errorf("no dead letter of %s yet", msgID)
	})
	return reason
}

// noOutcomes fails when rental got any outcome or start command.
func noOutcomes(o *outcomes, rental string) error {
	if n := len(o.scheduled[rental]) + len(o.pending[rental]) + o.starts[rental]; n != 0 {
		return fmt.Errorf("%s got %d outcomes or starts", rental, n)
	}
	return nil
}

// A RentalRequested on rental.dev.requested whose body names tenant
// "victim" is dead-lettered with a reason naming both tenants and never
// placed: no outcome, no start, no capacity taken (the honest request
// after it gets the node's only GPU); its sender, dev, is told why.
func TestARequestWhoseBodyNamesAnotherTenantIsDeadLetteredAndNeverPlaced(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register(gpuNode("n1", 1, capacity.MarketOnDemand))
	e.replica(testConfig(), time.Now)
	e.publishAs(t, "rental.dev.requested", requested("forged", "victim", spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), time.Now()))
	e.publish(requested("honest", "dev", spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), time.Now()))
	reason := e.schedulerDeadLetter(t, "req:forged")
	if !strings.Contains(reason, `"dev"`) || !strings.Contains(reason, `"victim"`) {
		t.Fatalf("dead letter reason %q does not name both tenants", reason)
	}
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) (err error) { _, err = scheduledOf(o, "honest"); return })
	rej := e.rejectedWith(t, "forged")
	if rej.GetTenantId() != "dev" || rej.GetReason() != shizuv1.RejectReason_REJECT_REASON_NOT_PERMITTED ||
		!strings.Contains(rej.GetMessage(), "names tenant victim, but was sent as tenant dev") {
		t.Fatalf("the forged request's sender was told %v", rej)
	}
	e.seen.waitFor(t, time.Second, func(o *outcomes) error {
		if len(o.rejected["forged"]) != 1 {
			return fmt.Errorf("forged request answered %d times", len(o.rejected["forged"]))
		}
		return noOutcomes(o, "forged")
	})
	if _, err := e.store.Allocation(t.Context(), "forged"); !capacity.IsNotFound(err) {
		t.Fatalf("the forged request holds capacity: %v", err)
	}
}

// A rental id is its first tenant's: another tenant's request under it is
// rejected on the requester's own subject (REJECT_REASON_NOT_PERMITTED, in
// words) and gets nothing of the owner's placement; its cancel is rejected
// the same way and stops nothing; a stop it reports is dead-lettered and
// releases nothing.
func TestAnotherTenantCannotTakeRequestCancelOrStopARentalId(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register(gpuNode("n1", 2, capacity.MarketOnDemand))
	e.replica(testConfig(), time.Now)
	e.publish(requested("shared", "alice", spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), time.Now()))
	var owned *shizuv1.RentalScheduled
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) (err error) { owned, err = scheduledOf(o, "shared"); return })

	theirs := requested("shared", "dev", spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), time.Now())
	theirs.Meta.EventId = "req:dev:shared"
	e.publish(theirs)
	rej := e.rejectedWith(t, "shared")
	if rej.GetTenantId() != "dev" || rej.GetReason() != shizuv1.RejectReason_REJECT_REASON_NOT_PERMITTED ||
		!strings.Contains(rej.GetMessage(), "already used by another tenant") || strings.Contains(rej.GetMessage(), "alice") {
		t.Fatalf("rejection %v", rej)
	}

	e.publish(cancel("shared", "dev"))
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) error {
		if len(o.rejected["shared"]) < 2 {
			return errors.New("cancel not answered yet")
		}
		r := o.rejected["shared"][1]
		if r.GetTenantId() != "dev" || r.GetReason() != shizuv1.RejectReason_REJECT_REASON_NOT_PERMITTED || !strings.Contains(r.GetMessage(), "has no rental shared") {
			return fmt.Errorf("cancel answered with %v", r)
		}
		return nil
	})

	forgedStop := stopped(owned, shizuv1.ExitReason_EXIT_REASON_COMPLETED)
	forgedStop.TenantId, forgedStop.Meta.EventId = "dev", "stop:dev:shared"
	e.publish(forgedStop)
	if reason := e.schedulerDeadLetter(t, "stop:dev:shared"); !strings.Contains(reason, `belongs to tenant "alice"`) {
		t.Fatalf("dead letter reason %q", reason)
	}

	e.seen.waitFor(t, time.Second, func(o *outcomes) error {
		if len(o.scheduled["shared"]) != 1 || o.starts["shared"] != 1 || o.stops["shared"] != 0 {
			return fmt.Errorf("scheduled %d, starts %d, stops %d; want alice's one placement only",
				len(o.scheduled["shared"]), o.starts["shared"], o.stops["shared"])
		}
		if len(o.rejected["shared"]) != 2 || len(o.pending["shared"]) != 0 {
			return fmt.Errorf("rejected %v, pending %v", o.rejected["shared"], o.pending["shared"])
		}
		return nil
	})
	if a, err := e.store.Allocation(t.Context(), "shared"); err != nil || a.Tenant != "alice" {
		t.Fatalf("alice's allocation: %+v, %v", a, err)
	}
}

// Owners outlive the loss of Redis: rebuilt from the rentals stream, the
// id alice used is still hers, and dev's request under it is rejected.
func TestRentalOwnersAreRebuiltAfterRedisWasLost(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	node := gpuNode("n1", 2, capacity.MarketOnDemand)
	e.register(node)
	cfg := testConfig()
	cfg.RecordsCheck = time.Hour // only the delivery's own check can see the loss
	e.replica(cfg, time.Now)
	e.publish(requested("kept", "alice", spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), time.Now()))
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) (err error) { _, err = scheduledOf(o, "kept"); return })

	e.Redis.Restart(t)
	e.restoreAsItsAgent(t, node, "kept")
	theirs := requested("kept", "dev", spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), time.Now())
	theirs.Meta.EventId = "req:dev:kept"
	e.publish(theirs)
	rej := e.rejectedWith(t, "kept")
	if rej.GetTenantId() != "dev" || rej.GetReason() != shizuv1.RejectReason_REJECT_REASON_NOT_PERMITTED {
		t.Fatalf("rejection %v", rej)
	}
	e.seen.waitFor(t, time.Second, func(o *outcomes) error {
		if len(o.scheduled["kept"]) != 1 {
			return fmt.Errorf("kept scheduled %d times", len(o.scheduled["kept"]))
		}
		return nil
	})
}
