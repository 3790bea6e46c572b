package app_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/failover/app"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/service"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// env is a Platform (the topology's users, streams and heartbeat bucket on
// a real NATS, and a real Redis) with a capacity store and a JetStream view
// to read back what was published.
type env struct {
	*testkit.Deployment
	store *capacity.Store
	js    jetstream.JetStream
}

// newEnv starts a Platform whose heartbeat bucket has ttl.
func newEnv(t testing.TB, ttl time.Duration, opts ...testkit.PlatformOption) *env {
	t.Helper()
	d := testkit.Platform(t, append([]testkit.PlatformOption{testkit.WithHeartbeats(ttl)}, opts...)...)
	_, js := d.NATS.JetStream(t, nats.UserInfo(topology.Admin, testkit.Password(topology.Admin)))
	return &env{Deployment: d, store: d.Capacity(t), js: js}
}

// replica is one failover replica running in the test process.
type replica struct {
	f     *app.Failover
	parts []service.Part
}

func testConfig() app.Config {
	cfg := app.DefaultConfig()
	cfg.Tick = 20 * time.Millisecond
	cfg.Detect.Confirm = 200 * time.Millisecond
	cfg.Detect.DisconnectGrace = 300 * time.Millisecond
	cfg.Sweep = time.Hour
	cfg.StopGrace = time.Second
	return cfg
}

func (e *env) startReplica(t testing.TB, cfg app.Config, name string, m *app.Metrics) *replica {
	t.Helper()
	busCfg := e.BusConfig(topology.Failover)
	busCfg.Name = name
	conn := e.ConnectWith(t, busCfg, bus.Instruments{}) // closed after the replica stopped (cleanups run last first)
	hb, err := conn.OpenHeartbeats(t.Context(), topology.HeartbeatBucket, e.Heartbeats.TTL())
	if err != nil {
		t.Fatal(err)
	}
	rdb := e.Redis.Client(t)
	store := e.Capacity(t)
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})).With("replica", name)
	f, err := app.New(cfg, app.Deps{Bus: conn, Heartbeats: hb, Store: store, Redis: rdb, Log: log, Metrics: m, Source: name})
	if err != nil {
		t.Fatal(err)
	}
	svc, _ := topology.ServiceNamed(topology.Failover)
	// The replica outlives t.Context(), which ends before the cleanup that
	// stops it gracefully.
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	parts, err := f.Start(ctx, svc.Consumers)
	r := &replica{f: f, parts: parts}
	t.Cleanup(func() {
		stopCtx, stop := context.WithTimeout(context.WithoutCancel(t.Context()), 10*time.Second)
		defer stop()
		for i := len(r.parts) - 1; i >= 0; i-- {
			_ = r.parts[i].Stop(stopCtx)
		}
		cancel()
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// node registers a node of gpus H100s and returns its epoch.
func (e *env) node(t testing.TB, id string, gpus int) uint64 {
	t.Helper()
	n := capacity.Node{ID: id, Zone: "z1", Market: capacity.MarketOnDemand, PricePerGPUHourMicros: 2_000_000, Currency: "USD",
		CPUMilli: 192_000, MemoryMiB: 2 << 20}
	for i := range gpus {
		n.GPUs = append(n.GPUs, capacity.GPU{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", id, i), Model: "H100-SXM5-80GB", VRAMMiB: 81920})
	}
	epoch, err := e.store.Register(t.Context(), n)
	if err != nil {
		t.Fatal(err)
	}
	return epoch
}

func spec(plan shizuv1.Plan, gpus int32, milli int64) *shizuv1.RentalSpec {
	s := &shizuv1.RentalSpec{GpuCount: gpus, MilliGpu: int32(milli), Plan: plan, CheckpointUri: "s3://ckpt/run/"}
	if milli < 1000 {
		s.VramMib = 81920 * milli / 1000
	}
	return s
}

// rent reserves a rental on the given GPUs of node and publishes its
// RentalScheduled (attempt 1), as the scheduler does.
func (e *env) rent(t testing.TB, rental, node string, epoch uint64, plan shizuv1.Plan, gpus ...int) {
	t.Helper()
	e.rentShare(t, rental, node, epoch, plan, 1000, gpus...)
}

// rentShare is rent with milli of each GPU.
func (e *env) rentShare(t testing.TB, rental, node string, epoch uint64, plan shizuv1.Plan, milli int64, gpus ...int) {
	t.Helper()
	p := capacity.Placement{RentalID: rental, NodeID: node, Epoch: epoch, Tenant: "acme", CPUMilli: 1000, MemoryMiB: 1024}
	var assigned []*shizuv1.GpuAssignment
	for _, g := range gpus {
		p.GPUs = append(p.GPUs, capacity.GPUShare{Index: g, Milli: milli, VRAMMiB: 81920 * milli / 1000})
		assigned = append(assigned, &shizuv1.GpuAssignment{GpuIndex: int32(g), GpuUuid: fmt.Sprintf("GPU-%s-%d", node, g),
			MilliGpu: int32(milli), VramMib: 81920 * milli / 1000})
	}
	if _, err := e.store.Reserve(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	ev := &shizuv1.RentalScheduled{
		Meta:     meta(fmt.Sprintf("rental:%s:scheduled:1", rental), rental),
		RentalId: rental, TenantId: "acme", NodeId: node, NodeEpoch: int64(epoch), Gpus: assigned,
		CpuMilli: 1000, MemoryMib: 1024, Spec: spec(plan, int32(len(gpus)), milli), GpuModel: "H100-SXM5-80GB", Zone: "z1", Attempt: 1,
	}
	e.publishValid(t, subject.RentalScheduled, "acme", ev)
}

func meta(id, correlation string) *shizuv1.EventMeta {
	return &shizuv1.EventMeta{EventId: id, OccurredAt: timestamppb.Now(), Source: "test", CorrelationId: correlation}
}

func (e *env) publish(t testing.TB, form, token string, ev proto.Message) {
	t.Helper()
	subj, err := subject.Format(form, token)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Admin.Publish(t.Context(), subj, ev); err != nil {
		t.Fatal(err)
	}
}

// publishValid publishes an event that must pass its own validation.
func (e *env) publishValid(t testing.TB, form, token string, ev interface {
	proto.Message
	Validate() error
}) {
	t.Helper()
	if err := ev.Validate(); err != nil {
		t.Fatalf("test event is invalid: %v", err)
	}
	e.publish(t, form, token, ev)
}

// beat beats for node until the returned stop is called (a fake agent).
func (e *env) beat(t testing.TB, node string, epoch uint64) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	payload := []byte(strconv.FormatUint(epoch, 10))
	if _, err := e.Heartbeats.Beat(ctx, node, payload); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(done)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				_, _ = e.Heartbeats.Beat(ctx, node, payload)
			}
		}
	}()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	t.Cleanup(stop)
	return stop
}

// events reads every event of type E stored under filter so far.
func events[E proto.Message](t testing.TB, e *env, stream, filter string) []E {
	t.Helper()
	c, err := e.js.OrderedConsumer(t.Context(), stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		t.Fatal(err)
	}
	var out []E
	for {
		batch, err := c.Fetch(100, jetstream.FetchMaxWait(300*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			var zero E
			ev := zero.ProtoReflect().New().Interface().(E)
			if err := proto.Unmarshal(m.Data(), ev); err != nil {
				t.Fatal(err)
			}
			out = append(out, ev)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			t.Fatal(err)
		}
		if n == 0 {
			return out
		}
	}
}

// eventually polls cond for up to 20 s.
func eventually(t testing.TB, cond func() error) {
	t.Helper()
	testkit.Eventually(t, 20*time.Second, cond)
}
