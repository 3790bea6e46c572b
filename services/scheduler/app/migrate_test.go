package app_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// migrating is what failover publishes after fencing the node of s.
func migrating(s *shizuv1.RentalScheduled, sp *shizuv1.RentalSpec) *shizuv1.RentalMigrating {
	return &shizuv1.RentalMigrating{
		Meta:     &shizuv1.EventMeta{EventId: fmt.Sprintf("rental:%s:migrating:%d", s.GetRentalId(), s.GetAttempt()+1), OccurredAt: timestamppb.Now(), Source: "failover"},
		RentalId: s.GetRentalId(), TenantId: s.GetTenantId(), FromNodeId: s.GetNodeId(), FromNodeEpoch: s.GetNodeEpoch(),
		Reason: shizuv1.MigrationReason_MIGRATION_REASON_NODE_LOST, LastHeartbeatAt: timestamppb.New(time.Now().Add(-3 * time.Second)),
		Spec: sp, FromAttempt: s.GetAttempt(), NextAttempt: s.GetAttempt() + 1,
	}
}

func TestAMigratingRentalIsPlacedAgainElsewhereAsItsNextAttempt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register(gpuNode("n1", 1, capacity.MarketOnDemand))
	e.replica(testConfig(), time.Now)
	sp := spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND)
	e.publish(requested("m1", "acme", sp, time.Now()))
	var first *shizuv1.RentalScheduled
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) (err error) { first, err = scheduledOf(o, "m1"); return })

	// n1 is lost: failover fences it and hands the rental over; n2 joins.
	if _, err := e.store.Fence(t.Context(), "n1", uint64(first.GetNodeEpoch())); err != nil {
		t.Fatal(err)
	}
	e.register(gpuNode("n2", 1, capacity.MarketOnDemand))
	e.publish(migrating(first, sp))
	var second *shizuv1.RentalScheduled
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) error {
		if len(o.scheduled["m1"]) < 2 {
			return errors.New("not placed again")
		}
		second = o.scheduled["m1"][1]
		if o.starts["m1"] < 2 {
			return errors.New("no second start command")
		}
		return nil
	})
	if second.GetNodeId() != "n2" || second.GetAttempt() != 2 || second.GetMeta().GetEventId() != "rental:m1:scheduled:2" {
		t.Fatalf("second placement %s attempt %d id %s; want n2, attempt 2", second.GetNodeId(), second.GetAttempt(), second.GetMeta().GetEventId())
	}
	a, err := e.store.Allocation(t.Context(), "m1")
	if err != nil || a.NodeID != "n2" {
		t.Fatalf("allocation %+v %v: want exactly one, on n2", a, err)
	}
	allocs, err := e.store.Allocations(t.Context(), "n1")
	if err != nil || len(allocs) != 0 {
		t.Fatalf("the fenced node still holds %d allocations (%v)", len(allocs), err)
	}

	// The zombie's late stop (attempt 1, on n1) must not free the new run.
	late := stopped(first, shizuv1.ExitReason_EXIT_REASON_NODE_FAILED)
	e.publish(late, migrating(first, sp)) // and a redelivered hand-over changes nothing
	testkit.Eventually(t, 20*time.Second, func() error {
		cons, err := e.Admin.JetStream().Consumer(t.Context(), topology.StreamRentals, "scheduler")
		if err != nil {
			return err
		}
		info, err := cons.Info(t.Context())
		if err != nil {
			return err
		}
		if info.NumPending != 0 || info.NumAckPending != 0 {
			return fmt.Errorf("scheduler has %d pending, %d unacknowledged", info.NumPending, info.NumAckPending)
		}
		return nil
	})
	if n := len(e.seen.snapshotScheduled("m1")); n != 2 {
		t.Fatalf("placed %d times after the redelivered hand-over", n)
	}
	if a, err := e.store.Allocation(t.Context(), "m1"); err != nil || a.NodeID != "n2" {
		t.Fatalf("after the old run's stop: %+v %v", a, err)
	}
}

// Failover sends next_attempt 0 and no spec when it never saw the rental
// scheduled: the scheduler cannot place such a move (attempt 0 would share
// attempt 1's outcome) and dead-letters it with the reason instead of
// acknowledging it silently.
func TestAMigratingRentalWithoutItsAttemptAndSpecIsDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register(gpuNode("n1", 1, capacity.MarketOnDemand))
	e.replica(testConfig(), time.Now)
	sp := spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND)
	e.publish(requested("u1", "acme", sp, time.Now()))
	var first *shizuv1.RentalScheduled
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) (err error) { first, err = scheduledOf(o, "u1"); return })
	blind := migrating(first, nil)
	blind.FromAttempt, blind.NextAttempt = 0, 0
	e.publish(blind)
	js := e.Admin.JetStream()
	testkit.Eventually(t, 20*time.Second, func() error {
		stream, err := js.Stream(t.Context(), topology.StreamDeadLetter)
		if err != nil {
			return err
		}
		m, err := stream.GetLastMsgForSubject(t.Context(), "dlq.RENTALS.scheduler")
		if err != nil {
			return err
		}
		if reason := m.Header.Get(bus.HeaderDLQReason); !strings.Contains(reason, "cannot be placed again") {
			return fmt.Errorf("dead letter reason %q", reason)
		}
		return nil
	})
	if a, err := e.store.Allocation(t.Context(), "u1"); err != nil || a.NodeID != "n1" {
		t.Fatalf("the dead-lettered move changed the allocation: %+v %v", a, err)
	}
}

// A tenant cancels while failover moves the rental: the lost run's
// allocation is already released and the next attempt not placed. The
// cancel is kept for that attempt: it is never started, its reservation is
// given back, and the tenant hears the rental is cancelled.
func TestACancelDuringAMoveStopsTheNextAttempt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register(gpuNode("n1", 1, capacity.MarketOnDemand))
	e.replica(testConfig(), time.Now)
	sp := spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND)
	e.publish(requested("c1", "acme", sp, time.Now()))
	var first *shizuv1.RentalScheduled
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) (err error) { first, err = scheduledOf(o, "c1"); return })

	// Failover fences n1 and releases the lost run; the cancel arrives
	// before the move is placed.
	if _, err := e.store.Fence(t.Context(), "n1", uint64(first.GetNodeEpoch())); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Release(t.Context(), "c1"); err != nil {
		t.Fatal(err)
	}
	e.register(gpuNode("n2", 2, capacity.MarketOnDemand))
	e.publish(cancel("c1", "acme"))
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) error {
		if len(o.rejected["c1"]) != 1 || o.rejected["c1"][0].GetReason() != shizuv1.RejectReason_REJECT_REASON_CANCELLED {
			return errors.New("no cancellation announced")
		}
		return nil
	})
	e.publish(migrating(first, sp), requested("after", "acme", sp, time.Now()))
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) (err error) { _, err = scheduledOf(o, "after"); return })
	e.seen.mu.Lock()
	scheduled, starts := len(e.seen.scheduled["c1"]), e.seen.starts["c1"]
	e.seen.mu.Unlock()
	if scheduled != 1 || starts != 1 {
		t.Fatalf("the cancelled rental was placed again: %d RentalScheduled, %d starts", scheduled, starts)
	}
	// The move's round may record after the later request's: its
	// reservation is given back once its claim finds the cancel.
	testkit.Eventually(t, 20*time.Second, func() error {
		if a, err := e.store.Allocation(t.Context(), "c1"); err == nil {
			return fmt.Errorf("the cancelled rental holds %+v", a)
		} else if !capacity.IsNotFound(err) {
			return fmt.Errorf("read the cancelled rental's allocation: %w", err)
		}
		return nil
	})
}
