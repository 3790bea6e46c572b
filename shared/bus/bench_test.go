package bus_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// event200 returns a RentalRequested padded to 200 bytes on the wire.
func event200(b *testing.B, i int) *shizuv1.RentalRequested {
	ev := rentalRequested(fmt.Sprintf("bench-%09d", i), fmt.Sprintf("r-%09d", i))
	ev.Spec.Labels = map[string]string{"pad": ""}
	pad := 200 - proto.Size(ev)
	if pad < 0 {
		b.Fatalf("base event is %d bytes, over 200", proto.Size(ev))
	}
	ev.Spec.Labels["pad"] = strings.Repeat("x", pad)
	if n := proto.Size(ev); n != 200 {
		ev.Spec.Labels["pad"] = strings.Repeat("x", pad-(n-200))
	}
	return ev
}

// BenchmarkPublishConsume200B measures, in one run on one server, a raw
// jetstream loop (async publish, then a pull consumer with plain Ack) and
// the bus (Batch publish with ids, trace headers and retries, then Consume
// through a typed router with DoubleAck), for b.N 200-byte events each. The
// figure to quote is bus_vs_raw.
func BenchmarkPublishConsume200B(b *testing.B) {
	n := testNATS(b)
	c, err := bus.Connect(b.Context(), bus.Config{URL: n.URL, Name: "bench"}, bus.Instruments{Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close(context.WithoutCancel(b.Context()))
	if err := c.EnsureStreams(b.Context(), topology.Streams(1)...); err != nil {
		b.Fatal(err)
	}
	js := c.JetStream()
	payloads := make([][]byte, b.N)
	events := make([]*shizuv1.RentalRequested, b.N)
	for i := range b.N {
		events[i] = event200(b, i)
		payloads[i], _ = proto.Marshal(events[i])
	}
	b.ResetTimer()

	// Raw: the ceiling, measured in the same run.
	rawStart := time.Now()
	for i, p := range payloads {
		if _, err := js.PublishAsync("rental.raw.requested", p, jetstream.WithMsgID(fmt.Sprintf("raw-%d", i))); err != nil {
			b.Fatal(err)
		}
	}
	<-js.PublishAsyncComplete()
	rawPublished := time.Since(rawStart)
	cons, err := js.CreateOrUpdateConsumer(b.Context(), topology.StreamRentals, jetstream.ConsumerConfig{
		Durable: "raw", FilterSubject: "rental.raw.requested", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		b.Fatal(err)
	}
	var rawGot atomic.Int64
	rawDone := make(chan struct{})
	cc, err := cons.Consume(func(m jetstream.Msg) {
		var ev shizuv1.RentalRequested
		if err := proto.Unmarshal(m.Data(), &ev); err != nil {
			b.Error(err)
		}
		_ = m.Ack()
		if rawGot.Add(1) == int64(b.N) {
			close(rawDone)
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	<-rawDone
	raw := time.Since(rawStart)
	cc.Stop()

	busPublished, busTotal := benchBus(b, c, events, "bench-safe", false)
	_, busFastTotal := benchBus(b, c, events, "bench-fast", true)
	b.StopTimer()

	perSec := func(d time.Duration) float64 { return float64(b.N) / d.Seconds() }
	b.ReportMetric(perSec(rawPublished), "raw_pub/s")
	b.ReportMetric(perSec(raw), "raw_pub+consume/s")
	b.ReportMetric(perSec(busPublished), "bus_pub/s")
	b.ReportMetric(perSec(busTotal), "bus_pub+consume/s")
	b.ReportMetric(perSec(busFastTotal), "bus_fastack_pub+consume/s")
	b.ReportMetric(raw.Seconds()/busTotal.Seconds(), "bus_vs_raw")
	b.ReportMetric(raw.Seconds()/busFastTotal.Seconds(), "bus_fastack_vs_raw")
}

// benchBus publishes events through a Batch under a fresh tenant and
// consumes them through a typed router; it returns the publish time and the
// total time.
func benchBus(b *testing.B, c *bus.Conn, events []*shizuv1.RentalRequested, tenant string, fastAck bool) (time.Duration, time.Duration) {
	subj := fmt.Sprintf("rental.%s.requested", tenant)
	start := time.Now()
	batch := c.NewBatch()
	for _, ev := range events {
		ev.Meta.EventId = tenant + ev.GetRentalId()
		if err := batch.Publish(b.Context(), subj, ev); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := batch.Wait(b.Context()); err != nil {
		b.Fatal(err)
	}
	published := time.Since(start)
	var got atomic.Int64
	done := make(chan struct{})
	r := bus.NewRouter()
	bus.On(r, func(context.Context, *shizuv1.RentalRequested, bus.Delivery) error {
		if got.Add(1) == int64(len(events)) {
			close(done)
		}
		return nil
	})
	spec := bus.Consumer{Stream: topology.StreamRentals, Durable: tenant, FilterSubjects: []string{subj}}
	sub, err := c.Consume(b.Context(), spec, r, bus.ConsumeOptions{Concurrency: 32, FastAck: fastAck})
	if err != nil {
		b.Fatal(err)
	}
	<-done
	total := time.Since(start)
	_ = sub.Drain(context.WithoutCancel(b.Context()))
	return published, total
}
