package app_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	goruntime "runtime"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/node-agent/app"
	"github.com/shizu-gpu/shizu/services/node-agent/runtime"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/service"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// env is one real NATS (with the topology's users, streams and heartbeat
// bucket) and one real Redis, shared by the agents of a test.
type env struct {
	*testkit.Deployment
	store *capacity.Store
}

func newEnv(t testing.TB) *env {
	t.Helper()
	e := newBareEnv(t)
	e.Provision(t)
	return e
}

// newBareEnv is an env whose streams are not provisioned yet
// (Deployment.Provision creates them).
func newBareEnv(t testing.TB) *env {
	t.Helper()
	d := testkit.Platform(t, testkit.WithoutStreams(), testkit.WithHeartbeats(time.Second))
	return &env{Deployment: d, store: d.Capacity(t)}
}

func (e *env) config(t testing.TB, node, profile, stateDir string) app.Config {
	cfg := app.DefaultConfig()
	cfg.Service = e.ServiceConfig(t, topology.NodeAgent)
	cfg.Service.HTTPAddr = freeAddr(t)
	cfg.Service.LogLevel = "debug"
	cfg.Service.ShutdownTimeout = 10 * time.Second
	cfg.NodeID, cfg.Simulate, cfg.StateDir = node, profile, stateDir
	cfg.HeartbeatInterval, cfg.HeartbeatTTL = 250*time.Millisecond, time.Second
	cfg.TelemetryInterval, cfg.LeaseInterval = 200*time.Millisecond, 200*time.Millisecond
	cfg.StopGrace = 3 * time.Second
	return cfg
}

// running is an agent running in the test.
type running struct {
	cancel context.CancelFunc
	done   chan error
}

func (e *env) start(t testing.TB, cfg app.Config) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	r := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- app.Run(ctx, cfg) }()
	t.Cleanup(func() { r.stop(t) })
	testkit.Eventually(t, 20*time.Second, func() error {
		select {
		case err := <-r.done:
			t.Fatalf("agent ended while starting: %v", err)
		default:
		}
		return service.Healthcheck(t.Context(), cfg.Service.HTTPAddr)
	})
	return r
}

func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func (r *running) stop(t testing.TB) {
	t.Helper()
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("agent stopped with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("agent did not stop")
	}
}

// killWorkloads kills whatever the state dir's workloads still run.
func killWorkloads(t testing.TB, dir string) {
	t.Cleanup(func() {
		p, err := runtime.NewProcess(dir)
		if err != nil {
			return
		}
		for _, w := range p.List() {
			_ = syscall.Kill(-w.PID, syscall.SIGKILL)
		}
		_ = p.Close()
	})
}

// last returns the newest event on subj of stream, or false.
func last[E proto.Message](t testing.TB, e *env, stream, subj string) (E, bool) {
	t.Helper()
	var ev E
	s, err := e.Admin.JetStream().Stream(t.Context(), stream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(t.Context(), subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return ev, false
	}
	if err != nil {
		t.Fatal(err)
	}
	ev = ev.ProtoReflect().New().Interface().(E)
	if err := proto.Unmarshal(m.Data, ev); err != nil {
		t.Fatal(err)
	}
	return ev, true
}

// await polls until the newest event on subj satisfies ok.
func await[E proto.Message](t testing.TB, e *env, stream, subj string, ok func(E) error) E {
	t.Helper()
	var got E
	testkit.Eventually(t, 20*time.Second, func() error {
		ev, found := last[E](t, e, stream, subj)
		if !found {
			return fmt.Errorf("no event on %s yet", subj)
		}
		if err := ok(ev); err != nil {
			return fmt.Errorf("%s: %w", subj, err)
		}
		got = ev
		return nil
	})
	return got
}

// registered waits for the node's registration at epoch.
func (e *env) registered(t testing.TB, node string, epoch int64) *shizuv1.NodeRegistered {
	t.Helper()
	return await(t, e, topology.StreamNodes, "node."+node+".registered", func(ev *shizuv1.NodeRegistered) error {
		if ev.GetEpoch() != epoch {
			return fmt.Errorf("epoch %d, want %d", ev.GetEpoch(), epoch)
		}
		return nil
	})
}

// place reserves GPU 0 of node for a rental, as the scheduler would, and
// returns the start command for it.
func (e *env) place(t testing.TB, node string, epoch int64, rental string, milli int32, vram int64, command ...string) *shizuv1.StartRental {
	t.Helper()
	st, err := e.store.Node(t.Context(), node)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Reserve(t.Context(), capacity.Placement{RentalID: rental, NodeID: node, Epoch: uint64(epoch), Tenant: "acme",
		GPUs: []capacity.GPUShare{{Index: 0, Milli: int64(milli), VRAMMiB: vram}}}); err != nil {
		t.Fatal(err)
	}
	g := st.GPUs[0]
	now := time.Now()
	return &shizuv1.StartRental{
		Meta: shizuv1.NewMeta("cmd:start:"+rental+":1", "scheduler", "", rental, now),
		Scheduled: &shizuv1.RentalScheduled{
			Meta:     shizuv1.NewMeta("rental:"+rental+":scheduled:1", "scheduler", "", rental, now),
			RentalId: rental, TenantId: "acme", NodeId: node, NodeEpoch: epoch,
			Gpus:     []*shizuv1.GpuAssignment{{GpuIndex: 0, GpuUuid: g.UUID, MilliGpu: milli, VramMib: vram}},
			Spec:     &shizuv1.RentalSpec{GpuCount: 1, MilliGpu: milli, VramMib: vram, Plan: shizuv1.Plan_PLAN_ON_DEMAND, Command: command},
			GpuModel: g.Model, Zone: "local", Attempt: 1,
		},
	}
}

func (e *env) send(t testing.TB, node, verb string, cmd proto.Message) {
	t.Helper()
	if _, err := e.Admin.Publish(t.Context(), "agent."+node+".cmd."+verb, cmd); err != nil {
		t.Fatal(err)
	}
}

func stopCmd(node, rental string, reason shizuv1.ExitReason, grace time.Duration) *shizuv1.StopRental {
	return &shizuv1.StopRental{
		Meta:     shizuv1.NewMeta("cmd:stop:"+rental+":1", "scheduler", "", rental, time.Now()),
		RentalId: rental, TenantId: "acme", NodeId: node, Attempt: 1, Reason: reason, GracePeriod: durationpb.New(grace),
	}
}

// simulated is node's simulated host of profile, for a test to inject
// faults into (Config.Simulated).
func simulated(t testing.TB, profile, node string) *app.SimulatedHost {
	t.Helper()
	f, err := app.NewSimulatedHost(profile, node)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func nowTS() *timestamppb.Timestamp { return timestamppb.Now() }

// all returns every event on subj of stream, oldest first.
func all[E proto.Message](t testing.TB, e *env, stream, subj string) []E {
	t.Helper()
	oc, err := e.Admin.JetStream().OrderedConsumer(t.Context(), stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subj}})
	if err != nil {
		t.Fatal(err)
	}
	var out []E
	for {
		batch, err := oc.FetchNoWait(100)
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
		if n == 0 {
			return out
		}
	}
}

// liveHeap is the heap in use after a collection.
func liveHeap() uint64 {
	var m goruntime.MemStats
	goruntime.GC()
	goruntime.GC()
	goruntime.ReadMemStats(&m)
	return m.HeapAlloc
}
