package app_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/app"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// env is testkit's platform (one real nats-server with the topology's
// users and streams, one real redis-server), a capacity store on it and
// the outcomes the scheduler publishes.
type env struct {
	t testing.TB
	*testkit.Deployment
	store *capacity.Store
	seen  *outcomes
}

func newEnv(t testing.TB, opts ...testkit.PlatformOption) *env {
	t.Helper()
	d := testkit.Platform(t, opts...)
	e := &env{t: t, Deployment: d, store: d.Capacity(t)}
	e.seen = e.watch()
	return e
}

// connect is a bus connection as the scheduler, closed at cleanup.
func (e *env) connect(t testing.TB) *bus.Conn {
	t.Helper()
	conn, err := bus.Connect(t.Context(), e.BusConfig(topology.Scheduler), bus.Instruments{})
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

func testConfig() app.Config {
	cfg := app.DefaultConfig()
	cfg.PendingRetry = 20 * time.Millisecond
	cfg.SnapshotMaxAge = 50 * time.Millisecond
	return cfg
}

// replica starts one scheduler replica with its own NATS user and Redis
// connection; it stops at the end of the test.
func (e *env) replica(cfg app.Config, now func() time.Time) {
	e.t.Helper()
	e.replicaWith(cfg, now, nil)
}

// replicaWith is replica with setup run on the scheduler before it starts
// (to install a test hook).
func (e *env) replicaWith(cfg app.Config, now func() time.Time, setup func(*app.Scheduler)) {
	t := e.t
	t.Helper()
	conn := e.connect(t)
	s, err := app.New(cfg, app.Deps{Bus: conn, Store: e.Capacity(t), Redis: e.Redis.Client(t), Now: now,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if setup != nil {
		setup(s)
	}
	svc, _ := topology.ServiceNamed(topology.Scheduler)
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	parts, err := s.Start(ctx, svc.Consumers...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		stopCtx, stop := context.WithTimeout(context.WithoutCancel(t.Context()), 10*time.Second)
		defer stop()
		for i := len(parts) - 1; i >= 0; i-- {
			_ = parts[i].Stop(stopCtx)
		}
		_ = conn.Close(stopCtx)
	})
}

// gpuNode is a ready on-demand node of n H100s in one NVLink domain.
func gpuNode(id string, n int, market capacity.Market) capacity.Node {
	node := capacity.Node{ID: id, Zone: "zone-a", Market: market, PricePerGPUHourMicros: 2_000_000, Currency: "USD",
		CPUMilli: 256_000, MemoryMiB: 2 << 20}
	var dom []int
	for i := range n {
		node.GPUs = append(node.GPUs, capacity.GPU{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", id, i), Model: "H100-SXM5-80GB",
			VRAMMiB: 80 * 1024, MIGCapable: true})
		dom = append(dom, i)
	}
	if n > 1 {
		node.NVLinkDomains = [][]int{dom}
	}
	return node
}

func (e *env) register(nodes ...capacity.Node) {
	for _, n := range nodes {
		if _, err := e.store.Register(e.t.Context(), n); err != nil {
			e.t.Fatal(err)
		}
	}
}

func spec(gpus int32, milli int32, vram int64, plan shizuv1.Plan) *shizuv1.RentalSpec {
	s := &shizuv1.RentalSpec{GpuCount: gpus, MilliGpu: milli, VramMib: vram, Plan: plan}
	if gpus > 1 {
		s.Interconnect = shizuv1.Interconnect_INTERCONNECT_NVLINK
	}
	return s
}

func requested(id, tenant string, sp *shizuv1.RentalSpec, at time.Time) *shizuv1.RentalRequested {
	return &shizuv1.RentalRequested{
		Meta:     &shizuv1.EventMeta{EventId: "req:" + id, OccurredAt: timestamppb.New(at), Source: "test", CorrelationId: id},
		RentalId: id, TenantId: tenant, Spec: sp,
	}
}

// publish sends requests as the admin (standing in for the API),
// asynchronously.
func (e *env) publish(evs ...proto.Message) {
	e.t.Helper()
	b := e.Admin.NewBatch()
	for _, ev := range evs {
		var subj string
		var err error
		switch x := ev.(type) {
		case *shizuv1.RentalRequested:
			subj, err = subject.Format(subject.RentalRequested, x.GetTenantId())
		case *shizuv1.RentalCancelRequested:
			subj, err = subject.Format(subject.RentalCancelRequested, x.GetTenantId())
		case *shizuv1.RentalStopped:
			subj, err = subject.Format(subject.RentalStopped, x.GetTenantId())
		case *shizuv1.RentalMigrating:
			subj, err = subject.Format(subject.RentalMigrating, x.GetTenantId())
		case *shizuv1.NodeHealthChanged:
			subj, err = subject.Format(subject.NodeHealth, x.GetNodeId())
		default:
			e.t.Fatalf("cannot publish %T", ev)
		}
		if err != nil {
			e.t.Fatal(err)
		}
		if err := b.Publish(e.t.Context(), subj, ev); err != nil {
			e.t.Fatal(err)
		}
	}
	if _, err := b.Wait(e.t.Context()); err != nil {
		e.t.Fatal(err)
	}
}

// outcomes collects every scheduled, pending, rejected and preempted event
// of the RENTALS stream and every start command, by rental.
type outcomes struct {
	mu        sync.Mutex
	scheduled map[string][]*shizuv1.RentalScheduled
	pending   map[string][]*shizuv1.RentalPending
	rejected  map[string][]*shizuv1.RentalRejected
	preempted map[string][]*shizuv1.RentalPreempted
	starts    map[string]int
	stops     map[string]int
	shortages int
}

func (e *env) watch() *outcomes {
	o := &outcomes{scheduled: map[string][]*shizuv1.RentalScheduled{}, pending: map[string][]*shizuv1.RentalPending{},
		rejected: map[string][]*shizuv1.RentalRejected{}, preempted: map[string][]*shizuv1.RentalPreempted{}, starts: map[string]int{}, stops: map[string]int{}}
	js := e.Admin.JetStream()
	for _, sc := range []struct {
		stream  string
		filters []string
	}{
		{topology.StreamRentals, []string{subject.RentalScheduledAll, subject.RentalPendingAll, subject.RentalRejectedAll, subject.RentalPreemptedAll}},
		{topology.StreamAgentCmds, []string{subject.AgentCmdAll}},
		{topology.StreamScaling, []string{subject.CapacityShortage}},
	} {
		cons, err := js.OrderedConsumer(e.t.Context(), sc.stream, jetstream.OrderedConsumerConfig{FilterSubjects: sc.filters})
		if err != nil {
			e.t.Fatal(err)
		}
		cc, err := cons.Consume(func(m jetstream.Msg) { o.add(e.t, m) })
		if err != nil {
			e.t.Fatal(err)
		}
		e.t.Cleanup(cc.Stop)
	}
	return o
}

func (o *outcomes) add(t testing.TB, m jetstream.Msg) {
	o.mu.Lock()
	defer o.mu.Unlock()
	parts := strings.Split(m.Subject(), ".")
	kind := parts[len(parts)-1]
	var err error
	switch {
	case parts[0] == "agent" && kind == "start":
		ev := &shizuv1.StartRental{}
		err = proto.Unmarshal(m.Data(), ev)
		o.starts[ev.GetScheduled().GetRentalId()]++
	case parts[0] == "agent" && kind == "stop":
		ev := &shizuv1.StopRental{}
		err = proto.Unmarshal(m.Data(), ev)
		o.stops[ev.GetRentalId()]++
	case parts[0] == "scale":
		o.shortages++
	case kind == "scheduled":
		ev := &shizuv1.RentalScheduled{}
		if err = proto.Unmarshal(m.Data(), ev); err == nil {
			if verr := ev.Validate(); verr != nil {
				t.Errorf("invalid RentalScheduled: %v", verr)
			}
		}
		o.scheduled[ev.GetRentalId()] = append(o.scheduled[ev.GetRentalId()], ev)
	case kind == "pending":
		ev := &shizuv1.RentalPending{}
		err = proto.Unmarshal(m.Data(), ev)
		o.pending[ev.GetRentalId()] = append(o.pending[ev.GetRentalId()], ev)
	case kind == "rejected":
		ev := &shizuv1.RentalRejected{}
		err = proto.Unmarshal(m.Data(), ev)
		o.rejected[ev.GetRentalId()] = append(o.rejected[ev.GetRentalId()], ev)
	case kind == "preempted":
		ev := &shizuv1.RentalPreempted{}
		err = proto.Unmarshal(m.Data(), ev)
		o.preempted[ev.GetRentalId()] = append(o.preempted[ev.GetRentalId()], ev)
	}
	if err != nil {
		t.Errorf("decode %s: %v", m.Subject(), err)
	}
}

func (o *outcomes) waitFor(t testing.TB, timeout time.Duration, cond func(o *outcomes) error) {
	t.Helper()
	testkit.Eventually(t, timeout, func() error {
		o.mu.Lock()
		defer o.mu.Unlock()
		return cond(o)
	})
}

// snapshotScheduled copies the scheduled events seen for a rental.
func (o *outcomes) snapshotScheduled(id string) []*shizuv1.RentalScheduled {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]*shizuv1.RentalScheduled(nil), o.scheduled[id]...)
}
