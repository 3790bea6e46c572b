package app_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/autoscaler/app"
	"github.com/shizu-gpu/shizu/services/autoscaler/fleet"
	"github.com/shizu-gpu/shizu/services/autoscaler/policy"
	"github.com/shizu-gpu/shizu/services/autoscaler/provider"
	"github.com/shizu-gpu/shizu/services/autoscaler/provider/providertest"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// env is a running autoscaler on real NATS and Redis, with an admin
// connection that plays the tenant's gateway and the scheduler.
type env struct {
	admin *bus.Conn
	caps  *capacity.Store
	prov  *providertest.Memory
	seen  *recorder
	redis *testkit.Redis
	// stop ends the running autoscaler; restart starts it again (same
	// configuration, nothing kept in memory).
	stop    func()
	restart func()
}

// recorder keeps every message seen on the subjects it listens to.
type recorder struct {
	mu   sync.Mutex
	msgs map[string][]*nats.Msg // by subscribe pattern
}

func (r *recorder) listen(t testing.TB, nc *nats.Conn, pattern string) {
	t.Helper()
	sub, err := nc.Subscribe(pattern, func(m *nats.Msg) {
		r.mu.Lock()
		r.msgs[pattern] = append(r.msgs[pattern], m)
		r.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
}

func (r *recorder) get(pattern string) []*nats.Msg {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.msgs[pattern])
}

func decode[E proto.Message](t *testing.T, m *nats.Msg, ev E) E {
	t.Helper()
	if err := proto.Unmarshal(m.Data, ev); err != nil {
		t.Fatal(err)
	}
	return ev
}

func testPolicy() policy.File {
	return policy.File{
		Pools: []policy.Pool{{
			ID: "web", Tenant: "acme",
			Rental:      policy.RentalShape{GPUCount: 1, MilliGPU: 1000, Models: []string{"H100-SXM5-80GB"}},
			MinReplicas: 1, MaxReplicas: 8, MaxStepOut: 4, MaxStepIn: 4,
			Thresholds: []policy.Threshold{{Name: "busy", Metric: policy.ConcurrentPerReplica, ScaleOutAbove: 10, ScaleInBelow: 3, Step: 2}},
			StaleAfter: policy.Duration(time.Minute),
		}},
		Fleet: fleet.Config{
			InstanceTypes: []fleet.InstanceType{{Name: "p5.48xlarge", Profile: "h100x8", Model: "H100-SXM5-80GB", GPUs: 8,
				Zones: []string{"z1"}, PricePerGPUHourMicros: 2_490_000}},
			MaxNodes: 4, IdleAfter: fleet.Duration(300 * time.Millisecond), RegisterTimeout: fleet.Duration(time.Hour),
		},
	}
}

func start(t testing.TB, file policy.File) *env {
	t.Helper()
	return startWith(t, file, nil)
}

func startWith(t testing.TB, file policy.File, mutate func(*app.Config, *app.Deps)) *env {
	t.Helper()
	p := testkit.Platform(t)
	admin := p.Admin
	e := &env{admin: admin, caps: p.Capacity(t), prov: providertest.NewMemory(), seen: &recorder{msgs: map[string][]*nats.Msg{}}}
	for _, p := range []string{"scale.>", "rental.>", "agent.*.cmd.*"} {
		e.seen.listen(t, admin.NATS(), p)
	}
	if err := admin.NATS().Flush(); err != nil {
		t.Fatal(err)
	}

	cfg := app.DefaultConfig()
	cfg.Service = p.ServiceConfig(t, topology.Autoscaler)
	cfg.Tick = 50 * time.Millisecond
	deps := app.Deps{Provider: e.prov, Policy: &file}
	if mutate != nil {
		mutate(&cfg, &deps)
	}
	e.redis = p.Redis
	e.restart = func() {
		ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
		done := make(chan error, 1)
		go func() { done <- app.RunWith(ctx, cfg, deps) }()
		var once sync.Once
		e.stop = func() {
			once.Do(func() {
				cancel()
				select {
				case err := <-done:
					if err != nil && !errors.Is(err, context.Canceled) {
						t.Errorf("autoscaler stopped with %v", err)
					}
				case <-time.After(20 * time.Second):
					t.Error("autoscaler did not stop")
				}
			})
		}
	}
	e.restart()
	t.Cleanup(func() { e.stop() })
	return e
}

// sampleSeq numbers samples across the package's parallel tests.
var sampleSeq atomic.Int64

func (e *env) sample(t testing.TB, pool string, concurrent int64) {
	t.Helper()
	seq := sampleSeq.Add(1)
	ev := &shizuv1.TrafficSampled{
		Meta:   &shizuv1.EventMeta{EventId: fmt.Sprintf("sample-%s-%d-%d", pool, seq, time.Now().UnixNano()), OccurredAt: timestamppb.Now(), Source: "gateway"},
		PoolId: pool, ConcurrentRequests: concurrent, RequestsPerSecond: float64(concurrent) * 10,
		P99Latency: durationpb.New(40 * time.Millisecond), Window: durationpb.New(15 * time.Second),
	}
	if _, err := e.admin.Publish(t.Context(), "traffic."+pool+".sample", ev); err != nil {
		t.Fatal(err)
	}
}

// decisions returns the ScalingDecided events of pool so far.
func (e *env) decisions(t *testing.T, pool string) []*shizuv1.ScalingDecided {
	var out []*shizuv1.ScalingDecided
	for _, m := range e.seen.get("scale.>") {
		if m.Subject == "scale."+pool+".decided" {
			out = append(out, decode(t, m, &shizuv1.ScalingDecided{}))
		}
	}
	return out
}

func (e *env) rentalEvents(t *testing.T, verb string) []string {
	var ids []string
	for _, m := range e.seen.get("rental.>") {
		switch {
		case verb == "requested" && m.Subject == "rental.acme.requested":
			ev := decode(t, m, &shizuv1.RentalRequested{})
			if ev.GetSpec().GetLabels()[app.PoolLabel] != "web" || ev.GetSpec().GetPlan() != shizuv1.Plan_PLAN_ON_DEMAND {
				t.Errorf("pool rental without its pool label or plan: %v", ev)
			}
			ids = append(ids, ev.GetRentalId())
		case verb == "cancel_requested" && m.Subject == "rental.acme.cancel_requested":
			ids = append(ids, decode(t, m, &shizuv1.RentalCancelRequested{}).GetRentalId())
		}
	}
	return ids
}

func registerNode(t *testing.T, caps *capacity.Store, id string) uint64 {
	t.Helper()
	gpus := make([]capacity.GPU, 8)
	for i := range gpus {
		gpus[i] = capacity.GPU{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", id, i), Model: "H100-SXM5-80GB", VRAMMiB: 81920}
	}
	epoch, err := caps.Register(t.Context(), capacity.Node{ID: id, Zone: "z1", Market: capacity.MarketOnDemand,
		PricePerGPUHourMicros: 2_490_000, Currency: "USD", CPUMilli: 180_000, MemoryMiB: 1_900_000, GPUs: gpus})
	if err != nil {
		t.Fatal(err)
	}
	return epoch
}

func TestTrafficShortageAndQuietScaleThePoolAndTheFleet(t *testing.T) {
	t.Parallel()
	e := start(t, testPolicy())

	// A new pool is brought to its floor by the first tick.
	testkit.Eventually(t, 10*time.Second, func() error {
		if got := e.rentalEvents(t, "requested"); len(got) != 1 {
			return fmt.Errorf("%d rentals requested, want the min of 1", len(got))
		}
		return nil
	})
	if d := e.decisions(t, "web"); len(d) != 1 || d[0].GetRule() != policy.RuleMinReplicas || d[0].GetToReplicas() != 1 {
		t.Fatalf("first decision %v", d)
	}

	// Traffic above the threshold: more pool rentals and a decision that
	// says which rule and metric fired.
	e.sample(t, "web", 50)
	testkit.Eventually(t, 10*time.Second, func() error {
		if got := e.rentalEvents(t, "requested"); len(got) != 3 {
			return fmt.Errorf("%d rentals requested, want 3", len(got))
		}
		return nil
	})
	d := e.decisions(t, "web")
	out := d[len(d)-1]
	if out.GetFromReplicas() != 1 || out.GetToReplicas() != 3 || out.GetRule() != "threshold:busy" ||
		out.GetMetric() != string(policy.ConcurrentPerReplica) || out.GetObservedValue() != 50 || out.GetThreshold() != 10 || out.GetReason() == "" {
		t.Fatalf("scale-out decision %v", out)
	}
	if err := out.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := e.rentalEvents(t, "requested"); !slices.Equal(got, []string{"pool-web-1", "pool-web-2", "pool-web-3"}) {
		t.Fatalf("rentals %v", got)
	}

	// The scheduler cannot place two of them: the provider is asked for nodes.
	shortage := &shizuv1.CapacityShortage{
		Meta:      &shizuv1.EventMeta{EventId: "shortage-1", OccurredAt: timestamppb.Now(), Source: "scheduler"},
		Missing:   &shizuv1.ResourceVector{GpuCount: 8, Models: []string{"H100-SXM5-80GB"}},
		RentalIds: []string{"pool-web-2", "pool-web-3"},
	}
	if _, err := e.admin.Publish(t.Context(), "scale.fleet.shortage", shortage); err != nil {
		t.Fatal(err)
	}
	var nodes []string
	testkit.Eventually(t, 10*time.Second, func() error {
		for _, c := range e.prov.Calls() {
			if c.Op == "provision" {
				nodes = c.IDs
				return nil
			}
		}
		return fmt.Errorf("no provision call yet")
	})
	calls := e.prov.Calls()
	if c := calls[0]; c.InstanceType != "p5.48xlarge" || c.Market != provider.OnDemand || c.Zone != "z1" || c.N != 2 {
		t.Fatalf("provision call %+v", c)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		for _, m := range e.seen.get("scale.>") {
			if m.Subject == "scale.fleet.provision_requested" {
				ev := decode(t, m, &shizuv1.NodeProvisionRequested{})
				if ev.GetCount() != 2 || ev.GetMeta().GetCausationId() != "shortage-1" {
					return fmt.Errorf("provision event %v", ev)
				}
				return nil
			}
		}
		return fmt.Errorf("no provision event")
	})
	// The same shortage again (the scheduler repeats itself) provisions nothing more.
	shortage.Meta.EventId = "shortage-2"
	if _, err := e.admin.Publish(t.Context(), "scale.fleet.shortage", shortage); err != nil {
		t.Fatal(err)
	}

	// The agents register (as node-agents do); one takes a rental.
	busyNode, idleNode := nodes[0], nodes[1]
	epoch := registerNode(t, e.caps, busyNode)
	registerNode(t, e.caps, idleNode)
	if _, err := e.caps.Reserve(t.Context(), capacity.Placement{RentalID: "pool-web-2", NodeID: busyNode, Epoch: epoch, Tenant: "acme",
		GPUs: []capacity.GPUShare{{Index: 0, Milli: 1000, VRAMMiB: 81920}}}); err != nil {
		t.Fatal(err)
	}

	// Traffic falls: the pool scales in by cancelling its newest rentals.
	e.sample(t, "web", 0)
	testkit.Eventually(t, 10*time.Second, func() error {
		if got := e.rentalEvents(t, "cancel_requested"); !slices.Equal(got, []string{"pool-web-3", "pool-web-2"}) {
			return fmt.Errorf("cancelled %v", got)
		}
		return nil
	})
	d = e.decisions(t, "web")
	if in := d[len(d)-1]; in.GetFromReplicas() != 3 || in.GetToReplicas() != 1 || in.GetRule() != "threshold:busy" {
		t.Fatalf("scale-in decision %v", in)
	}

	// The idle node is drained first, then released; the busy one is not touched.
	testkit.Eventually(t, 10*time.Second, func() error {
		for _, c := range e.prov.Calls() {
			if c.Op == "release" && c.Node == idleNode {
				return nil
			}
		}
		return fmt.Errorf("idle node %s not released", idleNode)
	})
	drains := func(node string) int {
		n := 0
		for _, m := range e.seen.get("agent.*.cmd.*") {
			if m.Subject == "agent."+node+".cmd.drain" {
				ev := decode(t, m, &shizuv1.DrainNode{})
				if ev.GetNodeId() != node || ev.Validate() != nil {
					t.Errorf("drain command %v", ev)
				}
				n++
			}
		}
		return n
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		if n := drains(idleNode); n != 1 {
			return fmt.Errorf("idle node released with %d drain commands, want 1", n)
		}
		return nil
	})
	if drains(busyNode) != 0 {
		t.Fatal("a node holding a rental was drained")
	}
	if st, err := e.caps.Node(t.Context(), busyNode); err != nil || st.Status != capacity.StatusReady {
		t.Fatalf("busy node: %+v %v", st.Status, err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		if _, err := e.caps.Node(t.Context(), idleNode); !errors.Is(err, capacity.ErrNotFound) {
			return fmt.Errorf("released node still in the capacity store (lookup answered %s)", errText(err))
		}
		return nil
	})
	if provs := len(slices.DeleteFunc(e.prov.Calls(), func(c providertest.Call) bool { return c.Op != "provision" })); provs != 1 {
		t.Fatalf("%d provision calls; the repeated shortage provisioned again", provs)
	}

	// Its rental ends (the scheduler releases it after the cancel): it drains and goes too.
	if _, err := e.caps.Release(t.Context(), "pool-web-2"); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		left, _ := e.prov.List(t.Context())
		if len(left) != 0 {
			return fmt.Errorf("nodes left: %v", left)
		}
		return nil
	})
	testkit.Eventually(t, 5*time.Second, func() error {
		if n := drains(busyNode); n != 1 {
			return fmt.Errorf("the emptied node was released with %d drain commands, want 1", n)
		}
		releases := 0
		for _, m := range e.seen.get("scale.>") {
			if m.Subject == "scale.fleet.release_requested" {
				releases++
			}
		}
		if releases != 2 {
			return fmt.Errorf("%d release events, want 2", releases)
		}
		return nil
	})
}

func TestSpotShortageFallsBackToOnDemandOnlyWhenTheRentalsAllowIt(t *testing.T) {
	t.Parallel()
	file := testPolicy()
	file.Fleet.DefaultMarket = fleet.Spot
	e := start(t, file)
	e.prov.SpotCapacity = 0 // the spot market has nothing
	// Rentals that take either market: spot is tried, then on-demand.
	either := &shizuv1.CapacityShortage{
		Meta:      &shizuv1.EventMeta{EventId: "shortage-either", OccurredAt: timestamppb.Now(), Source: "scheduler"},
		Missing:   &shizuv1.ResourceVector{GpuCount: 1},
		RentalIds: []string{"r1"},
	}
	if _, err := e.admin.Publish(t.Context(), "scale.fleet.shortage", either); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		for _, m := range e.seen.get("scale.>") {
			if m.Subject == "scale.fleet.provision_requested" {
				ev := decode(t, m, &shizuv1.NodeProvisionRequested{})
				if ev.GetMarket() != shizuv1.Market_MARKET_ON_DEMAND || !strings.Contains(ev.GetReason(), "spot short, fell back to on-demand") {
					return fmt.Errorf("provision event %v", ev)
				}
				return nil
			}
		}
		return fmt.Errorf("no provision event")
	})
	var markets []provider.Market
	for _, c := range e.prov.Calls() {
		markets = append(markets, c.Market)
	}
	if !slices.Equal(markets, []provider.Market{provider.Spot, provider.OnDemand}) {
		t.Fatalf("provider calls by market %v, want spot then on-demand", markets)
	}

	// Rentals that need spot cannot fall back: they are retried, never
	// given on-demand nodes they could not use.
	spotOnly := &shizuv1.CapacityShortage{
		Meta:      &shizuv1.EventMeta{EventId: "shortage-spot", OccurredAt: timestamppb.Now(), Source: "scheduler"},
		Missing:   &shizuv1.ResourceVector{GpuCount: 1, Market: shizuv1.Market_MARKET_SPOT},
		RentalIds: []string{"r2"},
	}
	if _, err := e.admin.Publish(t.Context(), "scale.fleet.shortage", spotOnly); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		if n := len(e.prov.Calls()); n < 3 {
			return fmt.Errorf("%d provider calls", n)
		}
		return nil
	})
	for _, c := range e.prov.Calls()[2:] {
		if c.Market != provider.Spot {
			t.Fatalf("a spot-only shortage got %s nodes: %+v", c.Market, c)
		}
	}
}

func TestABadSampleIsDeadLetteredWithItsReason(t *testing.T) {
	t.Parallel()
	e := start(t, testPolicy())
	bad := &shizuv1.TrafficSampled{
		Meta:   &shizuv1.EventMeta{EventId: "bad-1", OccurredAt: timestamppb.Now(), Source: "gateway"},
		PoolId: "web", ConcurrentRequests: -5, Window: durationpb.New(0),
	}
	if _, err := e.admin.Publish(t.Context(), "traffic.web.sample", bad); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		msg, err := e.admin.JetStream().Stream(t.Context(), topology.StreamDeadLetter)
		if err != nil {
			return err
		}
		m, err := msg.GetLastMsgForSubject(t.Context(), "dlq.TRAFFIC.autoscaler-traffic")
		if err != nil {
			return err
		}
		if m.Header.Get(bus.HeaderDLQReason) == "" {
			return fmt.Errorf("dead letter without a reason")
		}
		return nil
	})
	// The bad sample changed nothing beyond the floor.
	for _, d := range e.decisions(t, "web") {
		if d.GetRule() != policy.RuleMinReplicas {
			t.Fatalf("a bad sample led to %v", d)
		}
	}
}

// TestAShortageStartsLocalAgentsThatRegisterAndIdleOnesAreDrainedAndStopped
// runs the local provider with a stand-in node-agent (a small program of
// ours that registers its node in Redis as the real agent does).
func TestAShortageStartsLocalAgentsThatRegisterAndIdleOnesAreDrainedAndStopped(t *testing.T) {
	// Not parallel: the stand-in reads STANDIN_* from the environment.
	bin := filepath.Join(t.TempDir(), "node-agent")
	if out, err := exec.Command("go", "build", "-o", bin, "../provider/testdata/standin").CombinedOutput(); err != nil {
		t.Fatalf("build the stand-in node-agent: %v\n%s", err, out)
	}
	dir := t.TempDir()
	t.Setenv("STANDIN_DIR", dir)
	t.Setenv("STANDIN_REGISTER", "1")
	e := startWith(t, testPolicy(), func(cfg *app.Config, deps *app.Deps) {
		cfg.NodeAgentBinary = bin
		cfg.AgentNATSPassword = testkit.Password(topology.NodeAgent)
		deps.Provider = nil
	})
	shortage := &shizuv1.CapacityShortage{
		Meta:      &shizuv1.EventMeta{EventId: "shortage-local", OccurredAt: timestamppb.Now(), Source: "scheduler"},
		Missing:   &shizuv1.ResourceVector{GpuCount: 8},
		RentalIds: []string{"r1"},
	}
	if _, err := e.admin.Publish(t.Context(), "scale.fleet.shortage", shortage); err != nil {
		t.Fatal(err)
	}
	var node string
	testkit.Eventually(t, 10*time.Second, func() error {
		started, _ := filepath.Glob(filepath.Join(dir, "*.started"))
		if len(started) != 1 {
			return fmt.Errorf("%d agents started", len(started))
		}
		node = strings.TrimSuffix(filepath.Base(started[0]), ".started")
		return nil
	})
	rec, err := os.ReadFile(filepath.Join(dir, node+".started"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"-simulate h100x8 -node-id " + node, "SHIZU_NATS_USER=node-agent",
		"SHIZU_NATS_PASSWORD=" + testkit.Password(topology.NodeAgent), "SHIZU_REDIS_URL=redis://", "SHIZU_NODE_ZONE=z1"} {
		if !strings.Contains(string(rec), want) {
			t.Errorf("agent started without %q:\n%s", want, rec)
		}
	}
	// It registered, stayed idle, was drained and then stopped.
	testkit.Eventually(t, 15*time.Second, func() error {
		if _, err := os.Stat(filepath.Join(dir, node+".stopped")); err != nil {
			return fmt.Errorf("agent %s not stopped yet", node)
		}
		return nil
	})
	drained := false
	for _, m := range e.seen.get("agent.*.cmd.*") {
		drained = drained || m.Subject == "agent."+node+".cmd.drain"
	}
	if !drained {
		t.Fatal("agent stopped without a drain command")
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		if _, err := e.caps.Node(t.Context(), node); !errors.Is(err, capacity.ErrNotFound) {
			return fmt.Errorf("released node still in the capacity store (lookup answered %s)", errText(err))
		}
		return nil
	})
}

func TestAPoolThatProvisionsAheadAsksForNodesWhenTheFleetIsFull(t *testing.T) {
	t.Parallel()
	file := testPolicy()
	file.Pools[0].ProvisionAhead = true
	file.Pools[0].Rental.GPUCount = 4 // two replicas per 8-GPU node
	e := start(t, file)
	testkit.Eventually(t, 10*time.Second, func() error {
		if len(e.rentalEvents(t, "requested")) != 1 {
			return fmt.Errorf("pool not at its floor yet")
		}
		return nil
	})
	e.sample(t, "web", 50) // 1 -> 3: two more replicas of 4 GPUs, no free capacity
	testkit.Eventually(t, 10*time.Second, func() error {
		for _, m := range e.seen.get("scale.>") {
			if m.Subject == "scale.web.provision_requested" {
				ev := decode(t, m, &shizuv1.NodeProvisionRequested{})
				if ev.GetPoolId() == "web" && ev.GetCount() == 1 && strings.Contains(ev.GetReason(), "free capacity holds 0 of 2") {
					return nil
				}
			}
		}
		return fmt.Errorf("no provision event for the scale-out")
	})
	var provisioned []providertest.Call
	for _, c := range e.prov.Calls() {
		if c.Op == "provision" {
			provisioned = append(provisioned, c)
		}
	}
	// The floor's first replica also found no room: 1 node for it, 1 for the two new ones.
	if len(provisioned) != 2 || provisioned[1].N != 1 {
		t.Fatalf("provision calls %+v", provisioned)
	}
	// The scheduler's later shortage for the same rentals provisions nothing more.
	shortage := &shizuv1.CapacityShortage{
		Meta:      &shizuv1.EventMeta{EventId: "shortage-ahead", OccurredAt: timestamppb.Now(), Source: "scheduler"},
		Missing:   &shizuv1.ResourceVector{GpuCount: 4},
		RentalIds: []string{"pool-web-2", "pool-web-3"},
	}
	if _, err := e.admin.Publish(t.Context(), "scale.fleet.shortage", shortage); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		info, err := e.admin.JetStream().Consumer(t.Context(), topology.StreamScaling, "autoscaler-shortage")
		if err != nil {
			return err
		}
		if ci := info.CachedInfo(); ci.NumPending > 0 || ci.NumAckPending > 0 || ci.Delivered.Consumer < 1 {
			return fmt.Errorf("shortage not handled yet")
		}
		return nil
	})
	n := 0
	for _, c := range e.prov.Calls() {
		if c.Op == "provision" {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("%d provision calls after the shortage, want still 2", n)
	}
}

func TestARejectedPoolReplicaIsForgottenAndReplaced(t *testing.T) {
	t.Parallel()
	e := start(t, testPolicy())
	testkit.Eventually(t, 10*time.Second, func() error {
		if got := e.rentalEvents(t, "requested"); len(got) != 1 {
			return fmt.Errorf("%d rentals requested", len(got))
		}
		return nil
	})
	// A rental of another tenant with a look-alike id changes nothing.
	other := &shizuv1.RentalRejected{Meta: &shizuv1.EventMeta{EventId: "rej-other", OccurredAt: timestamppb.Now(), Source: "scheduler"},
		RentalId: "pool-web-1", TenantId: "mallory", Reason: shizuv1.RejectReason_REJECT_REASON_PENDING_TIMEOUT}
	if _, err := e.admin.Publish(t.Context(), "rental.mallory.rejected", other); err != nil {
		t.Fatal(err)
	}
	rej := &shizuv1.RentalRejected{Meta: &shizuv1.EventMeta{EventId: "rej-1", OccurredAt: timestamppb.Now(), Source: "scheduler"},
		RentalId: "pool-web-1", TenantId: "acme", Reason: shizuv1.RejectReason_REJECT_REASON_PENDING_TIMEOUT}
	if _, err := e.admin.Publish(t.Context(), "rental.acme.rejected", rej); err != nil {
		t.Fatal(err)
	}
	// The floor brings a new replica in place of the lost one.
	testkit.Eventually(t, 10*time.Second, func() error {
		if got := e.rentalEvents(t, "requested"); !slices.Equal(got, []string{"pool-web-1", "pool-web-2"}) {
			return fmt.Errorf("requested %v", got)
		}
		return nil
	})
	d := e.decisions(t, "web")
	if last := d[len(d)-1]; last.GetFromReplicas() != 0 || last.GetToReplicas() != 1 || last.GetRule() != policy.RuleMinReplicas {
		t.Fatalf("replacement decision %v", last)
	}
	if n := len(e.rentalEvents(t, "requested")); n != 2 {
		t.Fatalf("%d requests; the other tenant's rejection must not count", n)
	}
}

// errText is err's message, or "no error" for nil.
func errText(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}
