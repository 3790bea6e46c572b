package agent_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/node-agent/agent"
	"github.com/shizu-gpu/shizu/services/node-agent/gpu"
)

const (
	healthy  = shizuv1.Health_HEALTH_HEALTHY
	degraded = shizuv1.Health_HEALTH_DEGRADED
	failed   = shizuv1.Health_HEALTH_FAILED
)

func facts() agent.Facts {
	return agent.Facts{NodeID: "n1", Zone: "eu-west-1a", Market: shizuv1.Market_MARKET_SPOT, PriceMicros: 2_490_000,
		Currency: "USD", CPUMilli: 96_000, MemoryMiB: 512_000, InstanceType: "p5.48xlarge"}
}

func inventory() gpu.Inventory {
	devs := []gpu.Device{
		{Index: 0, UUID: "GPU-0", Model: "A100-PCIE-40GB", VRAMMiB: 40960, PCIBusID: "0000:18:00.0", MIGCapable: true,
			MIG: []gpu.MIGInstance{{UUID: "MIG-a", Profile: "3g.20gb", VRAMMiB: 20096}}, NVLinkPeers: []int{1}},
		{Index: 1, UUID: "GPU-1", Model: "A100-PCIE-40GB", VRAMMiB: 40960, PCIBusID: "0000:2a:00.0", MIGCapable: true, NVLinkPeers: []int{0}},
	}
	return gpu.Inventory{DriverVersion: "550.54.15", TEE: gpu.TEEState{Enabled: true}, Devices: devs, NVLinkDomains: [][]int{{0, 1}}}
}

func TestDescribeRegistersEverythingDiscoveredAndConfigured(t *testing.T) {
	t.Parallel()
	ev, err := agent.Describe(facts(), inventory())
	if err != nil {
		t.Fatal(err)
	}
	ev.Epoch = 1
	ev.Meta = shizuv1.NewMeta("node:n1:registered:1", "node-agent/n1", "", "n1", time.Unix(1, 0))
	if err := ev.Validate(); err != nil {
		t.Fatal(err)
	}
	if !ev.GetTeeCapable() || ev.GetMarket() != shizuv1.Market_MARKET_SPOT || ev.GetPricePerGpuHour().GetMicros() != 2_490_000 ||
		len(ev.GetGpus()) != 2 || ev.GetGpus()[0].GetMigInstances()[0].GetUuid() != "MIG-a" ||
		!slices.Equal(ev.GetNvlinkDomains()[0].GetGpuIndexes(), []int32{0, 1}) || ev.GetDriverVersion() != "550.54.15" {
		t.Fatalf("registration = %v", ev)
	}
}

func TestDescribeRefusesBadFactsAndEmptyHosts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		change func(*agent.Facts, *gpu.Inventory)
		want   string
	}{
		{"a zone that is not a subject token", func(f *agent.Facts, _ *gpu.Inventory) { f.Zone = "eu west" }, "zone"},
		{"no market", func(f *agent.Facts, _ *gpu.Inventory) { f.Market = 0 }, "market"},
		{"a negative price", func(f *agent.Facts, _ *gpu.Inventory) { f.PriceMicros = -1 }, "price"},
		{"a currency that is not ISO 4217", func(f *agent.Facts, _ *gpu.Inventory) { f.Currency = "usd" }, "currency"},
		{"no host memory", func(f *agent.Facts, _ *gpu.Inventory) { f.MemoryMiB = 0 }, "memory"},
		{"a host without GPUs", func(_ *agent.Facts, inv *gpu.Inventory) { inv.Devices = nil }, "no GPU"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, inv := facts(), inventory()
			tc.change(&f, &inv)
			if _, err := agent.Describe(f, inv); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one about %s", err, tc.want)
			}
		})
	}
}

func TestXidsAreClassifiedByWhoCausedThem(t *testing.T) {
	t.Parallel()
	for xid, want := range map[int]shizuv1.Health{13: healthy, 31: healthy, 43: healthy, 48: failed, 79: failed, 74: failed,
		95: failed, 63: degraded, 92: degraded, 94: degraded} {
		if got := agent.ClassifyXID(xid); got != want {
			t.Errorf("Xid %d = %s, want %s", xid, got, want)
		}
	}
}

func TestHealthBookReportsEachWorseningOnceWithTheNodeAggregate(t *testing.T) {
	t.Parallel()
	b := agent.NewHealthBook(2)
	if got := b.Event(gpu.Event{Index: 0, Kind: gpu.EventXID, XID: 13}); got != nil {
		t.Fatalf("a workload Xid changed health: %+v", got)
	}
	got := b.Event(gpu.Event{Index: 0, Kind: gpu.EventXID, XID: 63})
	if len(got) != 2 || got[0].Now != degraded || got[0].XID != 63 || got[1].Index != -1 || got[1].Now != degraded {
		t.Fatalf("degrade = %+v", got)
	}
	got = b.Event(gpu.Event{Index: 0, Kind: gpu.EventXID, XID: 79})
	if len(got) != 1 || got[0].Previous != degraded || got[0].Now != failed {
		t.Fatalf("fail = %+v (the node stays degraded while GPU 1 works)", got)
	}
	if got := b.Sample(gpu.Sample{Index: 0, Lost: true}); got != nil {
		t.Fatalf("a failed GPU failed again: %+v", got)
	}
	got = b.Sample(gpu.Sample{Index: 1, Lost: true})
	if len(got) != 2 || got[1].Index != -1 || got[1].Now != failed || b.Node() != failed {
		t.Fatalf("last GPU lost = %+v", got)
	}
}

func TestECCCountersJudgeHealthByTheirIncrease(t *testing.T) {
	t.Parallel()
	b := agent.NewHealthBook(1)
	if got := b.Sample(gpu.Sample{Index: 0, ECCCorrected: 5000, ECCUncorrected: 3}); got != nil {
		t.Fatalf("counters from before the agent started changed health: %+v", got)
	}
	if got := b.Sample(gpu.Sample{Index: 0, ECCCorrected: 5050, ECCUncorrected: 3}); got != nil {
		t.Fatalf("a few corrected errors changed health: %+v", got)
	}
	if got := b.Sample(gpu.Sample{Index: 0, ECCCorrected: 5200, ECCUncorrected: 3}); len(got) == 0 || got[0].Now != degraded {
		t.Fatalf("a corrected storm = %+v", got)
	}
	if got := b.Sample(gpu.Sample{Index: 0, ECCCorrected: 5200, ECCUncorrected: 4}); len(got) == 0 || got[0].Now != failed || got[0].ECCUncorrected != 4 {
		t.Fatalf("a new uncorrected error = %+v", got)
	}
}

func TestHealthNeverImprovesAndTheNodeFailsOnlyWhenEveryGPUFailed(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 8).Draw(t, "gpus")
		b := agent.NewHealthBook(n)
		prev := make([]shizuv1.Health, n)
		for i := range prev {
			prev[i] = healthy
		}
		for step := range rapid.IntRange(1, 40).Draw(t, "steps") {
			i := rapid.IntRange(0, n-1).Draw(t, "gpu")
			var changes []agent.HealthChange
			if rapid.Bool().Draw(t, "event") {
				changes = b.Event(gpu.Event{Index: i, Kind: gpu.EventKind(rapid.IntRange(1, 4).Draw(t, "kind")),
					XID: rapid.SampledFrom([]int{13, 31, 48, 63, 79, 92, 94, 95, 119}).Draw(t, "xid")})
			} else {
				changes = b.Sample(gpu.Sample{Index: i, Lost: rapid.Bool().Draw(t, "lost"),
					ECCUncorrected: int64(rapid.IntRange(0, 3).Draw(t, "unc")) + int64(step)/10})
			}
			for _, c := range changes {
				if c.Now <= c.Previous {
					t.Fatalf("change %+v does not worsen", c)
				}
			}
			all := true
			for g := range n {
				if b.Health(g) < prev[g] {
					t.Fatalf("GPU %d improved from %s to %s", g, prev[g], b.Health(g))
				}
				prev[g] = b.Health(g)
				all = all && prev[g] == failed
			}
			if (b.Node() == failed) != all {
				t.Fatalf("node %s with GPUs %v", b.Node(), prev)
			}
		}
	})
}

func scheduled(node string, epoch int64, uuid string, mig *shizuv1.MigInstance) *shizuv1.StartRental {
	a := &shizuv1.GpuAssignment{GpuIndex: 0, GpuUuid: uuid, MilliGpu: 1000, VramMib: 40960, MigInstance: mig}
	return &shizuv1.StartRental{Scheduled: &shizuv1.RentalScheduled{RentalId: "r1", TenantId: "acme", NodeId: node,
		NodeEpoch: epoch, Attempt: 2, Gpus: []*shizuv1.GpuAssignment{a}}}
}

func state() agent.State {
	return agent.State{NodeID: "n1", Epoch: 3, Running: map[string]agent.Rental{},
		GPUs: []agent.GPUState{{UUID: "GPU-0", MIG: []string{"MIG-a"}, Health: healthy}, {UUID: "GPU-1", Health: healthy}}}
}

func TestStartCommandsRunOnlyOnTheirNodeEpochAndGPUs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		state func(*agent.State)
		cmd   *shizuv1.StartRental
		want  agent.Verdict
	}{
		{"a placement on this node's current epoch runs", nil, scheduled("n1", 3, "GPU-0", nil), agent.Run},
		{"a MIG placement on an instance of the GPU runs", nil, scheduled("n1", 3, "GPU-0", &shizuv1.MigInstance{Uuid: "MIG-a"}), agent.Run},
		{"a placement for another node is invalid", nil, scheduled("n2", 3, "GPU-0", nil), agent.Invalid},
		{"a placement naming another GPU's UUID is invalid", nil, scheduled("n1", 3, "GPU-9", nil), agent.Invalid},
		{"a placement on a MIG instance that is not there is invalid", nil, scheduled("n1", 3, "GPU-0", &shizuv1.MigInstance{Uuid: "MIG-z"}), agent.Invalid},
		{"a placement made before a fence is skipped", nil, scheduled("n1", 2, "GPU-0", nil), agent.Skip},
		{"a placement from a newer epoch is retried", nil, scheduled("n1", 4, "GPU-0", nil), agent.Retry},
		{"a draining node takes no new work", func(s *agent.State) { s.Draining = true }, scheduled("n1", 3, "GPU-0", nil), agent.Skip},
		{"a failed GPU takes no new work", func(s *agent.State) { s.GPUs[0].Health = failed }, scheduled("n1", 3, "GPU-0", nil), agent.Skip},
		{"a redelivered start of the running attempt is already done",
			func(s *agent.State) { s.Running["r1"] = agent.Rental{RentalID: "r1", Attempt: 2} }, scheduled("n1", 3, "GPU-0", nil), agent.AlreadyDone},
		{"an older attempt than the running one is skipped",
			func(s *agent.State) { s.Running["r1"] = agent.Rental{RentalID: "r1", Attempt: 3} }, scheduled("n1", 3, "GPU-0", nil), agent.Skip},
		{"a newer attempt waits for the running one to stop",
			func(s *agent.State) { s.Running["r1"] = agent.Rental{RentalID: "r1", Attempt: 1} }, scheduled("n1", 3, "GPU-0", nil), agent.Retry},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := state()
			if tc.state != nil {
				tc.state(&s)
			}
			if got := agent.DecideStart(s, tc.cmd); got.Verdict != tc.want {
				t.Fatalf("verdict = %v (%s), want %v", got.Verdict, got.Reason, tc.want)
			}
		})
	}
}

func TestStopAndDrainCommandsApplyToWhatRunsNow(t *testing.T) {
	t.Parallel()
	s := state()
	s.Running["r1"] = agent.Rental{RentalID: "r1", Attempt: 2}
	stop := func(node, rental string, attempt int32) *shizuv1.StopRental {
		return &shizuv1.StopRental{NodeId: node, RentalId: rental, Attempt: attempt}
	}
	drain := func(node string, epoch int64) *shizuv1.DrainNode {
		return &shizuv1.DrainNode{NodeId: node, Epoch: epoch}
	}
	for name, c := range map[string]struct {
		got, want agent.Verdict
	}{
		"a stop of the running attempt runs":         {agent.DecideStop(s, stop("n1", "r1", 2)).Verdict, agent.Run},
		"a stop of an older attempt is skipped":      {agent.DecideStop(s, stop("n1", "r1", 1)).Verdict, agent.Skip},
		"a stop of a rental not here is skipped":     {agent.DecideStop(s, stop("n1", "r9", 1)).Verdict, agent.Skip},
		"a stop for another node is invalid":         {agent.DecideStop(s, stop("n2", "r1", 2)).Verdict, agent.Invalid},
		"a drain of the current epoch runs":          {agent.DecideDrain(s, drain("n1", 3)).Verdict, agent.Run},
		"a drain of an older epoch is skipped":       {agent.DecideDrain(s, drain("n1", 2)).Verdict, agent.Skip},
		"a drain for another node is invalid":        {agent.DecideDrain(s, drain("n9", 3)).Verdict, agent.Invalid},
		"a drain of a draining node is already done": {agent.DecideDrain(agent.State{NodeID: "n1", Epoch: 3, Draining: true}, drain("n1", 3)).Verdict, agent.AlreadyDone},
	} {
		if c.got != c.want {
			t.Errorf("%s: verdict %v, want %v", name, c.got, c.want)
		}
	}
}

func TestWorkloadEnvironmentConfinesTheWorkloadToItsShare(t *testing.T) {
	t.Parallel()
	sc := func(gpus ...*shizuv1.GpuAssignment) *shizuv1.RentalScheduled {
		return &shizuv1.RentalScheduled{RentalId: "r1", TenantId: "acme", Attempt: 1, Gpus: gpus}
	}
	tests := []struct {
		name    string
		sc      *shizuv1.RentalScheduled
		visible string
		threads string
		mem     string
	}{
		{"two whole GPUs see both UUIDs and no MPS limits",
			sc(&shizuv1.GpuAssignment{GpuUuid: "GPU-a", MilliGpu: 1000}, &shizuv1.GpuAssignment{GpuIndex: 1, GpuUuid: "GPU-b", MilliGpu: 1000}),
			"GPU-a,GPU-b", "", ""},
		{"a MIG instance is seen by its MIG UUID",
			sc(&shizuv1.GpuAssignment{GpuUuid: "GPU-a", MilliGpu: 1000, MigInstance: &shizuv1.MigInstance{Uuid: "MIG-x"}}), "MIG-x", "", ""},
		{"a quarter GPU gets a quarter of the SMs and its memory",
			sc(&shizuv1.GpuAssignment{GpuUuid: "GPU-a", MilliGpu: 250, VramMib: 20480}), "GPU-a", "25", "0=20480M"},
		{"a sliver rounds the SM share up to a whole percent",
			sc(&shizuv1.GpuAssignment{GpuUuid: "GPU-a", MilliGpu: 1, VramMib: 512}), "GPU-a", "1", "0=512M"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env, uuids := agent.WorkloadEnv(tc.sc)
			if env["CUDA_VISIBLE_DEVICES"] != tc.visible || strings.Join(uuids, ",") != tc.visible ||
				env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != tc.threads || env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != tc.mem {
				t.Fatalf("env = %v", env)
			}
		})
	}
}

func TestReconcileStopsEveryZombieAndKeepsValidWork(t *testing.T) {
	t.Parallel()
	running := []agent.Rental{{RentalID: "keep"}, {RentalID: "zombie"}, {RentalID: "gone"}}
	stops := agent.Reconcile(running, map[string]agent.Allocation{"keep": agent.AllocationValid,
		"zombie": agent.AllocationFenced, "gone": agent.AllocationGone})
	if len(stops) != 2 || stops[0].Rental.RentalID != "gone" || stops[0].Reason != shizuv1.ExitReason_EXIT_REASON_CANCELLED ||
		stops[1].Rental.RentalID != "zombie" || stops[1].Reason != shizuv1.ExitReason_EXIT_REASON_NODE_FAILED {
		t.Fatalf("stops = %+v", stops)
	}
}

func TestExitReasonPrefersWhyTheWorkloadWasStopped(t *testing.T) {
	t.Parallel()
	tests := []struct {
		requested shizuv1.ExitReason
		code      int
		want      shizuv1.ExitReason
		wantCode  int32
	}{
		{shizuv1.ExitReason_EXIT_REASON_UNSPECIFIED, 0, shizuv1.ExitReason_EXIT_REASON_COMPLETED, 0},
		{shizuv1.ExitReason_EXIT_REASON_UNSPECIFIED, 137, shizuv1.ExitReason_EXIT_REASON_FAILED, 137},
		{shizuv1.ExitReason_EXIT_REASON_PREEMPTED, -1, shizuv1.ExitReason_EXIT_REASON_PREEMPTED, 0},
	}
	for _, tc := range tests {
		if got, code := agent.ExitReason(tc.requested, tc.code); got != tc.want || code != tc.wantCode {
			t.Errorf("ExitReason(%s, %d) = %s, %d", tc.requested, tc.code, got, code)
		}
	}
}
