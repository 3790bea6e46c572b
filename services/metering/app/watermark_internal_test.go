package app

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// The consumed time of a durable is the server's time when it has nothing
// to handle, and otherwise the stored time of the first message it filters
// after its ack floor (when that one is gone, the next).
func TestConsumedTimeIsTheFirstMessageAfterTheAckFloor(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, js := testkit.StartNATS(t).JetStream(t)
	str, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "T", jetstream.ConsumerConfig{Durable: "d", FilterSubject: "t.a",
		AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	ct := newConsumedTime(js, bus.Consumer{Stream: "T", Durable: "d"})
	lookup := func() time.Time {
		t.Helper()
		at, err := ct.lookup(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return at
	}
	stored := func(seq uint64) time.Time {
		t.Helper()
		m, err := str.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		return m.Time
	}

	if lookup().IsZero() {
		t.Fatal("an idle durable has no consumed time")
	}
	for _, subj := range []string{"t.b", "t.a", "t.a", "t.a", "t.a"} { // seq 1 is not the durable's
		if _, err := js.Publish(ctx, subj, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := lookup(), stored(2); !got.Equal(want) {
		t.Fatalf("nothing handled: consumed time %s, want the first filtered message's %s", got, want)
	}
	if err := str.DeleteMsg(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if got, want := lookup(), stored(3); !got.Equal(want) {
		t.Fatalf("first message deleted: consumed time %s, want the next one's %s", got, want)
	}
	handle := func(n int) {
		t.Helper()
		batch, err := cons.FetchNoWait(n)
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			if err := m.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	handle(1)
	if got, want := lookup(), stored(4); !got.Equal(want) {
		t.Fatalf("seq 3 handled: consumed time %s, want seq 4's %s", got, want)
	}
	handle(2)
	if _, err := js.Publish(ctx, "t.b", []byte("x")); err != nil { // not the durable's: holds nothing back
		t.Fatal(err)
	}
	if got, last := lookup(), stored(6); got.Before(last) {
		t.Fatalf("all handled: consumed time %s is before the last message's %s", got, last)
	}
}

// The watermark is the earliest of its durables' consumed times and never
// moves back.
func TestTheWatermarkIsTheEarliestDurableAndOnlyMovesForward(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, js := testkit.StartNATS(t).JetStream(t)
	for _, name := range []string{"A", "B"} {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}}); err != nil {
			t.Fatal(err)
		}
		if _, err := js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{Durable: "d", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
			t.Fatal(err)
		}
	}
	ack, err := js.Publish(ctx, "B.x", []byte("x")) // B has one to handle
	if err != nil {
		t.Fatal(err)
	}
	w := watermark{of: []*consumedTime{newConsumedTime(js, bus.Consumer{Stream: "A", Durable: "d"}),
		newConsumedTime(js, bus.Consumer{Stream: "B", Durable: "d"})}}
	if err := w.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	b, _ := js.Stream(ctx, "B")
	m, err := b.GetMsg(ctx, ack.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	if !w.time().Equal(m.Time) {
		t.Fatalf("watermark %s, want B's unhandled message's %s", w.time(), m.Time)
	}
	before := w.time()
	w.of = append(w.of, newConsumedTime(js, bus.Consumer{Stream: "A", Durable: "missing"}))
	if err := w.refresh(ctx); err == nil {
		t.Fatal("a missing durable gave a watermark")
	}
	if !w.time().Equal(before) {
		t.Fatalf("a failed lookup moved the watermark from %s to %s", before, w.time())
	}
}

// BenchmarkWatermarkRefresh measures what the closer pays each tick to read
// the watermark of metering's rental and spot durables (a consumer info and
// one message lookup per filter subject each) with 20,000 rental events
// unhandled, next to one consumer info request (one round trip) in the
// same run.
//
//	go test -run '^$' -bench WatermarkRefresh ./services/metering/app/
func BenchmarkWatermarkRefresh(b *testing.B) {
	ctx := context.Background()
	n := testkit.StartNATS(b)
	conn, err := bus.Connect(ctx, bus.Config{URL: n.URL, Name: "bench"}, bus.Instruments{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close(context.Background()) })
	if err := conn.EnsureStreams(ctx, topology.Streams(1)...); err != nil {
		b.Fatal(err)
	}
	svc, _ := topology.ServiceNamed(topology.Metering)
	var w watermark
	for _, c := range svc.Consumers {
		if _, err := conn.EnsureConsumer(ctx, c); err != nil {
			b.Fatal(err)
		}
		if c.Stream == topology.StreamRentals || c.Stream == topology.StreamMarket {
			w.of = append(w.of, newConsumedTime(conn.JetStream(), c))
		}
	}
	js := conn.JetStream()
	for i := range 20_000 {
		subj := []string{"rental.t0.scheduled", "rental.t0.started", "rental.t0.stopped", "rental.t0.requested"}[i%4]
		if _, err := js.PublishAsync(subj, []byte("x")); err != nil {
			b.Fatal(err)
		}
	}
	<-js.PublishAsyncComplete()
	cons, err := js.Consumer(ctx, topology.StreamRentals, "metering")
	if err != nil {
		b.Fatal(err)
	}
	const infos = 200
	start := time.Now()
	for range infos {
		if _, err := cons.Info(ctx); err != nil {
			b.Fatal(err)
		}
	}
	perInfo := time.Since(start) / infos
	b.ResetTimer()
	for range b.N {
		if err := w.refresh(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	perRefresh := b.Elapsed() / time.Duration(b.N)
	b.ReportMetric(float64(perRefresh.Microseconds()), "µs/refresh")
	b.ReportMetric(float64(perInfo.Microseconds()), "µs/consumer-info")
	b.ReportMetric(float64(perRefresh)/float64(perInfo), "refresh/info")
}
