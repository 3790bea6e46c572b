package app_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/failover/detect"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// The chaos scenario runs real node-agent child processes (simulated
// H100x8 hosts, default 1 s heartbeat and 3 s TTL), real NATS and Redis and
// one failover replica; the test plays the scheduler's part of the
// migration contract (placeholder until the scheduler re-places
// RentalMigrating itself): on each RentalMigrating it releases what is left
// on the old node, reserves on a live node and sends RentalScheduled +
// StartRental with the next attempt.

type chaos struct {
	t      testing.TB
	e      *env
	bin    string
	dir    string
	agents map[string]*exec.Cmd
	nodes  []string

	mu        sync.Mutex
	started   map[string]map[int32]*shizuv1.RentalStarted // rental -> attempt
	stopped   map[string]map[int32]*shizuv1.RentalStopped
	migrated  map[string]*shizuv1.RentalMigrated
	scheduled map[string]map[int32]*shizuv1.RentalScheduled
	lost      map[string]*shizuv1.NodeLost
	handedAt  map[string]time.Time // first RentalMigrating received, by rental
	placeMu   sync.Mutex
}

func buildAgent(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "node-agent")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/shizu-gpu/shizu/services/node-agent/cmd/node-agent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1", "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build node-agent (needs cgo and a C compiler): %v\n%s", err, out)
	}
	return bin
}

func newChaos(t testing.TB, e *env) *chaos {
	c := &chaos{t: t, e: e, bin: buildAgent(t), dir: t.TempDir(), agents: map[string]*exec.Cmd{},
		started: map[string]map[int32]*shizuv1.RentalStarted{}, stopped: map[string]map[int32]*shizuv1.RentalStopped{},
		migrated: map[string]*shizuv1.RentalMigrated{}, scheduled: map[string]map[int32]*shizuv1.RentalScheduled{},
		lost: map[string]*shizuv1.NodeLost{}, handedAt: map[string]time.Time{}}
	// The workload lives as long as the agent that started it: a killed
	// host takes its workloads with it, and nothing outlives the test.
	script := filepath.Join(c.dir, "workload.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nwhile kill -0 $PPID 2>/dev/null; do sleep 0.2; done\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	nc := e.nats.Connect(t, nats.UserInfo(topology.Admin, password(topology.Admin)))
	on := func(subj string, fn func(data []byte)) {
		if _, err := nc.Subscribe(subj, func(m *nats.Msg) { fn(m.Data) }); err != nil {
			t.Fatal(err)
		}
	}
	decode := func(data []byte, m proto.Message) bool { return proto.Unmarshal(data, m) == nil }
	on(subject.RentalStartedAll, func(data []byte) {
		ev := &shizuv1.RentalStarted{}
		if decode(data, ev) {
			c.mu.Lock()
			if c.started[ev.GetRentalId()] == nil {
				c.started[ev.GetRentalId()] = map[int32]*shizuv1.RentalStarted{}
			}
			c.started[ev.GetRentalId()][ev.GetAttempt()] = ev
			c.mu.Unlock()
		}
	})
	on(subject.RentalStoppedAll, func(data []byte) {
		ev := &shizuv1.RentalStopped{}
		if decode(data, ev) {
			c.mu.Lock()
			if c.stopped[ev.GetRentalId()] == nil {
				c.stopped[ev.GetRentalId()] = map[int32]*shizuv1.RentalStopped{}
			}
			c.stopped[ev.GetRentalId()][ev.GetAttempt()] = ev
			c.mu.Unlock()
		}
	})
	on(subject.RentalScheduledAll, func(data []byte) {
		ev := &shizuv1.RentalScheduled{}
		if decode(data, ev) {
			c.mu.Lock()
			if c.scheduled[ev.GetRentalId()] == nil {
				c.scheduled[ev.GetRentalId()] = map[int32]*shizuv1.RentalScheduled{}
			}
			c.scheduled[ev.GetRentalId()][ev.GetAttempt()] = ev
			c.mu.Unlock()
		}
	})
	on(subject.RentalMigratedAll, func(data []byte) {
		ev := &shizuv1.RentalMigrated{}
		if decode(data, ev) {
			c.mu.Lock()
			c.migrated[ev.GetRentalId()] = ev
			c.mu.Unlock()
		}
	})
	on(subject.NodeLostAll, func(data []byte) {
		ev := &shizuv1.NodeLost{}
		if decode(data, ev) {
			c.mu.Lock()
			c.lost[ev.GetNodeId()] = ev
			c.mu.Unlock()
		}
	})
	// The scheduler's part of the contract.
	on(subject.RentalMigratingAll, func(data []byte) {
		ev := &shizuv1.RentalMigrating{}
		if !decode(data, ev) {
			return
		}
		c.mu.Lock()
		if _, seen := c.handedAt[ev.GetRentalId()]; !seen {
			c.handedAt[ev.GetRentalId()] = time.Now()
		}
		c.mu.Unlock()
		go func() {
			if err := c.replace(ev); err != nil {
				t.Errorf("re-place %s: %v", ev.GetRentalId(), err)
			}
		}()
	})
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *chaos) startAgent(node string) {
	t := c.t
	cmd := exec.Command(c.bin, "-simulate", "h100x8", "-node-id", node, "-state-dir", filepath.Join(c.dir, node),
		"-default-command", filepath.Join(c.dir, "workload.sh"), "-telemetry-interval", "30s")
	cmd.Env = append(os.Environ(), "SHIZU_NATS_URL="+c.e.nats.URL, "SHIZU_NATS_USER="+topology.NodeAgent,
		"SHIZU_NATS_PASSWORD="+password(topology.NodeAgent), "SHIZU_REDIS_URL=redis://"+c.e.redis.Addr+"/0",
		"SHIZU_HTTP_ADDR=127.0.0.1:0", "SHIZU_LOG_LEVEL=warn")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c.agents[node] = cmd
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		}
	})
}

func (c *chaos) kill(node string) {
	cmd := c.agents[node]
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		c.t.Fatal(err)
	}
	_ = cmd.Wait()
}

// place reserves whole... half GPUs first-fit on live nodes (the test's
// stand-in for the scheduler) and sends the placement to the agent.
func (c *chaos) place(rental string, spec *shizuv1.RentalSpec, attempt int32, cause string, avoid string) error {
	ctx := context.Background()
	c.placeMu.Lock()
	defer c.placeMu.Unlock()
	snap, err := c.e.store.Snapshot(ctx)
	if err != nil {
		return err
	}
	for _, n := range snap.Nodes {
		if n.Status != capacity.StatusReady || n.ID == avoid {
			continue
		}
		for _, g := range n.FreeGPUs {
			if g.Milli < int64(spec.GetMilliGpu()) || g.Sharers >= g.MaxSharers || g.VRAMMiB < spec.GetVramMib() {
				continue
			}
			p := capacity.Placement{RentalID: rental, NodeID: n.ID, Epoch: n.Epoch, Tenant: "acme", CPUMilli: 100, MemoryMiB: 256,
				GPUs: []capacity.GPUShare{{Index: g.Index, Milli: int64(spec.GetMilliGpu()), VRAMMiB: spec.GetVramMib()}}}
			if _, err := c.e.store.Reserve(ctx, p); err != nil {
				if capacity.IsConflict(err) || capacity.IsInsufficient(err) || capacity.IsFenced(err) {
					continue
				}
				return err
			}
			gpu := n.GPUs[g.Index]
			sched := &shizuv1.RentalScheduled{
				Meta: &shizuv1.EventMeta{EventId: fmt.Sprintf("rental:%s:scheduled:%d", rental, attempt), OccurredAt: timestamppb.Now(),
					Source: "test-scheduler", CausationId: cause, CorrelationId: rental},
				RentalId: rental, TenantId: "acme", NodeId: n.ID, NodeEpoch: int64(n.Epoch),
				Gpus:     []*shizuv1.GpuAssignment{{GpuIndex: int32(g.Index), GpuUuid: gpu.UUID, MilliGpu: spec.GetMilliGpu(), VramMib: spec.GetVramMib()}},
				CpuMilli: 100, MemoryMib: 256, Spec: spec, GpuModel: gpu.Model, Zone: n.Zone, Attempt: attempt,
			}
			subj, _ := subject.Format(subject.RentalScheduled, "acme")
			if _, err := c.e.admin.Publish(ctx, subj, sched); err != nil {
				return err
			}
			cmd, _ := subject.Format(subject.AgentCmd, n.ID, "start")
			_, err = c.e.admin.Publish(ctx, cmd, &shizuv1.StartRental{
				Meta:      &shizuv1.EventMeta{EventId: fmt.Sprintf("cmd:start:%s:%d", rental, attempt), OccurredAt: timestamppb.Now(), Source: "test-scheduler", CorrelationId: rental},
				Scheduled: sched,
			})
			return err
		}
	}
	return fmt.Errorf("no capacity for %s", rental)
}

// replace is the scheduler's handling of RentalMigrating: release what is
// left on the old node, place with the next attempt.
func (c *chaos) replace(ev *shizuv1.RentalMigrating) error {
	ctx := context.Background()
	if a, err := c.e.store.Allocation(ctx, ev.GetRentalId()); err == nil && a.NodeID == ev.GetFromNodeId() {
		if _, err := c.e.store.Release(ctx, ev.GetRentalId()); err != nil {
			return err
		}
	}
	return c.place(ev.GetRentalId(), ev.GetSpec(), ev.GetNextAttempt(), ev.GetMeta().GetEventId(), ev.GetFromNodeId())
}

func (c *chaos) count(fn func() int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fn()
}

// chaosResult is what one SIGKILL round measured.
type chaosResult struct {
	detect, handedOver, scheduled, running []time.Duration
	downtime                               []time.Duration
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p)
	return s[i]
}

// runSIGKILL places rentals over nodes agents, kills `kill` of them with
// SIGKILL at once, waits until every affected rental runs again elsewhere
// and checks the books; then brings the killed agents back and checks that
// nothing of theirs runs on.
func runSIGKILL(t testing.TB, nodes, rentals, kill int) chaosResult {
	e := newEnv(t, 3*time.Second)
	c := newChaos(t, e)
	for i := range nodes {
		n := fmt.Sprintf("n%02d", i)
		c.nodes = append(c.nodes, n)
		c.startAgent(n)
	}
	wait := func(cond func() error) {
		t.Helper()
		testkit.Eventually(t, 120*time.Second, cond)
	}
	wait(func() error {
		snap, err := e.store.Snapshot(t.Context())
		if err != nil || len(snap.Nodes) != nodes {
			return fmt.Errorf("%d of %d nodes registered (%v)", len(snap.Nodes), nodes, err)
		}
		return nil
	})
	cfg := testConfig()
	cfg.Detect = defaultDetect()
	e.startReplica(t, cfg, "failover-a", nil)
	sp := &shizuv1.RentalSpec{GpuCount: 1, MilliGpu: 500, VramMib: 40960, Plan: shizuv1.Plan_PLAN_ON_DEMAND}
	for i := range rentals {
		if err := c.place(fmt.Sprintf("r%03d", i), sp, 1, "", ""); err != nil {
			t.Fatal(err)
		}
	}
	waitIndexed(t, e, func() []string {
		var ids []string
		for i := range rentals {
			ids = append(ids, fmt.Sprintf("r%03d", i))
		}
		return ids
	}()...)
	wait(func() error {
		if n := c.count(func() int { return len(c.started) }); n != rentals {
			return fmt.Errorf("%d of %d rentals started", n, rentals)
		}
		return nil
	})
	// Kill the agents holding the most rentals.
	victims := c.nodes[:kill]
	affected := map[string]string{}
	for _, n := range victims {
		allocs, err := e.store.Allocations(t.Context(), n)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range allocs {
			affected[a.RentalID] = n
		}
	}
	killedAt := time.Now()
	for _, n := range victims {
		c.kill(n)
	}
	wait(func() error {
		done := c.count(func() int {
			k := 0
			for r := range affected {
				if c.migrated[r] != nil {
					k++
				}
			}
			return k
		})
		if done != len(affected) {
			return fmt.Errorf("%d of %d affected rentals migrated", done, len(affected))
		}
		return nil
	})
	var res chaosResult
	c.mu.Lock()
	for _, n := range victims {
		res.detect = append(res.detect, c.lost[n].GetMeta().GetOccurredAt().AsTime().Sub(killedAt))
	}
	for r := range affected {
		res.handedOver = append(res.handedOver, c.handedAt[r].Sub(killedAt))
		res.scheduled = append(res.scheduled, c.scheduled[r][2].GetMeta().GetOccurredAt().AsTime().Sub(killedAt))
		res.running = append(res.running, c.started[r][2].GetStartedAt().AsTime().Sub(killedAt))
		res.downtime = append(res.downtime, c.migrated[r].GetDowntime().AsDuration())
		if slices.Contains(victims, c.migrated[r].GetToNodeId()) {
			t.Errorf("%s moved to %s, a killed node", r, c.migrated[r].GetToNodeId())
		}
	}
	c.mu.Unlock()
	checkBooks(t, e, rentals, victims)

	// The killed agents come back (a partition heals): they find their
	// node fenced, register again, and stop nothing twice: their workloads
	// died with them and no allocation of theirs survives.
	for _, n := range victims {
		c.startAgent(n)
	}
	wait(func() error {
		for _, n := range victims {
			st, err := e.store.Node(t.Context(), n)
			if err != nil || st.Status != capacity.StatusReady {
				return fmt.Errorf("%s not back (%v)", n, err)
			}
		}
		return nil
	})
	checkBooks(t, e, rentals, nil)
	c.mu.Lock()
	for r := range affected {
		if c.started[r][3] != nil {
			t.Errorf("%s started a third time", r)
		}
	}
	c.mu.Unlock()
	return res
}

// checkBooks: every rental holds exactly one allocation, on a live node
// (none on the excluded ones), and every GPU's free capacity is exactly
// its size minus what its allocations hold.
func checkBooks(t testing.TB, e *env, rentals int, dead []string) {
	t.Helper()
	snap, err := e.store.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, n := range snap.Nodes {
		used := make([]int64, len(n.GPUs))
		for _, a := range n.Allocations {
			if prev, dup := seen[a.RentalID]; dup {
				t.Errorf("%s allocated on %s and %s", a.RentalID, prev, n.ID)
			}
			seen[a.RentalID] = n.ID
			if slices.Contains(dead, n.ID) {
				t.Errorf("%s still allocated on killed node %s", a.RentalID, n.ID)
			}
			for _, g := range a.GPUs {
				used[g.Index] += g.Milli
			}
		}
		for i, g := range n.FreeGPUs {
			if g.Milli != capacity.MilliPerGPU-used[i] {
				t.Errorf("%s GPU %d: %d milli free, allocations hold %d", n.ID, i, g.Milli, used[i])
			}
		}
	}
	if len(seen) != rentals {
		t.Errorf("%d rentals allocated, want %d", len(seen), rentals)
	}
}

func TestChaosKilledAgentsRentalsRunAgainElsewhere(t *testing.T) {
	if testing.Short() {
		t.Skip("starts node-agent child processes")
	}
	res := runSIGKILL(t, 6, 40, 2)
	t.Logf("detection after SIGKILL: p50 %s max %s; handed to the scheduler: p50 %s max %s; scheduled again: p50 %s p99 %s max %s; running again: p50 %s p99 %s max %s; downtime p50 %s max %s",
		percentile(res.detect, .5), percentile(res.detect, 1),
		percentile(res.handedOver, .5), percentile(res.handedOver, 1),
		percentile(res.scheduled, .5), percentile(res.scheduled, .99), percentile(res.scheduled, 1),
		percentile(res.running, .5), percentile(res.running, .99), percentile(res.running, 1),
		percentile(res.downtime, .5), percentile(res.downtime, 1))
}

func defaultDetect() detect.Config { return detect.DefaultConfig() }

// A partitioned agent (frozen with SIGSTOP: no beats, its workloads run
// on) is fenced and its rentals run again elsewhere; when it returns
// (SIGCONT) it finds its node fenced and stops the old runs itself, so no
// rental keeps running twice.
func TestChaosAPartitionedAgentStopsItsFencedRunsWhenItReturns(t *testing.T) {
	if testing.Short() {
		t.Skip("starts node-agent child processes")
	}
	e := newEnv(t, 3*time.Second)
	c := newChaos(t, e)
	for i := range 3 {
		n := fmt.Sprintf("n%02d", i)
		c.nodes = append(c.nodes, n)
		c.startAgent(n)
	}
	wait := func(cond func() error) {
		t.Helper()
		testkit.Eventually(t, 120*time.Second, cond)
	}
	wait(func() error {
		snap, err := e.store.Snapshot(t.Context())
		if err != nil || len(snap.Nodes) != 3 {
			return fmt.Errorf("%d nodes registered (%v)", len(snap.Nodes), err)
		}
		return nil
	})
	e.startReplica(t, testConfig(), "failover-a", nil)
	sp := &shizuv1.RentalSpec{GpuCount: 1, MilliGpu: 500, VramMib: 40960, Plan: shizuv1.Plan_PLAN_ON_DEMAND}
	var ids []string
	for i := range 12 {
		id := fmt.Sprintf("r%03d", i)
		ids = append(ids, id)
		if err := c.place(id, sp, 1, "", ""); err != nil {
			t.Fatal(err)
		}
	}
	waitIndexed(t, e, ids...)
	wait(func() error {
		if n := c.count(func() int { return len(c.started) }); n != 12 {
			return fmt.Errorf("%d of 12 started", n)
		}
		return nil
	})
	frozen := "n00"
	allocs, err := e.store.Allocations(t.Context(), frozen)
	if err != nil || len(allocs) == 0 {
		t.Fatalf("%s holds %d rentals (%v)", frozen, len(allocs), err)
	}
	proc := c.agents[frozen].Process
	if err := proc.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	wait(func() error {
		for _, a := range allocs {
			if c.count(func() int { return len(c.started[a.RentalID]) }) < 2 {
				return fmt.Errorf("%s not running elsewhere yet", a.RentalID)
			}
		}
		return nil
	})
	if err := proc.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	wait(func() error {
		for _, a := range allocs {
			ok := c.count(func() int {
				if s := c.stopped[a.RentalID][1]; s != nil && s.GetNodeId() == frozen {
					return 1
				}
				return 0
			})
			if ok == 0 {
				return fmt.Errorf("the old run of %s on %s not stopped yet", a.RentalID, frozen)
			}
		}
		return nil
	})
	c.mu.Lock()
	for _, a := range allocs {
		if s := c.stopped[a.RentalID][1]; s.GetExitReason() != shizuv1.ExitReason_EXIT_REASON_NODE_FAILED {
			t.Errorf("%s's old run stopped for %s, want NODE_FAILED", a.RentalID, s.GetExitReason())
		}
		if c.stopped[a.RentalID][2] != nil {
			t.Errorf("%s's new run was stopped", a.RentalID)
		}
	}
	c.mu.Unlock()
	checkBooks(t, e, 12, nil)
}

// BenchmarkChaosSIGKILL is the scenario: 20 nodes, 200 rentals,
// 4 agents killed with SIGKILL at once, default 1 s heartbeat / 3 s TTL.
// It reports detection, re-scheduling and restart times after the kill.
//
//	cd services/failover && go test -run '^$' -bench ChaosSIGKILL -benchtime=1x ./app/
func BenchmarkChaosSIGKILL(b *testing.B) {
	for b.Loop() {
		res := runSIGKILL(b, 20, 200, 4)
		for _, m := range []struct {
			name string
			ds   []time.Duration
		}{{"detect", res.detect}, {"handed_over", res.handedOver}, {"scheduled", res.scheduled}, {"running", res.running}, {"downtime", res.downtime}} {
			b.ReportMetric(percentile(m.ds, .5).Seconds(), m.name+"_p50_s")
			b.ReportMetric(percentile(m.ds, .99).Seconds(), m.name+"_p99_s")
			b.ReportMetric(percentile(m.ds, 1).Seconds(), m.name+"_max_s")
		}
	}
}
