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
	js := e.admin.JetStream()
	deadline := time.Now().Add(30 * time.Second)
	for {
		cons, err := js.Consumer(t.Context(), topology.StreamRentals, "scheduler")
		if err != nil {
			t.Fatal(err)
		}
		info, err := cons.Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if info.NumPending == 0 && info.NumAckPending == 0 && info.AckFloor.Stream >= uint64(rentals*copies) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("deliveries not all acknowledged: %d pending, %d unacknowledged", info.NumPending, info.NumAckPending)
		}
		time.Sleep(10 * time.Millisecond)
	}

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
