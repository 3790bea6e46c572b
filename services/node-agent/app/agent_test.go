package app_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/node-agent/app"
	"github.com/shizu-gpu/shizu/services/node-agent/gpu"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/service"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

func TestAgentRegistersItsGPUsBeatsReportsTelemetryAndItsKeyExpiresWhenItStops(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := t.TempDir()
	killWorkloads(t, dir)
	a := e.start(t, e.config(t, "n1", "h100x8", dir))

	reg := e.registered(t, "n1", 1)
	if len(reg.GetGpus()) != 8 || reg.GetGpus()[0].GetModel() != "H100-SXM5-80GB" || reg.GetInstanceType() != "p5.48xlarge" {
		t.Fatalf("registered = %v", reg)
	}
	if err := reg.Validate(); err != nil {
		t.Fatal(err)
	}
	st, err := e.store.Node(t.Context(), "n1")
	if err != nil {
		t.Fatal(err)
	}
	if st.Epoch != 1 || st.Status != capacity.StatusReady || len(st.GPUs) != 8 || st.GPUs[3].VRAMMiB != 81920 ||
		!slices.Equal(st.NVLinkDomains[0], []int{0, 1, 2, 3, 4, 5, 6, 7}) || !st.GPUs[0].MIGCapable ||
		st.Market != capacity.MarketOnDemand || st.PricePerGPUHourMicros != 2_000_000 || st.Zone != "local" {
		t.Fatalf("store has %+v", st.Node)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		alive, payload, err := e.Heartbeats.Alive(t.Context(), "n1")
		if err != nil || !alive || string(payload) != "1" {
			return fmt.Errorf("alive=%v payload=%q err=%w", alive, payload, err)
		}
		return nil
	})
	tel := await(t, e, topology.StreamTelemetry, "node.n1.telemetry", func(ev *shizuv1.NodeTelemetry) error {
		if len(ev.GetGpus()) != 8 {
			return fmt.Errorf("%d GPUs", len(ev.GetGpus()))
		}
		return nil
	})
	if err := tel.Validate(); err != nil || tel.GetGpus()[0].GetPowerMw() <= 0 || tel.GetGpus()[0].GetTemperatureC() <= 0 {
		t.Fatalf("telemetry %v: %v", tel, err)
	}

	a.stop(t)
	testkit.Eventually(t, 10*time.Second, func() error {
		alive, _, err := e.Heartbeats.Alive(t.Context(), "n1")
		if err != nil || alive {
			return fmt.Errorf("still alive after the agent stopped (err %w)", err)
		}
		return nil
	})
}

func TestAStartRunsARealProcessOnItsGPUAndAStopEndsItWithExactTimestamps(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := t.TempDir()
	killWorkloads(t, dir)
	e.start(t, e.config(t, "n2", "h100x8", dir))
	e.registered(t, "n2", 1)

	// A quarter of GPU 0 with 20 GiB: the MPS limits confine it.
	cmd := e.place(t, "n2", 1, "r-frac", 250, 20480, "sh", "-c", "env; sleep 30")
	uuid := cmd.GetScheduled().GetGpus()[0].GetGpuUuid()
	e.send(t, "n2", "start", cmd)
	started := await(t, e, topology.StreamRentals, "rental.acme.started", func(ev *shizuv1.RentalStarted) error {
		if ev.GetRentalId() != "r-frac" {
			return errors.New("other rental")
		}
		return nil
	})
	if !slices.Equal(started.GetGpuUuids(), []string{uuid}) || started.GetNodeEpoch() != 1 || started.GetAttempt() != 1 ||
		started.GetMeta().GetEventId() != "rental:r-frac:started:1" {
		t.Fatalf("started = %v", started)
	}
	logPath := filepath.Join(dir, "logs", "r-frac-1.log")
	testkit.Eventually(t, 10*time.Second, func() error {
		b, _ := os.ReadFile(logPath)
		for _, want := range []string{"CUDA_VISIBLE_DEVICES=" + uuid, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
			"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M", "SHIZU_RENTAL_ID=r-frac"} {
			if !strings.Contains(string(b), want) {
				return fmt.Errorf("log lacks %q", want)
			}
		}
		if strings.Contains(string(b), "SHIZU_NATS_PASSWORD") || strings.Contains(string(b), "pw-node-agent") {
			return errors.New("agent credentials leaked into the workload")
		}
		return nil
	})

	// The simulated GPU's telemetry follows the quarter GPU now running on it.
	await(t, e, topology.StreamTelemetry, "node.n2.telemetry", func(ev *shizuv1.NodeTelemetry) error {
		if u := ev.GetGpus()[0].GetUtilizationPercent(); u < 15 {
			return fmt.Errorf("GPU 0 at %d%%", u)
		}
		return nil
	})

	e.send(t, "n2", "stop", stopCmd("n2", "r-frac", shizuv1.ExitReason_EXIT_REASON_CANCELLED, 2*time.Second))
	stopped := await(t, e, topology.StreamRentals, "rental.acme.stopped", func(ev *shizuv1.RentalStopped) error {
		if ev.GetRentalId() != "r-frac" {
			return errors.New("other rental")
		}
		return nil
	})
	if err := stopped.Validate(); err != nil {
		t.Fatal(err)
	}
	if stopped.GetExitReason() != shizuv1.ExitReason_EXIT_REASON_CANCELLED || !stopped.GetStartedAt().AsTime().Equal(started.GetStartedAt().AsTime()) ||
		stopped.GetStoppedAt().AsTime().Before(started.GetStartedAt().AsTime()) {
		t.Fatalf("stopped = %v, started at %v", stopped, started.GetStartedAt().AsTime())
	}
	// Once the stop is reported the workload's record goes (its log stays).
	testkit.Eventually(t, 10*time.Second, func() error {
		if _, err := os.Stat(filepath.Join(dir, "rentals", "r-frac.json")); !os.IsNotExist(err) {
			return fmt.Errorf("the workload record outlived its reported stop: %w", err)
		}
		return nil
	})
	if _, err := os.Stat(logPath); err != nil {
		t.Fatal(err)
	}
}

func TestAWorkloadThatFinishesByItselfIsReportedCompleted(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := t.TempDir()
	e.start(t, e.config(t, "n3", "rtx4090x8", dir))
	e.registered(t, "n3", 1)
	e.send(t, "n3", "start", e.place(t, "n3", 1, "r-batch", 1000, 0, "sh", "-c", "echo trained; exit 0"))
	stopped := await(t, e, topology.StreamRentals, "rental.acme.stopped", func(ev *shizuv1.RentalStopped) error { return nil })
	if stopped.GetExitReason() != shizuv1.ExitReason_EXIT_REASON_COMPLETED || stopped.GetExitCode() != 0 || stopped.GetMessage() != "trained" {
		t.Fatalf("stopped = %v", stopped)
	}
}

// A tqdm progress bar is a run of █, three bytes each: a workload that
// dies with one as its last line must still get a RentalStopped (cut at a
// byte count, the line would be invalid UTF-8, which protobuf refuses to
// encode, and the stop would never be reported).
func TestAWorkloadWhoseLastLineIsAProgressBarIsReportedStopped(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start(t, e.config(t, "n-bar", "rtx4090x8", t.TempDir()))
	e.registered(t, "n-bar", 1)
	script := `i=0; while [ $i -lt 600 ]; do printf '█'; i=$((i+1)); done; printf ' \n'; exit 3`
	e.send(t, "n-bar", "start", e.place(t, "n-bar", 1, "r-bar", 1000, 0, "sh", "-c", script))
	stopped := await(t, e, topology.StreamRentals, "rental.acme.stopped", func(ev *shizuv1.RentalStopped) error {
		if ev.GetRentalId() != "r-bar" {
			return errors.New("other rental")
		}
		return nil
	})
	if err := stopped.Validate(); err != nil {
		t.Fatal(err)
	}
	if m := stopped.GetMessage(); stopped.GetExitCode() != 3 || m == "" || !utf8.ValidString(m) || strings.Trim(m, "█") != "" {
		t.Fatalf("stopped = %v, want exit code 3 and whole bars", stopped)
	}
}

func TestARestartedAgentRunsTheCommandsSentWhileItWasDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := t.TempDir()
	killWorkloads(t, dir)
	first := e.start(t, e.config(t, "n4", "a100x8", dir))
	e.registered(t, "n4", 1)
	first.stop(t)

	e.send(t, "n4", "start", e.place(t, "n4", 1, "r-late", 1000, 0, "sleep", "30"))
	e.start(t, e.config(t, "n4", "a100x8", dir))
	started := await(t, e, topology.StreamRentals, "rental.acme.started", func(ev *shizuv1.RentalStarted) error { return nil })
	if started.GetRentalId() != "r-late" || started.GetNodeEpoch() != 1 {
		t.Fatalf("started = %v", started)
	}
	if st, _ := e.store.Node(t.Context(), "n4"); st.Epoch != 1 || len(st.Allocations) != 1 {
		t.Fatalf("a clean restart must keep the epoch and the allocation: %+v", st)
	}
}

func TestAZombieWorkloadIsStoppedWhenTheNodeWasFencedWhileTheAgentWasAway(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := t.TempDir()
	killWorkloads(t, dir)
	first := e.start(t, e.config(t, "n5", "h100x8", dir))
	e.registered(t, "n5", 1)
	e.send(t, "n5", "start", e.place(t, "n5", 1, "r-zombie", 1000, 0, "sleep", "30"))
	started := await(t, e, topology.StreamRentals, "rental.acme.started", func(ev *shizuv1.RentalStarted) error { return nil })
	first.stop(t) // the workload keeps running without its agent

	// Failover gives up on the node and moves its rentals.
	if _, err := e.store.Fence(t.Context(), "n5", 1); err != nil {
		t.Fatal(err)
	}
	e.start(t, e.config(t, "n5", "h100x8", dir))
	e.registered(t, "n5", 2)
	stopped := await(t, e, topology.StreamRentals, "rental.acme.stopped", func(ev *shizuv1.RentalStopped) error { return nil })
	if stopped.GetRentalId() != "r-zombie" || stopped.GetExitReason() != shizuv1.ExitReason_EXIT_REASON_NODE_FAILED ||
		stopped.GetNodeEpoch() != 1 || !stopped.GetStartedAt().AsTime().Equal(started.GetStartedAt().AsTime()) {
		t.Fatalf("stopped = %v", stopped)
	}
}

func TestAZombieIsStoppedWhenTheNodeIsFencedUnderARunningAgent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := t.TempDir()
	killWorkloads(t, dir)
	e.start(t, e.config(t, "n6", "a100pcie4", dir))
	e.registered(t, "n6", 1)
	e.send(t, "n6", "start", e.place(t, "n6", 1, "r-partitioned", 1000, 0, "sleep", "30"))
	await(t, e, topology.StreamRentals, "rental.acme.started", func(ev *shizuv1.RentalStarted) error { return nil })
	if _, err := e.store.Fence(t.Context(), "n6", 1); err != nil {
		t.Fatal(err)
	}
	stopped := await(t, e, topology.StreamRentals, "rental.acme.stopped", func(ev *shizuv1.RentalStopped) error { return nil })
	if stopped.GetExitReason() != shizuv1.ExitReason_EXIT_REASON_NODE_FAILED {
		t.Fatalf("stopped = %v", stopped)
	}
	e.registered(t, "n6", 2) // and the agent takes work again under a new epoch
}

func TestEachInjectedFaultIsReportedAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	tests := []struct {
		name   string
		node   string
		inject func(*testing.T, fleetFaults) error
		gpu    int32
		health shizuv1.Health
		xid    int32
	}{
		{"an Xid from the GPU degrades it", "f-xid", func(_ *testing.T, f fleetFaults) error { return f.RaiseXID(1, 63) },
			1, shizuv1.Health_HEALTH_DEGRADED, 63},
		{"an uncorrected ECC error fails the GPU", "f-ecc", func(_ *testing.T, f fleetFaults) error { return f.InjectECC(2, 0, 1) },
			2, shizuv1.Health_HEALTH_FAILED, 0},
		{"a GPU falling off the bus fails it with Xid 79", "f-bus", func(_ *testing.T, f fleetFaults) error { return f.FallOffBus(3) },
			3, shizuv1.Health_HEALTH_FAILED, 79},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := simulated(t, "h100x8", tc.node)
			cfg := e.config(t, tc.node, "", t.TempDir())
			cfg.Simulated = f
			e.start(t, cfg)
			e.registered(t, tc.node, 1)
			subj := "node." + tc.node + ".health"
			testkit.Eventually(t, 20*time.Second, func() error {
				if ev, ok := last[*shizuv1.NodeHealthChanged](t, e, topology.StreamNodes, subj); ok && ev.GetGpuIndex() == -1 {
					return nil
				}
				// Inject until the agent's watcher is registered and reports.
				if err := tc.inject(t, f); err != nil {
					t.Fatal(err)
				}
				return errors.New("no node-level health change yet")
			})
			// The GPU's own change precedes the node's.
			var gpuChange *shizuv1.NodeHealthChanged
			msgs := all[*shizuv1.NodeHealthChanged](t, e, topology.StreamNodes, subj)
			for _, m := range msgs {
				if m.GetGpuIndex() == tc.gpu {
					gpuChange = m
					break
				}
			}
			if gpuChange == nil || gpuChange.GetHealth() != tc.health || gpuChange.GetXid() != tc.xid ||
				gpuChange.GetPreviousHealth() != shizuv1.Health_HEALTH_HEALTHY {
				t.Fatalf("health changes = %v", msgs)
			}
			if err := gpuChange.Validate(); err != nil {
				t.Fatal(err)
			}
		})
	}
	t.Run("a spot interruption notice drains the node and announces the deadline", func(t *testing.T) {
		t.Parallel()
		f := simulated(t, "h100x8", "f-spot")
		cfg := e.config(t, "f-spot", "", t.TempDir())
		cfg.Simulated, cfg.Market = f, "spot"
		e.start(t, cfg)
		e.registered(t, "f-spot", 1)
		deadline := time.Now().Add(2 * time.Minute).UTC().Truncate(time.Second)
		if err := f.NoticeInterruption(t.Context(), deadline, "instance-action: terminate"); err != nil {
			t.Fatal(err)
		}
		n := await(t, e, topology.StreamNodes, "node.f-spot.interruption", func(ev *shizuv1.NodeInterruptionNoticed) error { return nil })
		if !n.GetDeadline().AsTime().Equal(deadline) || n.GetEpoch() != 1 || n.GetReason() != "instance-action: terminate" {
			t.Fatalf("notice = %v", n)
		}
		if st, _ := e.store.Node(t.Context(), "f-spot"); st.Status != capacity.StatusDraining || st.Market != capacity.MarketSpot {
			t.Fatalf("node = %s %s, want a draining spot node", st.Status, st.Market)
		}
		drained := await(t, e, topology.StreamNodes, "node.f-spot.drained", func(ev *shizuv1.NodeDrained) error { return nil })
		if !strings.Contains(drained.GetReason(), "spot interruption") {
			t.Fatalf("drained = %v", drained)
		}
	})
}

type fleetFaults interface {
	RaiseXID(i, xid int) error
	InjectECC(i int, corrected, uncorrected uint64) error
	FallOffBus(i int) error
}

func TestAnOperatorDrainStopsNewWorkAndReportsTheNodeDrained(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := t.TempDir()
	killWorkloads(t, dir)
	e.start(t, e.config(t, "n7", "h200x8", dir))
	reg := e.registered(t, "n7", 1)
	if !reg.GetTeeCapable() {
		t.Fatal("h200x8 runs with confidential computing on; the node must say it is TEE capable")
	}
	e.send(t, "n7", "drain", &shizuv1.DrainNode{
		Meta:   shizuv1.NewMeta("cmd:drain:n7:1", "autoscaler", "", "", time.Now()),
		NodeId: "n7", Epoch: 1, Deadline: nowTS(), Reason: "scale-in of pool web"})
	drained := await(t, e, topology.StreamNodes, "node.n7.drained", func(ev *shizuv1.NodeDrained) error { return nil })
	if drained.GetReason() != "scale-in of pool web" || drained.GetEpoch() != 1 {
		t.Fatalf("drained = %v", drained)
	}
	if st, _ := e.store.Node(t.Context(), "n7"); st.Status != capacity.StatusDraining {
		t.Fatalf("status = %s", st.Status)
	}
}

func TestAStartForGPUsThisNodeDoesNotHaveIsDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := t.TempDir()
	e.start(t, e.config(t, "n8", "rtx4090x8", dir))
	e.registered(t, "n8", 1)
	cmd := e.place(t, "n8", 1, "r-bad", 1000, 0, "true")
	cmd.GetScheduled().GetGpus()[0].GpuUuid = "GPU-00000000-0000-0000-0000-000000000000"
	e.send(t, "n8", "start", cmd)
	testkit.Eventually(t, 20*time.Second, func() error {
		if _, ok := last[*shizuv1.StartRental](t, e, topology.StreamDeadLetter, "dlq.AGENT_CMDS.agent-n8"); !ok {
			return errors.New("not dead-lettered yet")
		}
		return nil
	})
}

// BenchmarkAgentMemory starts one full agent simulating 8 H100s (against a
// real NATS and Redis in the same process) and reports the live heap it
// adds once it has registered, beaten and sampled, next to what the NATS
// server and the clients took, measured in the same run. Run it with
// -benchtime=1x: each iteration starts a whole agent.
func BenchmarkAgentMemory(b *testing.B) {
	var agentHeap, baseHeap float64
	for b.Loop() {
		before := liveHeap()
		e := newEnv(b)
		servers := liveHeap()
		dir := b.TempDir()
		r := e.start(b, e.config(b, "mem", "h100x8", dir))
		await(b, e, topology.StreamTelemetry, "node.mem.telemetry", func(*shizuv1.NodeTelemetry) error { return nil })
		withAgent := liveHeap()
		r.stop(b)
		agentHeap += float64(withAgent) - float64(servers)
		baseHeap += float64(servers) - float64(before)
	}
	b.ReportMetric(agentHeap/float64(b.N)/(1<<20), "MiB-heap/agent")
	b.ReportMetric(baseHeap/float64(b.N)/(1<<20), "MiB-heap/nats+redis+admin")
}

func TestWithoutADriverTheAgentRefusesToStartUnlessASimulationIsAsked(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := e.config(t, "real", "", t.TempDir())
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	err := app.Run(ctx, cfg)
	if err == nil {
		t.Skip("this host has an NVIDIA driver; the agent ran on real GPUs")
	}
	if !errors.Is(err, gpu.ErrNoDriver) || !strings.Contains(err.Error(), "-simulate") {
		t.Fatalf("err = %v, want gpu.ErrNoDriver telling how to simulate", err)
	}
	if _, err := e.store.Node(t.Context(), "real"); !capacity.IsNotFound(err) {
		t.Fatalf("a node without GPUs was registered: %v", err)
	}
}

func TestAWorkloadOutlivesAnAgentRestartAndIsStoppedWithItsOriginalStartTime(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := t.TempDir()
	killWorkloads(t, dir)
	first := e.start(t, e.config(t, "n9", "a100x8", dir))
	e.registered(t, "n9", 1)
	e.send(t, "n9", "start", e.place(t, "n9", 1, "r-upgrade", 1000, 0, "sleep", "30"))
	started := await(t, e, topology.StreamRentals, "rental.acme.started", func(ev *shizuv1.RentalStarted) error { return nil })
	first.stop(t) // an upgrade: the agent goes, the workload stays

	e.start(t, e.config(t, "n9", "a100x8", dir))
	e.send(t, "n9", "stop", stopCmd("n9", "r-upgrade", shizuv1.ExitReason_EXIT_REASON_PREEMPTED, time.Second))
	stopped := await(t, e, topology.StreamRentals, "rental.acme.stopped", func(ev *shizuv1.RentalStopped) error { return nil })
	if stopped.GetExitReason() != shizuv1.ExitReason_EXIT_REASON_PREEMPTED || stopped.GetNodeEpoch() != 1 ||
		!stopped.GetStartedAt().AsTime().Equal(started.GetStartedAt().AsTime()) {
		t.Fatalf("stopped = %v, started at %v", stopped, started.GetStartedAt().AsTime())
	}
}

func TestAnAgentStartedBeforeProvisioningWaitsForTheStreamsThenRegisters(t *testing.T) {
	t.Parallel()
	e := newBareEnv(t)
	cfg := e.config(t, "early", "rtx4090x8", t.TempDir())
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx, cfg) }()
	defer func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("agent: %v", err)
		}
	}()
	if err := service.Healthcheck(t.Context(), cfg.Service.HTTPAddr); err == nil {
		t.Fatal("ready before the streams exist")
	}
	e.Provision(t)
	e.registered(t, "early", 1)
	testkit.Eventually(t, 20*time.Second, func() error { return service.Healthcheck(t.Context(), cfg.Service.HTTPAddr) })
}
