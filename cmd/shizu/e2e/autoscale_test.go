package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	autoscaler "github.com/shizu-gpu/shizu/services/autoscaler/app"
	"github.com/shizu-gpu/shizu/services/autoscaler/fleet"
	"github.com/shizu-gpu/shizu/services/autoscaler/policy"
	"github.com/shizu-gpu/shizu/services/autoscaler/provider"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// autoscalePolicy is one pool "web" of acme whose replicas each take a
// whole simulated H100x8 host, so every replica beyond what the fleet holds
// needs a node of its own: the pool's scale-out makes the scheduler report a
// capacity shortage, and its scale-in leaves whole nodes idle.
func autoscalePolicy() policy.File {
	return policy.File{
		Pools: []policy.Pool{{
			ID: "web", Tenant: tenant,
			Rental:      policy.RentalShape{GPUCount: 8, MilliGPU: 1000, Models: []string{"H100-SXM5-80GB"}},
			MinReplicas: 1, MaxReplicas: 3, MaxStepOut: 2, MaxStepIn: 2,
			Thresholds: []policy.Threshold{{Name: "busy", Metric: policy.ConcurrentPerReplica, ScaleOutAbove: 10, ScaleInBelow: 3, Step: 2}},
			StaleAfter: policy.Duration(time.Minute),
		}},
		Fleet: fleet.Config{
			InstanceTypes: []fleet.InstanceType{{Name: "p5.48xlarge", Profile: "h100x8", Model: "H100-SXM5-80GB", GPUs: 8,
				PricePerGPUHourMicros: 2_490_000}},
			DefaultZone: "local", MaxNodes: 4,
			// Long enough that a node which just registered gets the rental
			// waiting for it before it counts as idle, on a loaded machine.
			IdleAfter: fleet.Duration(5 * time.Second), RegisterTimeout: fleet.Duration(2 * time.Minute),
		},
	}
}

// runAutoscaler starts the autoscaler in the stack with the local provider:
// each provisioned node is a real node-agent child process (simulated GPUs)
// whose workloads are the stack's workload script.
func (s *stack) runAutoscaler(file policy.File) *provider.Local {
	s.t.Helper()
	local, err := provider.NewLocal(provider.LocalConfig{
		Binary:     s.bin,
		Profiles:   map[string]string{"p5.48xlarge": "h100x8"},
		NodePrefix: "auto",
		Env: map[string]string{
			"SHIZU_NATS_URL": s.nats.URL, "SHIZU_NATS_USER": topology.NodeAgent, "SHIZU_NATS_PASSWORD": password(topology.NodeAgent),
			"SHIZU_REDIS_URL": "redis://" + s.redis.Addr + "/0", "SHIZU_HTTP_ADDR": "",
			"SHIZU_DEFAULT_COMMAND": s.workloadScript(), "SHIZU_STOP_GRACE": "2s", "SHIZU_TELEMETRY_INTERVAL": "1s",
			"SHIZU_LOG_LEVEL": "warn", "SHIZU_LOG_FORMAT": "text",
			// Each agent's default state directory is <tmp>/shizu-node-agent/<node>:
			// inside this test's directory, never shared with another run.
			"TMPDIR": s.dir,
		},
		Output:    s.logs,
		StopGrace: 5 * time.Second,
	})
	if err != nil {
		s.t.Fatal(err)
	}
	// Registered before the service, so it runs after the service stopped.
	s.t.Cleanup(func() { _ = local.Close(context.WithoutCancel(s.t.Context())) })
	cfg := autoscaler.DefaultConfig()
	cfg.Service.NATS.URL, cfg.Service.NATS.User, cfg.Service.NATS.Password = s.nats.URL, topology.Autoscaler, password(topology.Autoscaler)
	cfg.Service.NATS.Name = topology.Autoscaler
	cfg.Service.RedisURL = "redis://" + s.redis.Addr + "/0"
	cfg.Service.HTTPAddr = ""
	cfg.Service.LogLevel, cfg.Service.LogFormat, cfg.Service.LogWriter = "info", "text", s.logs
	cfg.Service.ShutdownTimeout = 10 * time.Second
	cfg.Tick = 200 * time.Millisecond
	s.runService(topology.Autoscaler, func(ctx context.Context) error {
		return autoscaler.RunWith(ctx, cfg, autoscaler.Deps{Provider: local, Policy: &file})
	})
	s.waitConsumers(topology.Autoscaler)
	return local
}

// scaleLog keeps the autoscaler's decisions, provisioning and release
// requests and drain commands seen on the bus.
type scaleLog struct {
	mu        sync.Mutex
	decided   []*shizuv1.ScalingDecided
	provision []*shizuv1.NodeProvisionRequested
	release   []*shizuv1.NodeReleaseRequested
	drains    []string // nodes
	shortages int
}

func (s *stack) watchScaling() *scaleLog {
	s.t.Helper()
	l := &scaleLog{}
	nc := s.nats.Connect(s.t, nats.UserInfo(topology.Admin, password(topology.Admin)))
	sub := func(pattern string, fn func(*nats.Msg)) {
		if _, err := nc.Subscribe(pattern, func(m *nats.Msg) { l.mu.Lock(); defer l.mu.Unlock(); fn(m) }); err != nil {
			s.t.Fatal(err)
		}
	}
	decode := func(m *nats.Msg, ev proto.Message) bool { return proto.Unmarshal(m.Data, ev) == nil }
	sub(subject.ScaleDecidedAll, func(m *nats.Msg) {
		if ev := (&shizuv1.ScalingDecided{}); decode(m, ev) {
			l.decided = append(l.decided, ev)
		}
	})
	sub(subject.ScaleProvisionRequestedAll, func(m *nats.Msg) {
		if ev := (&shizuv1.NodeProvisionRequested{}); decode(m, ev) {
			l.provision = append(l.provision, ev)
		}
	})
	sub(subject.ScaleReleaseRequestedAll, func(m *nats.Msg) {
		if ev := (&shizuv1.NodeReleaseRequested{}); decode(m, ev) {
			l.release = append(l.release, ev)
		}
	})
	sub(subject.CapacityShortage, func(*nats.Msg) { l.shortages++ })
	sub(subject.AgentCmdAll, func(m *nats.Msg) {
		if strings.HasSuffix(m.Subject, ".cmd.drain") {
			l.drains = append(l.drains, strings.Split(m.Subject, ".")[1])
		}
	})
	if err := nc.Flush(); err != nil {
		s.t.Fatal(err)
	}
	return l
}

func (l *scaleLog) read(fn func(*scaleLog)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fn(l)
}

// sampleTraffic publishes a traffic sample of pool "web", as its gateway
// does.
func (s *stack) sampleTraffic(seq int, concurrent int64) {
	s.t.Helper()
	ev := &shizuv1.TrafficSampled{
		Meta:   shizuv1.NewMeta(fmt.Sprintf("e2e-web-sample-%d", seq), "e2e-gateway", "", "", time.Now()),
		PoolId: "web", ConcurrentRequests: concurrent, RequestsPerSecond: float64(concurrent) * 10,
		P99Latency: durationpb.New(40 * time.Millisecond), Window: durationpb.New(5 * time.Second),
	}
	if err := ev.Validate(); err != nil {
		s.t.Fatal(err)
	}
	subj, err := subject.Format(subject.TrafficSample, "web")
	if err != nil {
		s.t.Fatal(err)
	}
	if _, err := s.admin.Publish(s.t.Context(), subj, ev); err != nil {
		s.t.Fatal(err)
	}
}

// startedOn is the node a started rental runs on.
func (s *stack) startedOn(rental string) string {
	if ev := s.rec.startedAt(rental, 1); ev != nil {
		return ev.GetNodeId()
	}
	return ""
}

// TestAutoscalerGrowsTheFleetForAPoolAndShrinksItWithDrain is issue 8's
// integration test on the whole platform: real NATS and Redis, the real
// scheduler, metering and failover, the autoscaler with the local provider
// starting real node-agent processes. The stack starts without a single
// node.
//
//  1. The pool's floor (1 replica) makes the autoscaler request a rental;
//     the scheduler finds no room and reports a capacity shortage; the
//     provider starts a node-agent, which registers and takes the pending
//     rental, and it runs.
//  2. Traffic above the threshold scales the pool out: two more rentals are
//     scheduled, which again needs nodes: two more agents start, register
//     and run them.
//  3. Traffic falls: the pool scales in (newest replicas cancelled), the
//     nodes left idle are drained and released (their agents stop), and
//     the node running the remaining replica is neither drained nor
//     released; that replica runs on.
func TestAutoscalerGrowsTheFleetForAPoolAndShrinksItWithDrain(t *testing.T) {
	s := testStack(t)
	log := s.watchScaling()
	local := s.runAutoscaler(autoscalePolicy())

	// 1. The floor: a shortage starts the first node, which runs replica 1.
	first := "pool-web-1"
	s.eventually(120*time.Second, func() error {
		if s.rec.startedAt(first, 1) == nil {
			nodes, _ := local.List(t.Context())
			return fmt.Errorf("%s not started yet (provider nodes %d, shortages %d)", first, len(nodes), log.count(func(l *scaleLog) int { return l.shortages }))
		}
		return nil
	})
	nodeA := s.startedOn(first)
	nodes, err := local.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 1 || nodes[0].ID != nodeA {
		t.Fatalf("after the floor's shortage the provider runs %v; want exactly the node running %s (%s)", nodes, first, nodeA)
	}
	log.read(func(l *scaleLog) {
		if l.shortages == 0 || len(l.provision) == 0 {
			t.Errorf("the first node came without a shortage (%d) or a provision request (%d)", l.shortages, len(l.provision))
		}
	})

	// 2. Traffic above the threshold (100 in flight, 10 per replica at most):
	// +2 replicas, which need two more nodes.
	s.sampleTraffic(1, 100)
	added := []string{"pool-web-2", "pool-web-3"}
	s.eventually(180*time.Second, func() error {
		for _, id := range added {
			if s.rec.startedAt(id, 1) == nil {
				nodes, _ := local.List(t.Context())
				return fmt.Errorf("%s not started yet (provider nodes %d)", id, len(nodes))
			}
		}
		return nil
	})
	log.read(func(l *scaleLog) {
		i := slices.IndexFunc(l.decided, func(d *shizuv1.ScalingDecided) bool { return d.GetToReplicas() == 3 })
		if i < 0 {
			t.Fatalf("no decision to 3 replicas among %v", l.decided)
		}
		if d := l.decided[i]; d.GetRule() != "threshold:busy" || d.GetMetric() != string(policy.ConcurrentPerReplica) || d.GetObservedValue() != 100 {
			t.Errorf("scale-out decision does not name its rule and metric: %v", d)
		}
	})
	byNode := map[string]string{}
	for _, id := range append([]string{first}, added...) {
		byNode[s.startedOn(id)] = id
	}
	t.Logf("replicas by node: %v", byNode)
	if len(byNode) != 3 {
		t.Fatalf("three whole-node replicas on %d nodes: %v", len(byNode), byNode)
	}
	nodes, err = local.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if _, ok := byNode[n.ID]; !ok {
			t.Errorf("provider runs %s, which holds no replica", n.ID)
		}
	}

	// 3. Traffic falls (1 in flight): scale-in to the floor, newest first.
	// Samples repeat until the pool is back at one replica (each sample is
	// one decision, bounded by max_step_in).
	seq := 1
	s.eventually(120*time.Second, func() error {
		var to int32 = -1
		log.read(func(l *scaleLog) {
			if n := len(l.decided); n > 0 {
				to = l.decided[n-1].GetToReplicas()
			}
		})
		if to == 1 {
			return nil
		}
		seq++
		s.sampleTraffic(seq, 1)
		return fmt.Errorf("pool at %d replicas", to)
	})
	// The idle nodes are drained and released: only node A is left. A node
	// whose GPUs worked counts as busy for a minute after (the autoscaler's
	// rule), so this takes over a minute.
	s.eventually(240*time.Second, func() error {
		nodes, err := local.List(t.Context())
		if err != nil {
			return err
		}
		if len(nodes) == 1 {
			// The provider forgets a node as it stops it; the autoscaler
			// removes it from the capacity store after.
			for node := range byNode {
				if _, err := s.store.Node(t.Context(), node); node != nodeA && err == nil {
					return fmt.Errorf("released node %s is still in the capacity store", node)
				}
			}
			return nil
		}
		var state []string
		for _, n := range nodes {
			st, err := s.store.Node(t.Context(), n.ID)
			if err != nil {
				state = append(state, fmt.Sprintf("%s: %v", n.ID, err))
				continue
			}
			state = append(state, fmt.Sprintf("%s: %s with %d allocations (%s stopped: %d)", n.ID, st.Status, len(st.Allocations),
				byNode[n.ID], s.rec.count(func(r *recorder) int { return len(r.stopped[byNode[n.ID]]) })))
		}
		return fmt.Errorf("provider still runs %d nodes: %s", len(nodes), strings.Join(state, "; "))
	})
	nodes, err = local.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if nodes[0].ID != nodeA {
		t.Fatalf("provider kept %s; want %s, which runs %s", nodes[0].ID, nodeA, first)
	}
	for node, rental := range byNode {
		if node == nodeA {
			continue
		}
		if stopped := s.rec.count(func(r *recorder) int { return len(r.stopped[rental]) }); stopped == 0 {
			t.Errorf("node %s was released but %s never stopped", node, rental)
		}
	}
	log.read(func(l *scaleLog) {
		for node := range byNode {
			drained := slices.Contains(l.drains, node)
			if node == nodeA && drained {
				t.Errorf("node %s, which runs %s, was drained", node, first)
			}
			if node != nodeA && !drained {
				t.Errorf("node %s was released without a drain command", node)
			}
		}
		for _, r := range l.release {
			if r.GetNodeId() == nodeA {
				t.Errorf("release requested for %s, which runs %s: %v", nodeA, first, r)
			}
		}
	})
	// Nothing in use was released: replica 1 still runs on node A, and no
	// rental stopped but the two cancelled ones.
	st, err := s.store.Node(t.Context(), nodeA)
	if err != nil {
		t.Fatal(err)
	}
	if st.Status != capacity.StatusReady || len(st.Allocations) != 1 {
		t.Errorf("node %s: status %s with %d allocations; want ready with %s", nodeA, st.Status, len(st.Allocations), first)
	}
	if runs := s.runs(); len(runs[first]) != 1 {
		t.Errorf("%s has %d workload processes on this machine; want 1", first, len(runs[first]))
	}
	if n := s.rec.count(func(r *recorder) int { return len(r.stopped[first]) }); n != 0 {
		t.Errorf("%s was stopped", first)
	}
}

func (l *scaleLog) count(fn func(*scaleLog) int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fn(l)
}
