package bus_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

// A batch handler's outcomes act per delivery: nil acks, invalid
// dead-letters with the reason, anything else redelivers that delivery
// only.
func TestBatchOutcomesAreAppliedPerDelivery(t *testing.T) {
	t.Parallel()
	_, c := setup(t, bus.Instruments{})
	var mu sync.Mutex
	seen := map[string][]uint64{} // msg id -> delivery counts
	var batches []int
	h := func(_ context.Context, ds []bus.Delivery) []error {
		mu.Lock()
		defer mu.Unlock()
		batches = append(batches, len(ds))
		out := make([]error, len(ds))
		for i, d := range ds {
			seen[d.MsgID] = append(seen[d.MsgID], d.Delivered)
			switch {
			case d.MsgID == "b-bad":
				out[i] = fault.Invalid("rental %s is malformed", d.MsgID)
			case d.MsgID == "b-flaky" && d.Delivered == 1:
				out[i] = fault.Unavailable("redis is restarting")
			}
		}
		return out
	}
	sub, err := c.ConsumeBatch(t.Context(), testConsumer("batch", 5), h,
		bus.BatchOptions{MaxBatch: 4, RetryDelays: []time.Duration{100 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Drain(context.WithoutCancel(t.Context())) })
	ids := []string{"b-1", "b-2", "b-bad", "b-flaky", "b-3", "b-4", "b-5", "b-6", "b-7"}
	for _, id := range ids {
		if _, err := c.Publish(t.Context(), requestedSubject, rentalRequested(id, "r-"+id)); err != nil {
			t.Fatal(err)
		}
	}
	testkit.Eventually(t, 20*time.Second, func() error {
		info := consumerInfo(t, c, "batch")
		if info.NumPending > 0 || info.NumAckPending > 0 || len(deadLetters(t, c)) != 1 {
			return fmt.Errorf("%d pending, %d unacknowledged", info.NumPending, info.NumAckPending)
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		want := []uint64{1}
		if id == "b-flaky" {
			want = []uint64{1, 2}
		}
		if !slices.Equal(seen[id], want) {
			t.Errorf("%s delivered %v, want %v", id, seen[id], want)
		}
	}
	for _, n := range batches {
		if n < 1 || n > 4 {
			t.Errorf("batch of %d deliveries, want 1..4", n)
		}
	}
	if got := deadLetters(t, c)[0].Headers().Get(bus.HeaderDLQReason); got != "rental b-bad is malformed" {
		t.Fatalf("dead-letter reason %q", got)
	}
}

// A replica whose connection died while its workers were busy and the
// client still held deliveries for them: draining its subscriptions
// afterwards returns without a panic (nats.go reports the consume context
// closed while a callback still waits to hand a message to the workers),
// and the deliveries it never handled go to another replica.
func TestDrainAfterTheConnectionDiedLosesNothing(t *testing.T) {
	t.Parallel()
	n, c := setup(t, bus.Instruments{})
	const total = 40
	for i := range total {
		if _, err := c.Publish(t.Context(), requestedSubject, rentalRequested(fmt.Sprintf("d-%d", i), fmt.Sprintf("r-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	spec := testConsumer("dying", 5)
	spec.AckWait = time.Second
	dying, err := bus.Connect(t.Context(), bus.Config{URL: n.URL, Name: "dying"}, bus.Instruments{})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	busy := make(chan struct{}, 1)
	subs := make([]*bus.Subscription, 0, 2)
	for range 2 { // two subscriptions of the same dying replica
		block := func(context.Context, []bus.Delivery) []error {
			select {
			case busy <- struct{}{}:
			default:
			}
			<-release
			return nil
		}
		sub, err := dying.ConsumeBatch(t.Context(), spec, block, bus.BatchOptions{MaxBatch: 1})
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, sub)
	}
	<-busy // a worker holds a delivery; the queue and the callback fill up:
	// the server has handed the replica more than its busy workers hold.
	testkit.Eventually(t, 10*time.Second, func() error {
		if info := consumerInfo(t, c, "dying"); info.NumAckPending < 3 {
			return fmt.Errorf("%d deliveries handed out", info.NumAckPending)
		}
		return nil
	})
	dying.NATS().Close() // the replica's connection dies
	close(release)
	for _, sub := range subs {
		if err := sub.Drain(t.Context()); err != nil {
			t.Logf("drain of a dead connection's subscription: %v", err)
		}
	}

	// A healthy replica gets every delivery the dead one did not ack.
	var mu sync.Mutex
	seen := map[string]bool{}
	sub, err := c.ConsumeBatch(t.Context(), spec, func(_ context.Context, ds []bus.Delivery) []error {
		mu.Lock()
		defer mu.Unlock()
		for _, d := range ds {
			seen[d.MsgID] = true
		}
		return nil
	}, bus.BatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Drain(context.WithoutCancel(t.Context())) })
	testkit.Eventually(t, 30*time.Second, func() error {
		info := consumerInfo(t, c, "dying")
		if info.NumPending > 0 || info.NumAckPending > 0 {
			return fmt.Errorf("%d pending, %d unacknowledged", info.NumPending, info.NumAckPending)
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != total { // the dead replica acked nothing: its handlers were blocked
		t.Fatalf("the healthy replica handled %d of %d deliveries", len(seen), total)
	}
}
