package bus_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// rentalRequested builds a valid RentalRequested with the given ids.
func rentalRequested(eventID, rentalID string) *shizuv1.RentalRequested {
	return &shizuv1.RentalRequested{
		Meta:     &shizuv1.EventMeta{EventId: eventID, OccurredAt: timestamppb.Now(), Source: "test"},
		RentalId: rentalID,
		TenantId: "acme",
		Spec: &shizuv1.RentalSpec{
			GpuCount: 1, MilliGpu: 1000, VramMib: 81920,
			Interconnect: shizuv1.Interconnect_INTERCONNECT_ANY, Plan: shizuv1.Plan_PLAN_ON_DEMAND,
		},
	}
}

var requestedSubject = fmt.Sprintf(subject.RentalRequested, "acme")

// setup starts a server, provisions the topology and returns a connection.
func setup(t *testing.T, inst bus.Instruments) (*testkit.NATS, *bus.Conn) {
	t.Helper()
	n := testkit.StartNATS(t)
	c := connect(t, bus.Config{URL: n.URL, Name: "test"}, inst)
	if err := c.EnsureStreams(t.Context(), topology.Streams(1)...); err != nil {
		t.Fatalf("ensure streams: %v", err)
	}
	return n, c
}

func connect(t *testing.T, cfg bus.Config, inst bus.Instruments) *bus.Conn {
	t.Helper()
	c, err := bus.Connect(t.Context(), cfg, inst)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 5*time.Second)
		defer cancel()
		if err := c.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return c
}

func consume(t *testing.T, c *bus.Conn, spec bus.Consumer, r *bus.Router, opts bus.ConsumeOptions) *bus.Subscription {
	t.Helper()
	sub, err := c.Consume(t.Context(), spec, r, opts)
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 5*time.Second)
		defer cancel()
		if err := sub.Drain(ctx); err != nil {
			t.Errorf("drain: %v", err)
		}
	})
	return sub
}

func testConsumer(durable string, maxDeliver int) bus.Consumer {
	return bus.Consumer{Stream: topology.StreamRentals, Durable: durable,
		FilterSubjects: []string{subject.RentalRequestedAll}, MaxDeliver: maxDeliver, AckWait: 5 * time.Second}
}

// deadLetters reads every message in the DEADLETTER stream.
func deadLetters(t *testing.T, c *bus.Conn) []jetstream.Msg {
	t.Helper()
	s, err := c.JetStream().Stream(t.Context(), topology.StreamDeadLetter)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var out []jetstream.Msg
	if info.State.Msgs == 0 {
		return nil
	}
	oc, err := c.JetStream().OrderedConsumer(t.Context(), topology.StreamDeadLetter, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := oc.Fetch(int(info.State.Msgs), jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		out = append(out, m)
	}
	return out
}

func consumerInfo(t *testing.T, c *bus.Conn, durable string) *jetstream.ConsumerInfo {
	t.Helper()
	cons, err := c.JetStream().Consumer(t.Context(), topology.StreamRentals, durable)
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func TestDuplicatePublishIsStoredOnce(t *testing.T) {
	t.Parallel()
	_, c := setup(t, bus.Instruments{})
	ev := rentalRequested("req-1", "r-1")
	first, err := c.Publish(t.Context(), requestedSubject, ev)
	if err != nil {
		t.Fatal(err)
	}
	second, err := c.Publish(t.Context(), requestedSubject, ev)
	if err != nil {
		t.Fatal(err)
	}
	if first.Duplicate || !second.Duplicate || first.Sequence != second.Sequence {
		t.Fatalf("first=%+v second=%+v: want the second to be a duplicate of the first", first, second)
	}
	b := c.NewBatch()
	for range 3 {
		if err := b.Publish(t.Context(), requestedSubject, ev); err != nil {
			t.Fatal(err)
		}
	}
	acks, err := b.Wait(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range acks {
		if !a.Duplicate || a.Sequence != first.Sequence {
			t.Fatalf("async re-publish %+v: want duplicate of seq %d", a, first.Sequence)
		}
	}
	s, _ := c.JetStream().Stream(t.Context(), topology.StreamRentals)
	info, _ := s.Info(t.Context())
	if info.State.Msgs != 1 {
		t.Fatalf("stream holds %d messages, want 1", info.State.Msgs)
	}
}

func TestPublishRejectsEventsWithoutID(t *testing.T) {
	t.Parallel()
	_, c := setup(t, bus.Instruments{})
	_, err := c.Publish(t.Context(), requestedSubject, rentalRequested("", "r-1"))
	if !fault.IsInvalid(err) {
		t.Fatalf("publish without event id: got %v, want an invalid-input error", err)
	}
}

func TestPoisonMessagesAreDeadLetteredWithReasonAndNotRedelivered(t *testing.T) {
	t.Parallel()
	_, c := setup(t, bus.Instruments{})
	var handled atomic.Int32
	r := bus.NewRouter()
	bus.On(r, func(context.Context, *shizuv1.RentalRequested, bus.Delivery) error {
		handled.Add(1)
		return nil
	})
	consume(t, c, testConsumer("poison", 5), r, bus.ConsumeOptions{RetryDelays: []time.Duration{10 * time.Millisecond}})

	garbage := nats.NewMsg(requestedSubject)
	garbage.Data = []byte{0xff, 0xff, 0xff, 0x01}
	garbage.Header.Set(bus.HeaderMsgID, "garbage-1")
	garbage.Header.Set(bus.HeaderEvent, "shizu.v1.RentalRequested")
	if _, err := c.PublishMsg(t.Context(), garbage); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Publish(t.Context(), requestedSubject, rentalRequested("good-1", "r-1")); err != nil {
		t.Fatal(err)
	}

	testkit.Eventually(t, 10*time.Second, func() error {
		if n := len(deadLetters(t, c)); n != 1 {
			return fmt.Errorf("%d dead letters", n)
		}
		if handled.Load() != 1 {
			return fmt.Errorf("good message handled %d times", handled.Load())
		}
		info := consumerInfo(t, c, "poison")
		if info.NumAckPending != 0 || info.NumPending != 0 {
			return fmt.Errorf("consumer still has ack_pending=%d pending=%d", info.NumAckPending, info.NumPending)
		}
		return nil
	})
	dl := deadLetters(t, c)[0]
	if got := dl.Headers().Get(bus.HeaderDLQReason); got == "" || !strings.Contains(got, "decode shizu.v1.RentalRequested") {
		t.Fatalf("dead letter reason %q does not say what failed", got)
	}
	if dl.Headers().Get(bus.HeaderDLQSubject) != requestedSubject || dl.Headers().Get(bus.HeaderMsgID) == "garbage-1" {
		t.Fatalf("dead letter headers %v: want the original subject and its own id", dl.Headers())
	}
	if string(dl.Data()) != string(garbage.Data) {
		t.Fatal("dead letter lost the original payload")
	}
	if info := consumerInfo(t, c, "poison"); info.NumRedelivered != 0 {
		t.Fatalf("poison message was redelivered %d times", info.NumRedelivered)
	}
}

func TestHandlerInvalidErrorDeadLetters(t *testing.T) {
	t.Parallel()
	_, c := setup(t, bus.Instruments{})
	r := bus.NewRouter()
	bus.On(r, func(_ context.Context, ev *shizuv1.RentalRequested, _ bus.Delivery) error {
		return fault.Invalid("rental %s: tenant %q is suspended", ev.GetRentalId(), ev.GetTenantId())
	})
	consume(t, c, testConsumer("invalid", 5), r, bus.ConsumeOptions{})
	if _, err := c.Publish(t.Context(), requestedSubject, rentalRequested("e-1", "r-9")); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		if n := len(deadLetters(t, c)); n != 1 {
			return fmt.Errorf("%d dead letters", n)
		}
		return nil
	})
	if got := deadLetters(t, c)[0].Headers().Get(bus.HeaderDLQReason); got != `rental r-9: tenant "acme" is suspended` {
		t.Fatalf("reason %q", got)
	}
}

func TestTransientFailureIsRedeliveredAfterBackoff(t *testing.T) {
	t.Parallel()
	_, c := setup(t, bus.Instruments{})
	const delay = 300 * time.Millisecond
	var mu sync.Mutex
	var seen []time.Time
	var deliveries []uint64
	r := bus.NewRouter()
	bus.On(r, func(_ context.Context, _ *shizuv1.RentalRequested, d bus.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, time.Now())
		deliveries = append(deliveries, d.Delivered)
		if len(seen) == 1 {
			return fault.Unavailable("redis is restarting")
		}
		return nil
	})
	consume(t, c, testConsumer("transient", 5), r, bus.ConsumeOptions{RetryDelays: []time.Duration{delay}})
	if _, err := c.Publish(t.Context(), requestedSubject, rentalRequested("t-1", "r-1")); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		if consumerInfo(t, c, "transient").AckFloor.Stream != 1 {
			return errors.New("not acknowledged yet")
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 || deliveries[0] != 1 || deliveries[1] != 2 {
		t.Fatalf("deliveries %v: want exactly 1 then 2", deliveries)
	}
	// NakWithDelay promises no redelivery before the delay: a lower bound,
	// safe on a loaded machine.
	if gap := seen[1].Sub(seen[0]); gap < delay {
		t.Fatalf("redelivered after %s, before the %s backoff", gap, delay)
	}
	if n := len(deadLetters(t, c)); n != 0 {
		t.Fatalf("%d dead letters for a message that succeeded", n)
	}
}

func TestMaxDeliverDeadLettersTheLastFailure(t *testing.T) {
	t.Parallel()
	_, c := setup(t, bus.Instruments{})
	var calls atomic.Int32
	r := bus.NewRouter()
	bus.On(r, func(context.Context, *shizuv1.RentalRequested, bus.Delivery) error {
		calls.Add(1)
		return errors.New("scheduler snapshot unavailable")
	})
	consume(t, c, testConsumer("maxdeliver", 3), r, bus.ConsumeOptions{RetryDelays: []time.Duration{10 * time.Millisecond}})
	if _, err := c.Publish(t.Context(), requestedSubject, rentalRequested("m-1", "r-1")); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		if n := len(deadLetters(t, c)); n != 1 {
			return fmt.Errorf("%d dead letters", n)
		}
		return nil
	})
	dl := deadLetters(t, c)[0]
	if got := dl.Headers().Get(bus.HeaderDLQReason); !strings.Contains(got, "max deliveries (3) reached") || !strings.Contains(got, "snapshot unavailable") {
		t.Fatalf("reason %q", got)
	}
	if dl.Headers().Get(bus.HeaderDLQDeliveries) != "3" || calls.Load() != 3 {
		t.Fatalf("deliveries header %q, handler calls %d: want 3 and 3", dl.Headers().Get(bus.HeaderDLQDeliveries), calls.Load())
	}
}

// A consumer that takes a subject whose event it has no handler for
// dead-letters it with the reason instead of acknowledging it unread.
func TestAnEventWithoutAHandlerIsDeadLettered(t *testing.T) {
	t.Parallel()
	_, c := setup(t, bus.Instruments{})
	consume(t, c, testConsumer("unhandled", 5), bus.NewRouter(), bus.ConsumeOptions{})
	if _, err := c.Publish(t.Context(), requestedSubject, rentalRequested("u-1", "r-1")); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		if consumerInfo(t, c, "unhandled").AckFloor.Stream != 1 {
			return errors.New("not terminated")
		}
		if n := len(deadLetters(t, c)); n != 1 {
			return fmt.Errorf("%d dead letters", n)
		}
		return nil
	})
	if got := deadLetters(t, c)[0].Headers().Get(bus.HeaderDLQReason); !strings.Contains(got, "no handler for event shizu.v1.RentalRequested") {
		t.Fatalf("reason %q", got)
	}
}

func TestTraceStartedByPublisherContinuesInConsumer(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	_, c := setup(t, bus.Instruments{Tracer: tp})
	got := make(chan trace.SpanContext, 1)
	r := bus.NewRouter()
	bus.On(r, func(ctx context.Context, _ *shizuv1.RentalRequested, _ bus.Delivery) error {
		got <- trace.SpanContextFromContext(ctx)
		return nil
	})
	consume(t, c, testConsumer("traced", 5), r, bus.ConsumeOptions{})

	ctx, root := tp.Tracer("test").Start(t.Context(), "tenant request")
	if _, err := c.Publish(ctx, requestedSubject, rentalRequested("tr-1", "r-1")); err != nil {
		t.Fatal(err)
	}
	root.End()
	var consumerSide trace.SpanContext
	select {
	case consumerSide = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("event not consumed")
	}
	if consumerSide.TraceID() != root.SpanContext().TraceID() {
		t.Fatalf("consumer trace %s, publisher trace %s", consumerSide.TraceID(), root.SpanContext().TraceID())
	}
	var publish, process sdktrace.ReadOnlySpan
	testkit.Eventually(t, 5*time.Second, func() error {
		for _, s := range rec.Ended() {
			switch s.Name() {
			case "publish shizu.v1.RentalRequested":
				publish = s
			case "process shizu.v1.RentalRequested":
				process = s
			}
		}
		if publish == nil || process == nil {
			return errors.New("spans not ended yet")
		}
		return nil
	})
	if process.Parent().SpanID() != publish.SpanContext().SpanID() {
		t.Fatalf("process span's parent %s, want the publish span %s", process.Parent().SpanID(), publish.SpanContext().SpanID())
	}
	if process.SpanKind() != trace.SpanKindConsumer || publish.SpanKind() != trace.SpanKindProducer {
		t.Fatalf("span kinds %v/%v", publish.SpanKind(), process.SpanKind())
	}
}

func TestDrainFinishesInFlightMessagesWithoutLoss(t *testing.T) {
	t.Parallel()
	_, c := setup(t, bus.Instruments{})
	const total = 60
	b := c.NewBatch()
	for i := range total {
		if err := b.Publish(t.Context(), requestedSubject, rentalRequested(fmt.Sprintf("d-%d", i), fmt.Sprintf("r-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	handled := map[string]int{}
	started := make(chan struct{}, total)
	release := make(chan struct{})
	r := bus.NewRouter()
	bus.On(r, func(_ context.Context, ev *shizuv1.RentalRequested, _ bus.Delivery) error {
		started <- struct{}{}
		<-release
		mu.Lock()
		handled[ev.GetRentalId()]++
		mu.Unlock()
		return nil
	})
	spec := testConsumer("drain", 5)
	sub, err := c.Consume(t.Context(), spec, r, bus.ConsumeOptions{Concurrency: 4})
	if err != nil {
		t.Fatal(err)
	}
	for range 4 { // four handlers are in flight
		<-started
	}
	drained := make(chan error, 1)
	go func() { drained <- sub.Drain(t.Context()) }()
	close(release)
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
	info := consumerInfo(t, c, "drain")
	mu.Lock()
	first := len(handled)
	mu.Unlock()
	if info.NumAckPending != 0 {
		t.Fatalf("after drain %d deliveries are unacknowledged", info.NumAckPending)
	}
	if first < 4 || uint64(first)+info.NumPending != total {
		t.Fatalf("handled %d + pending %d != %d published", first, info.NumPending, total)
	}
	// A new replica picks up the rest; every message is handled exactly once.
	consume(t, c, spec, r, bus.ConsumeOptions{Concurrency: 4})
	testkit.Eventually(t, 10*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(handled) != total {
			return fmt.Errorf("handled %d of %d", len(handled), total)
		}
		return nil
	})
	for id, n := range handled {
		if n != 1 {
			t.Fatalf("rental %s handled %d times", id, n)
		}
	}
}

func TestEnsureStreamsIsIdempotent(t *testing.T) {
	t.Parallel()
	_, c := setup(t, bus.Instruments{})
	if err := c.EnsureStreams(t.Context(), topology.Streams(1)...); err != nil {
		t.Fatalf("second provisioning: %v", err)
	}
	for _, svc := range topology.Services() {
		for _, spec := range svc.Consumers {
			for range 2 {
				if _, err := c.EnsureConsumer(t.Context(), spec); err != nil {
					t.Fatalf("consumer %s: %v", spec.Durable, err)
				}
			}
		}
	}
	bad := bus.Stream{Name: "BAD", Replicas: 9}
	if err := c.EnsureStreams(t.Context(), bad); err == nil || !strings.Contains(err.Error(), "subjects") || !strings.Contains(err.Error(), "replicas") {
		t.Fatalf("invalid stream declaration: got %v, want errors naming subjects and replicas", err)
	}
}

func TestTopologyProvisionsR3StreamsOnACluster(t *testing.T) {
	t.Parallel()
	cl := testkit.StartCluster(t, 3)
	c := connect(t, bus.Config{URL: cl.URL(), Name: "test"}, bus.Instruments{})
	testkit.Eventually(t, 30*time.Second, func() error {
		return c.EnsureStreams(t.Context(), topology.Streams(3)...)
	})
	if err := c.EnsureStreams(t.Context(), topology.Streams(3)...); err != nil {
		t.Fatal(err)
	}
	s, err := c.JetStream().Stream(t.Context(), topology.StreamRentals)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Replicas != 3 {
		t.Fatalf("RENTALS has %d replicas, want 3", info.Config.Replicas)
	}
	if _, err := c.Publish(t.Context(), requestedSubject, rentalRequested("c-1", "r-1")); err != nil {
		t.Fatal(err)
	}
}

// testNATS starts a server for benchmarks and tests alike.
func testNATS(tb testing.TB) *testkit.NATS { return testkit.StartNATS(tb) }

func TestDeliveriesThatNeverGetAnAnswerAreDeadLettered(t *testing.T) {
	t.Parallel()
	_, c := setup(t, bus.Instruments{})
	// A handler that hangs past the ack wait on every delivery, as a
	// deadlocked or dying process would: the server gives up after
	// MaxDeliver and says so only in an advisory.
	release := make(chan struct{})
	var calls atomic.Int32
	r := bus.NewRouter()
	bus.On(r, func(context.Context, *shizuv1.RentalRequested, bus.Delivery) error {
		calls.Add(1)
		<-release
		return nil
	})
	spec := bus.Consumer{Stream: topology.StreamRentals, Durable: "hung",
		FilterSubjects: []string{subject.RentalRequestedAll}, MaxDeliver: 2, AckWait: 300 * time.Millisecond}
	sub, err := c.Consume(t.Context(), spec, r, bus.ConsumeOptions{Concurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 5*time.Second)
		defer cancel()
		_ = sub.Drain(ctx)
	}()
	defer close(release) // runs first: the hung handlers return, then Drain
	if _, err := c.Publish(t.Context(), requestedSubject, rentalRequested("h-1", "r-1")); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 15*time.Second, func() error {
		if n := len(deadLetters(t, c)); n != 1 {
			return fmt.Errorf("%d dead letters (handler called %d times)", n, calls.Load())
		}
		return nil
	})
	dl := deadLetters(t, c)[0]
	if got := dl.Headers().Get(bus.HeaderDLQReason); !strings.Contains(got, "without an answer") {
		t.Fatalf("reason %q", got)
	}
	if dl.Headers().Get(bus.HeaderDLQSubject) != requestedSubject || dl.Headers().Get(bus.HeaderEvent) != "shizu.v1.RentalRequested" {
		t.Fatalf("dead letter lost the original subject or event name: %v", dl.Headers())
	}
	var ev shizuv1.RentalRequested
	if err := proto.Unmarshal(dl.Data(), &ev); err != nil || ev.GetRentalId() != "r-1" {
		t.Fatalf("dead letter payload: %v %v", err, ev.GetRentalId())
	}
}
