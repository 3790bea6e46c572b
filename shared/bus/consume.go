package bus

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/telemetry"
)

// Dead-letter headers, added to the copy of a message that could not be
// processed. The original headers (event id, event name, trace) are kept.
const (
	HeaderDLQReason     = "Shizu-Dlq-Reason"
	HeaderDLQSubject    = "Shizu-Dlq-Subject"
	HeaderDLQStream     = "Shizu-Dlq-Stream"
	HeaderDLQStreamSeq  = "Shizu-Dlq-Stream-Seq"
	HeaderDLQConsumer   = "Shizu-Dlq-Consumer"
	HeaderDLQDeliveries = "Shizu-Dlq-Deliveries"
)

// Delivery is one message handed to a handler.
type Delivery struct {
	Subject string
	// Event is the protobuf full name from the Shizu-Event header.
	Event string
	// MsgID is the event id (Nats-Msg-Id); handlers are idempotent on it.
	MsgID  string
	Header nats.Header
	Data   []byte
	// Delivered counts deliveries of this message, 1 on the first.
	Delivered uint64
	StreamSeq uint64
}

// HandlerFunc processes one delivery. Its error decides the outcome: nil
// acks; an error of kind fault.ErrInvalid terminates the message and copies
// it to the dead-letter subject; any other error redelivers it after a
// backoff delay, and the last allowed delivery is dead-lettered instead.
type HandlerFunc func(ctx context.Context, d Delivery) error

// Router maps event names to handlers. The event of a delivery is the one
// its subject carries (see Carried); a delivery the consumer cannot use is
// dead-lettered with the reason: no event type, a Shizu-Event header its
// subject contradicts (an unknown type included), a body naming another
// tenant than its subject (TenantMismatch), or a type this router has no
// handler for. Nothing is acknowledged unread.
type Router struct {
	handlers  map[string]HandlerFunc
	bySubject []subjectEvent
}

type subjectEvent struct{ pattern, event string }

// NewRouter returns an empty router.
func NewRouter() *Router { return &Router{handlers: map[string]HandlerFunc{}} }

// Handle registers a handler for raw deliveries of one event name.
func (r *Router) Handle(event string, h HandlerFunc) { r.handlers[event] = h }

// EventForSubject names the event carried on subjects matching pattern,
// for a subject outside Shizu's contract (the server's advisories) whose
// messages have no Shizu-Event header. A subject of the contract already
// names its event.
func (r *Router) EventForSubject(pattern, event string) {
	r.bySubject = append(r.bySubject, subjectEvent{pattern, event})
}

// Validator is implemented by events that can check their own content.
type Validator interface{ Validate() error }

// On registers a typed handler: the payload is decoded into a new E and,
// when E has a Validate method, validated. A payload that cannot be decoded
// or fails validation is dead-lettered with the reason, never redelivered.
func On[E proto.Message](r *Router, h func(ctx context.Context, ev E, d Delivery) error) {
	var zero E
	mt := zero.ProtoReflect().Type()
	name := string(mt.Descriptor().FullName())
	r.Handle(name, func(ctx context.Context, d Delivery) error {
		ev := mt.New().Interface().(E)
		if err := proto.Unmarshal(d.Data, ev); err != nil {
			return fault.Invalid("decode %s: %w", name, err)
		}
		if v, ok := any(ev).(Validator); ok {
			if err := v.Validate(); err != nil {
				return fault.Invalid("validate %s: %w", name, err)
			}
		}
		return h(ctx, ev, d)
	})
}

// route names the event d carries and returns its handler. A delivery the
// consumer cannot use gets a handler that returns the reason as a
// fault.ErrInvalid, so it is dead-lettered; its event is then "" unless the
// type was consistent and only the handler was missing.
func (r *Router) route(d Delivery) (string, HandlerFunc) {
	want, declared := EventOn(d.Subject)
	if !declared {
		for _, se := range r.bySubject {
			if subject.Matches(se.pattern, d.Subject) {
				want, declared = se.event, true
				break
			}
		}
	}
	event, err := typeOf(d, want, declared)
	if err != nil {
		return "", reject(err)
	}
	if err := TenantMismatch(d.Subject, event, d.Data); err != nil {
		return "", reject(err)
	}
	if h := r.handlers[event]; h != nil {
		return event, h
	}
	return event, reject(noHandler(d, event))
}

// ConsumeOptions tune a subscription.
type ConsumeOptions struct {
	// Concurrency is how many deliveries are handled at once (default 1,
	// which keeps per-consumer order).
	Concurrency int
	// RetryDelays are the redelivery delays after the 1st, 2nd, ... failed
	// delivery; the last repeats (default 1s, 2s, 5s, 10s, 30s).
	RetryDelays []time.Duration
	// FastAck acknowledges without waiting for the server's confirmation.
	// It multiplies throughput; the price is that an ack lost in a crash or
	// a reconnect redelivers a handled message, which idempotent handlers
	// absorb. Off by default.
	FastAck bool
}

var defaultRetryDelays = []time.Duration{time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second}

// RetryDelay returns the redelivery delay after delivery number n failed.
func (o ConsumeOptions) RetryDelay(n uint64) time.Duration {
	ds := o.RetryDelays
	if len(ds) == 0 {
		ds = defaultRetryDelays
	}
	if n == 0 {
		n = 1
	}
	if n > uint64(len(ds)) {
		return ds[len(ds)-1]
	}
	return ds[n-1]
}

// Subscription is a running consumer; Drain stops it gracefully.
type Subscription struct {
	cc      jetstream.ConsumeContext
	fwd     *Subscription // forwards exhausted deliveries to the dead letters
	queue   chan jetstream.Msg
	workers sync.WaitGroup
	once    sync.Once
	// stop ends every enqueue blocked on a full queue; mu keeps the queue
	// from being closed under a sender: nats.go may report the consume
	// context closed (the connection died) while a callback still waits to
	// hand over a message.
	stop   chan struct{}
	mu     sync.RWMutex
	closed bool
}

func newSubscription(buffer int) *Subscription {
	return &Subscription{queue: make(chan jetstream.Msg, buffer), stop: make(chan struct{})}
}

// enqueue hands m to the workers; once they are stopping, m is dropped
// unacknowledged, so the server delivers it again after its ack wait.
func (s *Subscription) enqueue(m jetstream.Msg) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return
	}
	select {
	case s.queue <- m:
	case <-s.stop:
	}
}

// Consume ensures the durable consumer spec and starts handling its
// deliveries with router on opts.Concurrency workers. Several replicas
// consuming the same durable share the work. It also forwards deliveries
// the server gave up on (see forwardExhausted) when the ADVISORIES stream
// exists.
func (c *Conn) Consume(ctx context.Context, spec Consumer, router *Router, opts ConsumeOptions) (*Subscription, error) {
	return c.consume(ctx, spec, router, opts, true)
}

func (c *Conn) consume(ctx context.Context, spec Consumer, router *Router, opts ConsumeOptions, forward bool) (*Subscription, error) {
	cons, err := c.EnsureConsumer(ctx, spec)
	if err != nil {
		return nil, err
	}
	spec = spec.withDefaults()
	if opts.Concurrency <= 0 {
		opts.Concurrency = 1
	}
	s := newSubscription(0)
	w := &worker{c: c, spec: spec, router: router, opts: opts}
	// Handlers run detached from the caller's ctx so a shutdown lets
	// in-flight work finish; Drain bounds the wait.
	hctx := context.WithoutCancel(ctx)
	for range opts.Concurrency {
		s.workers.Add(1)
		go func() {
			defer s.workers.Done()
			for m := range s.queue {
				w.handle(hctx, m)
			}
		}()
	}
	if err := c.pull(ctx, s, cons, spec, max(64, 4*opts.Concurrency), forward); err != nil {
		return nil, err
	}
	return s, nil
}

// pull starts feeding s from cons (up to pull messages buffered by the
// client) and, when forward is set, forwarding the deliveries the server
// gives up on to the dead letters. On failure s is stopped.
func (c *Conn) pull(ctx context.Context, s *Subscription, cons jetstream.Consumer, spec Consumer, pull int, forward bool) error {
	cc, err := cons.Consume(s.enqueue,
		jetstream.PullMaxMessages(pull),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			c.log.Warn("consume error", "consumer", spec.Durable, "err", err)
		}))
	if err != nil {
		s.stopWorkers()
		return fmt.Errorf("consume %s: %w", spec.Durable, err)
	}
	s.cc = cc
	if !forward {
		return nil
	}
	s.fwd, err = c.forwardExhausted(ctx, spec)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		c.log.Warn("deliveries the server gives up on will not be dead-lettered: stream missing; run shizu provision",
			"consumer", spec.Durable, "stream", AdvisoryStream)
	} else if err != nil {
		_ = s.Drain(ctx)
		return fmt.Errorf("consume %s: %w", spec.Durable, err)
	}
	return nil
}

func (s *Subscription) stopWorkers() {
	s.once.Do(func() {
		close(s.stop) // a blocked enqueue lets go of the read lock
		s.mu.Lock()
		s.closed = true
		close(s.queue)
		s.mu.Unlock()
	})
	s.workers.Wait()
}

// Drain stops pulling, lets buffered and in-flight deliveries finish and
// be acknowledged, and returns when all are done or ctx ends.
func (s *Subscription) Drain(ctx context.Context) error {
	var fwdErr error
	if s.fwd != nil {
		fwdErr = s.fwd.Drain(ctx)
	}
	s.cc.Drain()
	done := make(chan struct{})
	go func() {
		<-s.cc.Closed() // no more callbacks: safe to close the queue
		s.stopWorkers()
		close(done)
	}()
	select {
	case <-done:
		return fwdErr
	case <-ctx.Done():
		s.cc.Stop()
		return fmt.Errorf("drain: %w", ctx.Err())
	}
}

type worker struct {
	c      *Conn
	spec   Consumer
	router *Router
	opts   ConsumeOptions
	// unusable is BatchOptions.Unusable.
	unusable func(ctx context.Context, d Delivery, reason error)
}

func (w *worker) handle(ctx context.Context, m jetstream.Msg) {
	md, err := m.Metadata()
	if err != nil {
		w.c.log.Error("delivery without metadata", "consumer", w.spec.Durable, "err", err)
		_ = m.Nak()
		return
	}
	d := Delivery{
		Subject:   m.Subject(),
		Event:     m.Headers().Get(HeaderEvent),
		MsgID:     m.Headers().Get(HeaderMsgID),
		Header:    m.Headers(),
		Data:      m.Data(),
		Delivered: md.NumDelivered,
		StreamSeq: md.Sequence.Stream,
	}
	event, h := w.router.route(d)
	if event == "" {
		event = unusableEvent // a bounded metric label, not the header's claim
	}
	d.Event = event
	parent := w.c.prop.Extract(ctx, telemetry.HeaderCarrier(m.Headers()))
	ctx, span := w.c.tracer.Start(parent, "process "+event,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithLinks(trace.LinkFromContext(parent)),
		trace.WithAttributes(
			attribute.String("messaging.system", "nats"),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.destination.name", d.Subject),
			attribute.String("messaging.consumer.group.name", w.spec.Durable),
			attribute.String("messaging.message.id", d.MsgID),
			attribute.Int64("messaging.nats.delivered", int64(d.Delivered))))
	defer span.End()

	start := time.Now()
	herr := h(ctx, d)
	w.c.metrics.handle.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(attrConsumer.String(w.spec.Durable), attrEvent.String(event)))
	switch {
	case herr == nil:
		w.count(ctx, outcomeAck, event)
		w.ack(ctx, m)
	case fault.IsInvalid(herr):
		span.SetStatus(codes.Error, herr.Error())
		w.deadLetter(ctx, m, d, herr.Error())
	case int(d.Delivered) >= w.spec.MaxDeliver:
		span.SetStatus(codes.Error, herr.Error())
		w.deadLetter(ctx, m, d, fmt.Sprintf("max deliveries (%d) reached; last error: %v", w.spec.MaxDeliver, herr))
	default:
		span.RecordError(herr)
		delay := w.opts.RetryDelay(d.Delivered)
		w.c.log.WarnContext(ctx, "handler failed; redelivering", "consumer", w.spec.Durable, "event", event,
			"msg_id", d.MsgID, "delivered", d.Delivered, "in", delay, "err", herr)
		w.count(ctx, outcomeRetry, event)
		if err := m.NakWithDelay(delay); err != nil {
			w.c.log.ErrorContext(ctx, "nak failed; the server redelivers after ack wait", "consumer", w.spec.Durable, "err", err)
		}
	}
}

func (w *worker) ack(ctx context.Context, m jetstream.Msg) {
	if w.opts.FastAck {
		if err := m.Ack(); err != nil {
			w.c.log.ErrorContext(ctx, "ack failed; the message will be redelivered", "consumer", w.spec.Durable, "err", err)
		}
		return
	}
	// DoubleAck waits for the server's confirmation, so a crash right after
	// cannot leave the message both handled and due for redelivery unseen.
	if err := m.DoubleAck(ctx); err != nil {
		w.c.log.ErrorContext(ctx, "ack failed; the message will be redelivered", "consumer", w.spec.Durable, "err", err)
	}
}

func (w *worker) count(ctx context.Context, outcome, event string) {
	w.c.metrics.consumed.Add(ctx, 1, metric.WithAttributes(
		attrConsumer.String(w.spec.Durable), attrOutcome.String(outcome), attrEvent.String(event)))
}
