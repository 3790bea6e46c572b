package bus_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// refusing dead-letters every RentalRequested it gets.
func refusing() *bus.Router {
	r := bus.NewRouter()
	r.Handle("shizu.v1.RentalRequested", func(context.Context, bus.Delivery) error {
		return fault.Invalid("the handler refuses it")
	})
	return r
}

func lastOf(t *testing.T, c *bus.Conn, stream, subj string) (seq, subjSeq uint64, msgID string) {
	t.Helper()
	s, err := c.JetStream().Stream(t.Context(), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.LastSeq == 0 {
		return 0, 0, ""
	}
	last, err := s.GetMsg(t.Context(), info.State.LastSeq)
	if err != nil {
		t.Fatal(err)
	}
	bySubj, err := s.GetLastMsgForSubject(t.Context(), subj)
	if err == nil {
		subjSeq = bySubj.Sequence
	}
	return info.State.LastSeq, subjSeq, last.Header.Get(bus.HeaderMsgID)
}

// TestDeadLettersDropTheServersPublishDirectives stores, on a consumed
// subject of a stream that accepts it, a message carrying each header the
// server acts on when a message is published, and has the consumer refuse
// it: the dead letter must be stored all the same (the header kept only
// under a renamed, informational name) and the consumer's ack floor move
// past the message.
func TestDeadLettersDropTheServersPublishDirectives(t *testing.T) {
	t.Parallel()
	_, c := setup(t, bus.Instruments{})
	js := c.JetStream()
	// Streams with the features Shizu's own streams refuse at the door.
	for _, cfg := range []jetstream.StreamConfig{
		{Name: "POISON", Subjects: []string{"poison.>"}, AllowMsgTTL: true, AllowRollup: true},
		{Name: "COUNTERS", Subjects: []string{"counter.>"}, AllowMsgCounter: true},
		{Name: "SCHEDULES", Subjects: []string{"sched.>"}, AllowMsgSchedules: true},
	} {
		if _, err := js.CreateStream(t.Context(), cfg); err != nil {
			t.Fatalf("stream %s: %v", cfg.Name, err)
		}
	}
	specs := map[string]bus.Consumer{}
	for stream, filter := range map[string]string{topology.StreamRentals: "rental.*.requested", topology.StreamMarket: "spot.*.*.price",
		"POISON": "poison.>", "COUNTERS": "counter.>", "SCHEDULES": "sched.s"} {
		spec := bus.Consumer{Stream: stream, Durable: "directives-" + strings.ToLower(stream), FilterSubjects: []string{filter},
			MaxDeliver: 3, AckWait: 5 * time.Second}
		specs[stream] = spec
		consume(t, c, spec, refusing(), bus.ConsumeOptions{RetryDelays: []time.Duration{10 * time.Millisecond}})
	}
	// A good message first, so the expectations below have something to
	// match on RENTALS.
	if _, err := c.Publish(t.Context(), requestedSubject, rentalRequested("first", "r-0")); err != nil {
		t.Fatal(err)
	}
	type directive struct {
		stream, subject string
		headers         func() map[string]string
		data            []byte
	}
	cases := map[string]directive{
		"Nats-Expected-Stream": {topology.StreamMarket, "spot.z1.H100.price",
			func() map[string]string { return map[string]string{"Nats-Expected-Stream": topology.StreamMarket} }, garbage},
		"Nats-Expected-Last-Sequence": {topology.StreamRentals, requestedSubject, func() map[string]string {
			seq, _, _ := lastOf(t, c, topology.StreamRentals, requestedSubject)
			return map[string]string{"Nats-Expected-Last-Sequence": strconv.FormatUint(seq, 10)}
		}, garbage},
		"Nats-Expected-Last-Subject-Sequence": {topology.StreamRentals, requestedSubject, func() map[string]string {
			_, subjSeq, _ := lastOf(t, c, topology.StreamRentals, requestedSubject)
			return map[string]string{"Nats-Expected-Last-Subject-Sequence": strconv.FormatUint(subjSeq, 10),
				"Nats-Expected-Last-Subject-Sequence-Subject": requestedSubject}
		}, garbage},
		"Nats-Expected-Last-Msg-Id": {topology.StreamRentals, requestedSubject, func() map[string]string {
			_, _, id := lastOf(t, c, topology.StreamRentals, requestedSubject)
			return map[string]string{"Nats-Expected-Last-Msg-Id": id}
		}, garbage},
		"Nats-TTL":           {"POISON", "poison.ttl", func() map[string]string { return map[string]string{"Nats-TTL": "1h"} }, garbage},
		"Nats-Rollup":        {"POISON", "poison.rollup", func() map[string]string { return map[string]string{"Nats-Rollup": "sub"} }, garbage},
		"Nats-Marker-Reason": {"POISON", "poison.marker", func() map[string]string { return map[string]string{"Nats-Marker-Reason": "Remove"} }, garbage},
		"a Nats- header of a later server": {"POISON", "poison.future",
			func() map[string]string { return map[string]string{"Nats-Expected-Something-New": "x"} }, garbage},
		"Nats-Incr": {"COUNTERS", "counter.c1", func() map[string]string { return map[string]string{"Nats-Incr": "+1"} }, nil},
		"Nats-Schedule": {"SCHEDULES", "sched.s", func() map[string]string {
			return map[string]string{"Nats-Schedule": "@at 2099-01-01T00:00:00Z", "Nats-Schedule-Target": "sched.t"}
		}, garbage},
	}
	type stored struct {
		stream string
		seq    uint64
		sent   map[string]string
	}
	var want []stored
	lastSeq := map[string]uint64{}
	for name, d := range cases {
		m := nats.NewMsg(d.subject)
		m.Data = d.data
		m.Header.Set(bus.HeaderEvent, "shizu.v1.RentalRequested")
		m.Header.Set(bus.HeaderMsgID, "directive:"+name)
		sent := d.headers()
		for k, v := range sent {
			m.Header.Set(k, v)
		}
		ack, err := c.PublishMsg(t.Context(), m)
		if err != nil {
			t.Fatalf("%s: the original must be stored to be poison: %v", name, err)
		}
		want = append(want, stored{d.stream, ack.Sequence, sent})
		lastSeq[d.stream] = max(lastSeq[d.stream], ack.Sequence)
	}
	testkit.Eventually(t, 60*time.Second, func() error {
		got := map[string]nats.Header{}
		for _, h := range deadLetterHeaders(t, c) {
			got[h.Get(bus.HeaderDLQStream)+"/"+h.Get(bus.HeaderDLQStreamSeq)] = h
		}
		var problems []string
		for _, w := range want {
			h, ok := got[w.stream+"/"+strconv.FormatUint(w.seq, 10)]
			if !ok {
				problems = append(problems, fmt.Sprintf("%v on %s: no dead letter", keys(w.sent), w.stream))
				continue
			}
			if h.Get(bus.HeaderDLQReason) == "" {
				problems = append(problems, fmt.Sprintf("%v on %s: dead letter without a reason", keys(w.sent), w.stream))
			}
			for k, v := range w.sent {
				if h.Get(k) != "" || h.Get(bus.HeaderDLQOriginal+k) != v {
					problems = append(problems, fmt.Sprintf("%s: kept as %q, renamed to %q; want it only renamed", k, h.Get(k), h.Get(bus.HeaderDLQOriginal+k)))
				}
			}
		}
		for stream, spec := range specs {
			info := streamConsumerInfo(t, c, stream, spec.Durable)
			if info.AckFloor.Stream < lastSeq[stream] || info.NumAckPending != 0 || info.NumPending != 0 {
				problems = append(problems, fmt.Sprintf("%s: ack floor %d, %d unacknowledged, %d pending", spec.Durable,
					info.AckFloor.Stream, info.NumAckPending, info.NumPending))
			}
		}
		if len(problems) > 0 {
			return fmt.Errorf("%d problems:\n%s", len(problems), strings.Join(problems, "\n"))
		}
		return nil
	})
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func streamConsumerInfo(t *testing.T, c *bus.Conn, stream, durable string) *jetstream.ConsumerInfo {
	t.Helper()
	cons, err := c.JetStream().Consumer(t.Context(), stream, durable)
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// limitDeadLetters makes the DEADLETTER stream refuse messages over max
// bytes, headers included.
func limitDeadLetters(t *testing.T, c *bus.Conn, maxBytes int32) {
	t.Helper()
	s, err := c.JetStream().Stream(t.Context(), topology.StreamDeadLetter)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxMsgSize = maxBytes
	if _, err := c.JetStream().UpdateStream(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
}

// A copy the dead letters refuse whole is stored without the payload,
// with the reason saying why.
func TestADeadLetterTooLargeForTheStreamKeepsItsReasonWithoutThePayload(t *testing.T) {
	t.Parallel()
	_, c := setup(t, bus.Instruments{})
	limitDeadLetters(t, c, 2048)
	consume(t, c, testConsumer("too-large", 3), refusing(), bus.ConsumeOptions{RetryDelays: []time.Duration{10 * time.Millisecond}})
	m := nats.NewMsg(requestedSubject)
	m.Data = []byte(strings.Repeat("x", 4096))
	m.Header.Set(bus.HeaderEvent, "shizu.v1.RentalRequested")
	m.Header.Set(bus.HeaderMsgID, "big-1")
	if _, err := c.PublishMsg(t.Context(), m); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, func() error {
		dls := deadLetters(t, c)
		if len(dls) != 1 {
			return fmt.Errorf("%d dead letters", len(dls))
		}
		reason := dls[0].Headers().Get(bus.HeaderDLQReason)
		if !strings.Contains(reason, "the handler refuses it") || !strings.Contains(reason, "payload") || len(dls[0].Data()) != 0 {
			return fmt.Errorf("dead letter of %d bytes, reason %q", len(dls[0].Data()), reason)
		}
		if info := consumerInfo(t, c, "too-large"); info.NumAckPending != 0 || info.AckFloor.Stream != 1 {
			return fmt.Errorf("ack floor %d, %d unacknowledged", info.AckFloor.Stream, info.NumAckPending)
		}
		return nil
	})
}

// When no copy can be stored at all, the message is redelivered until its
// last allowed delivery and then terminated, with an error log and a
// metric: the consumer moves on instead of holding its ack floor forever.
func TestADeadLetterThatCannotBeStoredEndsOnTheLastDelivery(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	_, c := setup(t, bus.Instruments{Meter: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	limitDeadLetters(t, c, 16)
	consume(t, c, testConsumer("no-copy", 2), refusing(), bus.ConsumeOptions{RetryDelays: []time.Duration{10 * time.Millisecond}})
	if _, err := c.Publish(t.Context(), requestedSubject, rentalRequested("lost-1", "r-1")); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, func() error {
		info := consumerInfo(t, c, "no-copy")
		if info.NumAckPending != 0 || info.AckFloor.Stream != 1 {
			return fmt.Errorf("ack floor %d, %d unacknowledged, %d redelivered", info.AckFloor.Stream, info.NumAckPending, info.NumRedelivered)
		}
		return nil
	})
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	outcomes := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "shizu.bus.consumed" {
				for _, dp := range sum.DataPoints {
					o, _ := dp.Attributes.Value("shizu.outcome")
					outcomes[o.AsString()] += dp.Value
				}
			}
		}
	}
	if outcomes["dead_letter_failed"] != 2 || outcomes["terminated_without_copy"] != 1 {
		t.Fatalf("outcomes %v: want 2 failed copies and 1 termination without a copy", outcomes)
	}
}

// A message with a publish expectation whose handler never answers is
// dead-lettered by the exhausted-delivery forwarder: its copy drops the
// expectation too.
func TestAnExhaustedDeliveryWithAPublishExpectationIsDeadLettered(t *testing.T) {
	t.Parallel()
	_, c := setup(t, bus.Instruments{})
	release := make(chan struct{})
	r := bus.NewRouter()
	r.Handle("shizu.v1.RentalRequested", func(context.Context, bus.Delivery) error {
		<-release
		return nil
	})
	spec := bus.Consumer{Stream: topology.StreamRentals, Durable: "hung-expectation",
		FilterSubjects: []string{requestedSubject}, MaxDeliver: 2, AckWait: 300 * time.Millisecond}
	sub, err := c.Consume(t.Context(), spec, r, bus.ConsumeOptions{Concurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 5*time.Second)
		defer cancel()
		_ = sub.Drain(ctx)
	}()
	defer close(release)
	m := nats.NewMsg(requestedSubject)
	m.Data = garbage
	m.Header.Set(bus.HeaderEvent, "shizu.v1.RentalRequested")
	m.Header.Set(bus.HeaderMsgID, "hung-1")
	m.Header.Set("Nats-Expected-Stream", topology.StreamRentals)
	if _, err := c.PublishMsg(t.Context(), m); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, func() error {
		hs := deadLetterHeaders(t, c)
		if len(hs) != 1 {
			return fmt.Errorf("%d dead letters", len(hs))
		}
		if !strings.Contains(hs[0].Get(bus.HeaderDLQReason), "without an answer") || hs[0].Get("Nats-Expected-Stream") != "" ||
			hs[0].Get("Shizu-Dlq-Original-Nats-Expected-Stream") != topology.StreamRentals {
			return fmt.Errorf("dead letter headers %v", hs[0])
		}
		return nil
	})
}
