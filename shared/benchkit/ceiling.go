package benchkit

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/capacity"
)

// CapacityNode is a benchmark fleet's node: 8 H100 80 GB in one NVLink
// domain, 256 cores, 2 TiB of memory, on-demand in zone-a.
func CapacityNode(id string) capacity.Node {
	n := capacity.Node{ID: id, Zone: "zone-a", Market: capacity.MarketOnDemand, PricePerGPUHourMicros: 2_000_000, Currency: "USD",
		CPUMilli: 256_000, MemoryMiB: 2 << 20}
	var dom []int
	for i := range 8 {
		n.GPUs = append(n.GPUs, capacity.GPU{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", id, i), Model: "H100-SXM5-80GB",
			VRAMMiB: 80 * 1024, MIGCapable: true})
		dom = append(dom, i)
	}
	n.NVLinkDomains = [][]int{dom}
	return n
}

// ReserveCeiling is the capacity store's reserve rate (reserves/s) on the
// env's Redis with clients at once: n quarter-GPU reserves on 250 nodes x
// 8 GPUs under a key prefix of its own.
func (e *Env) ReserveCeiling(ctx context.Context, clients, n int) (float64, error) {
	s, err := capacity.New(e.Redis, capacity.WithPrefix("ceiling"))
	if err != nil {
		return 0, err
	}
	for i := range 250 {
		if _, err := s.Register(ctx, CapacityNode(fmt.Sprintf("c%03d", i))); err != nil {
			return 0, err
		}
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				slot := i / 250 // node i%250, GPU (i/250)%8
				p := capacity.Placement{RentalID: "c" + strconv.Itoa(i), NodeID: fmt.Sprintf("c%03d", i%250), Epoch: 1, Tenant: "bench",
					CPUMilli: 1000, MemoryMiB: 1024, GPUs: []capacity.GPUShare{{Index: slot % 8, Milli: 250, VRAMMiB: 8 * 1024}}}
				if _, err := s.Reserve(ctx, p); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// PublishCeiling is bare JetStream async publishing (publishes/s) of n
// 200-byte messages to a stream of its own, every ack awaited.
func (e *Env) PublishCeiling(ctx context.Context, n int) (float64, error) {
	js := e.Admin.JetStream()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH_CEILING", Subjects: []string{"ceiling.>"},
		Storage: jetstream.FileStorage}); err != nil {
		return 0, err
	}
	payload := make([]byte, 200)
	start := time.Now()
	futs := make([]jetstream.PubAckFuture, 0, n)
	for i := range n {
		// A loaded machine acks slowly: a publish waits for room among the
		// outstanding ones (the client's limit) rather than failing after
		// the default 200 ms.
		f, err := js.PublishAsync("ceiling.x", payload, jetstream.WithMsgID("c"+strconv.Itoa(i)), jetstream.WithStallWait(time.Minute))
		if err != nil {
			return 0, err
		}
		futs = append(futs, f)
	}
	for _, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return 0, err
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// ConsumeCeiling consumes the first n messages of stream with a bare
// JetStream pull consumer that only decodes (as a handler would) and acks:
// the most any consumer of that stream can ingest here (messages/s). It
// also returns the CPU seconds this process spent doing it.
func (e *Env) ConsumeCeiling(ctx context.Context, stream string, n int) (rate, cpu float64, err error) {
	cons, err := e.Admin.JetStream().CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Durable: "bench-raw", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 10_000})
	if err != nil {
		return 0, 0, err
	}
	done := make(chan struct{})
	count := 0
	cpu0, start := ProcessCPU(), time.Now()
	cc, err := cons.Consume(func(m jetstream.Msg) {
		var ev shizuv1.RentalStarted
		_ = proto.Unmarshal(m.Data(), &ev)
		_ = m.Ack()
		count++
		if count == n {
			close(done)
		}
	}, jetstream.PullMaxMessages(1000))
	if err != nil {
		return 0, 0, err
	}
	defer cc.Stop()
	select {
	case <-done:
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	case <-time.After(5 * time.Minute):
		return 0, 0, errors.New("bare consumer did not finish within 5 minutes")
	}
	return float64(n) / time.Since(start).Seconds(), ProcessCPU() - cpu0, nil
}

// ReceiptProbe measures one bare JetStream publish (acked) to its receipt
// by a core subscriber on the same server: the floor of any hop through
// the bus. The subject must be one a stream captures.
type ReceiptProbe struct {
	env     *Env
	subject string
	got     chan *nats.Msg
	sub     *nats.Subscription
}

// NewReceiptProbe subscribes to subject; Close unsubscribes.
func (e *Env) NewReceiptProbe(subject string) (*ReceiptProbe, error) {
	p := &ReceiptProbe{env: e, subject: subject, got: make(chan *nats.Msg, 64)}
	var err error
	if p.sub, err = e.Admin.NATS().ChanSubscribe(subject, p.got); err != nil {
		return nil, err
	}
	if err := e.Admin.NATS().Flush(); err != nil {
		_ = p.sub.Unsubscribe()
		return nil, err
	}
	return p, nil
}

// Measure publishes the i-th probe event and waits for its receipt.
func (p *ReceiptProbe) Measure(ctx context.Context, i int) (time.Duration, error) {
	t := time.Now()
	ev := &shizuv1.ScalingDecided{Meta: shizuv1.NewMeta("bench-ceiling-"+strconv.Itoa(i), Source, "", "", t),
		PoolId: "bench-ceiling", FromReplicas: 1, ToReplicas: 2, Rule: "bench", Metric: "bench"}
	if _, err := p.env.Admin.Publish(ctx, p.subject, ev); err != nil {
		return 0, err
	}
	select {
	case <-p.got:
		return time.Since(t), nil
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(10 * time.Second):
		return 0, fmt.Errorf("probe %d not received within 10s of its publish", i)
	}
}

// Close unsubscribes.
func (p *ReceiptProbe) Close() { _ = p.sub.Unsubscribe() }
