package app_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Deliveries are acknowledged a batch at a time; a request delivered
// again (its ack lost, or the request sent twice) lands in the same batch
// or a later one, on either replica. Each rental still ends scheduled
// once: one RentalScheduled and one StartRental stored, one allocation
// held.
func TestARequestDeliveredAgainIsScheduledOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for i := range 4 {
		e.register(gpuNode(fmt.Sprintf("node-%d", i), 8, capacity.MarketOnDemand))
	}
	cfg := testConfig()
	cfg.BatchSize, cfg.Concurrency = 16, 64
	e.replica(cfg, time.Now)
	e.replica(cfg, time.Now)

	const rentals, copies = 20, 3
	now := time.Now()
	var msgs []proto.Message
	for c := range copies {
		for i := range rentals {
			ev := requested(fmt.Sprintf("d%02d", i), "tenant-d", spec(1, 250, 8*1024, shizuv1.Plan_PLAN_ON_DEMAND), now)
			ev.Meta.EventId = fmt.Sprintf("req:d%02d:copy%d", i, c) // a distinct delivery each
			msgs = append(msgs, ev)
		}
	}
	e.publish(msgs...)

	// Every delivery handled and acknowledged.
	js := e.Admin.JetStream()
	testkit.Eventually(t, 30*time.Second, func() error {
		cons, err := js.Consumer(t.Context(), topology.StreamRentals, "scheduler")
		if err != nil {
			return err
		}
		info, err := cons.Info(t.Context())
		if err != nil {
			return err
		}
		if info.NumPending == 0 && info.NumAckPending == 0 && info.AckFloor.Stream >= uint64(rentals*copies) {
			return nil
		}
		return fmt.Errorf("deliveries not all acknowledged: %d pending, %d unacknowledged", info.NumPending, info.NumAckPending)
	})

	count := func(stream, subj string) uint64 {
		s, err := js.Stream(t.Context(), stream)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(t.Context(), jetstream.WithSubjectFilter(subj))
		if err != nil {
			t.Fatal(err)
		}
		var n uint64
		for _, c := range info.State.Subjects {
			n += c
		}
		return n
	}
	scheduledSubj, _ := subject.Format(subject.RentalScheduled, "tenant-d")
	if n := count(topology.StreamRentals, scheduledSubj); n != rentals {
		t.Errorf("%d RentalScheduled stored, want %d (one per rental)", n, rentals)
	}
	if n := count(topology.StreamAgentCmds, subject.AgentCmdAll); n != rentals {
		t.Errorf("%d agent commands stored, want %d (one start per rental)", n, rentals)
	}
	snap, err := e.store.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	held := 0
	for _, n := range snap.Nodes {
		held += len(n.Allocations)
	}
	if held != rentals {
		t.Errorf("store holds %d allocations, want %d", held, rentals)
	}
}

// A request delivered again after its rental was scheduled, when the
// cluster has no room left (the rental itself fills it), is not announced
// pending: the rental is scheduled and its tenant sees nothing new.
func TestADuplicateOfAScheduledRentalOnAFullClusterIsNotPending(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register(gpuNode("node-0", 1, capacity.MarketOnDemand))
	e.replica(testConfig(), time.Now)
	o := e.watch()
	ev := requested("dup", "tenant-p", spec(1, 1000, 8*1024, shizuv1.Plan_PLAN_ON_DEMAND), time.Now())
	e.publish(ev)
	testkit.Eventually(t, 20*time.Second, func() error {
		o.mu.Lock()
		defer o.mu.Unlock()
		if len(o.scheduled["dup"]) != 1 {
			return fmt.Errorf("%d RentalScheduled", len(o.scheduled["dup"]))
		}
		return nil
	})
	again := proto.Clone(ev).(*shizuv1.RentalRequested)
	again.Meta.EventId = "req:dup:again" // a distinct delivery of the same request
	// A marker after it, on the same consumer: once it is decided, the
	// duplicate before it has been handled.
	marker := requested("marker", "tenant-p", spec(1, 1000, 8*1024, shizuv1.Plan_PLAN_ON_DEMAND), time.Now())
	e.publish(again, marker)
	testkit.Eventually(t, 20*time.Second, func() error {
		o.mu.Lock()
		defer o.mu.Unlock()
		if len(o.pending["marker"]) == 0 {
			return fmt.Errorf("the marker is not pending yet")
		}
		return nil
	})
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.pending["dup"]) != 0 || len(o.scheduled["dup"]) != 1 || len(o.rejected["dup"]) != 0 {
		t.Fatalf("the scheduled rental's duplicate: %d pending, %d scheduled, %d rejected events; want only the one scheduled",
			len(o.pending["dup"]), len(o.scheduled["dup"]), len(o.rejected["dup"]))
	}
}
