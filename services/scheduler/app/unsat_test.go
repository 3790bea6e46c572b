package app_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/capacity"
)

// rtxNode is a ready on-demand node of n RTX 4090s: no NVLink, no TEE, no
// MIG.
func rtxNode(id string, n int) capacity.Node {
	node := gpuNode(id, n, capacity.MarketOnDemand)
	node.NVLinkDomains = nil
	for i := range node.GPUs {
		node.GPUs[i].Model, node.GPUs[i].VRAMMiB, node.GPUs[i].MIGCapable = "RTX4090-24GB", 24*1024, false
	}
	return node
}

func onDemand(gpus int32, edit func(*shizuv1.RentalSpec)) *shizuv1.RentalSpec {
	sp := spec(gpus, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND)
	if edit != nil {
		edit(sp)
	}
	return sp
}

// rejectedWith waits until rental id is rejected and returns the
// rejection.
func (e *env) rejectedWith(t *testing.T, id string) *shizuv1.RentalRejected {
	t.Helper()
	var got *shizuv1.RentalRejected
	e.seen.waitFor(t, 30*time.Second, func(o *outcomes) error {
		if len(o.rejected[id]) == 0 {
			return fmt.Errorf("%s: not rejected (pending %d, scheduled %d)", id, len(o.pending[id]), len(o.scheduled[id]))
		}
		got = o.rejected[id][0]
		return nil
	})
	return got
}

// Each request no registered node could ever hold (whatever frees up) is
// rejected at once as unsatisfiable, naming its constraint in words, and
// never waits: an H100x8 node with TEE and a 1g.10gb MIG instance, and an
// RTX4090x4 node, in zone-a.
func TestEachUnsatisfiableConstraintIsRejectedAtOnceNamingItself(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h100 := gpuNode("h100", 8, capacity.MarketOnDemand)
	h100.TEECapable = true
	h100.GPUs[0].MIGEnabled = true
	h100.GPUs[0].MIGInstances = []capacity.MIGInstance{{UUID: "MIG-h100-0-a", Profile: "1g.10gb", VRAMMiB: 9856}}
	e.register(h100, rtxNode("rtx", 4))
	cfg := testConfig()
	cfg.UnsatisfiableGrace = 0
	e.replica(cfg, time.Now)

	rtx := []string{"RTX4090-24GB"}
	cases := map[string]struct {
		spec *shizuv1.RentalSpec
		want string
	}{
		"count":  {onDemand(9, nil), "needs 9 GPUs on one node; the largest node has 8"},
		"nvlink": {onDemand(2, func(s *shizuv1.RentalSpec) { s.AllowedModels = rtx }), "NVLink: no RTX4090-24GB node has 2 GPUs linked by NVLink"},
		"tee": {onDemand(1, func(s *shizuv1.RentalSpec) { s.AllowedModels, s.TeeRequired = rtx, true }),
			"TEE: no RTX4090-24GB node has confidential computing"},
		"zone": {onDemand(1, func(s *shizuv1.RentalSpec) { s.Zone = "mars" }), `zone "mars": no node is in that zone (zones: zone-a)`},
		"model": {onDemand(1, func(s *shizuv1.RentalSpec) { s.AllowedModels = []string{"L4-24GB"} }),
			"GPU model L4-24GB: no node has it (models: H100-SXM5-80GB, RTX4090-24GB)"},
		"mig": {onDemand(1, func(s *shizuv1.RentalSpec) { s.MigProfile = "3g.40gb" }),
			"MIG profile 3g.40gb: no node has a GPU with a MIG instance of that profile"},
		"cpu":    {onDemand(1, func(s *shizuv1.RentalSpec) { s.CpuMilli = 300_000 }), "host CPU: needs 300 cores on one node; the largest node has 256"},
		"memory": {onDemand(1, func(s *shizuv1.RentalSpec) { s.MemoryMib = 3 << 20 }), "host memory: needs 3145728 MiB on one node; the largest node has 2097152 MiB"},
	}
	for id, tc := range cases {
		e.publish(requested(id, "acme", tc.spec, time.Now()))
	}
	// A request the fleet can hold is still placed.
	e.publish(requested("fits", "acme", onDemand(4, nil), time.Now())) // GPU 0 is in MIG mode
	for id, tc := range cases {
		got := e.rejectedWith(t, id)
		if got.GetReason() != shizuv1.RejectReason_REJECT_REASON_UNSATISFIABLE || !strings.Contains(got.GetMessage(), tc.want) {
			t.Errorf("%s: rejected %s %q; want unsatisfiable naming %q", id, got.GetReason(), got.GetMessage(), tc.want)
		}
		if strings.Contains(got.GetMessage(), "REJECT_") || strings.Contains(got.GetMessage(), "_required") {
			t.Errorf("%s: message %q names proto fields", id, got.GetMessage())
		}
	}
	e.seen.waitFor(t, 30*time.Second, func(o *outcomes) error {
		if len(o.scheduled["fits"]) == 0 {
			return fmt.Errorf("fits: not scheduled")
		}
		return nil
	})
	e.seen.mu.Lock()
	defer e.seen.mu.Unlock()
	for id := range cases {
		if n := len(e.seen.pending[id]); n > 0 {
			t.Errorf("%s: %d RentalPending before its rejection; want none", id, n)
		}
	}
}

// A request only an instance type the autoscaler may provision could hold
// (its policy file's fleet section: H200x8 in zone-b) waits for capacity
// and is reported as a shortage, so the autoscaler can provision it; one
// no instance type holds either is rejected.
func TestARequestOnlyAnInstanceTypeHoldsWaitsForTheAutoscaler(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register(rtxNode("rtx", 4))
	policy := filepath.Join(t.TempDir(), "autoscaler.json")
	if err := os.WriteFile(policy, []byte(`{"pools": [], "fleet": {"instance_types": [
		{"name": "p5e.48xlarge", "profile": "h200x8", "model": "H200-SXM5-141GB", "gpus": 8, "zones": ["zone-b"], "price_per_gpu_hour_micros": 3000000}],
		"default_zone": "zone-a", "max_nodes": 4, "idle_after": "10m", "register_timeout": "2m"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.UnsatisfiableGrace = 0
	cfg.FleetPolicyPath = policy
	e.replica(cfg, time.Now)

	e.publish(requested("h200", "acme", onDemand(8, func(s *shizuv1.RentalSpec) { s.Zone = "zone-b"; s.TeeRequired = true }), time.Now()),
		requested("huge", "acme", onDemand(16, nil), time.Now()))
	got := e.rejectedWith(t, "huge")
	if got.GetReason() != shizuv1.RejectReason_REJECT_REASON_UNSATISFIABLE || !strings.Contains(got.GetMessage(), "needs 16 GPUs") {
		t.Errorf("huge: rejected %s %q; want unsatisfiable naming 16 GPUs", got.GetReason(), got.GetMessage())
	}
	e.seen.waitFor(t, 30*time.Second, func(o *outcomes) error {
		if len(o.pending["h200"]) == 0 || o.shortages == 0 {
			return fmt.Errorf("h200: pending %d, shortages %d", len(o.pending["h200"]), o.shortages)
		}
		return nil
	})
	e.seen.mu.Lock()
	defer e.seen.mu.Unlock()
	if p := e.seen.pending["h200"][0]; p.GetReason() != shizuv1.PendingReason_PENDING_REASON_NO_CAPACITY {
		t.Errorf("h200: pending %s %q; want a capacity shortage", p.GetReason(), p.GetMessage())
	}
	if n := len(e.seen.rejected["h200"]); n > 0 {
		t.Errorf("h200: rejected %q; an instance type holds it", e.seen.rejected["h200"][0].GetMessage())
	}
}

// While the fleet may still be registering (the grace after start) an
// unsatisfiable request waits with a message naming its constraint; with
// no node and nothing to provision it waits saying so.
func TestUnsatisfiableRequestsWaitWhileTheFleetMayStillRegister(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		nodes []capacity.Node
		want  string
	}{
		{"grace", []capacity.Node{rtxNode("rtx", 4)}, "needs 9 GPUs on one node; the largest node has 4; not rejected before"},
		{"empty fleet", nil, "no node has registered and the autoscaler offers no instance type"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.register(tc.nodes...)
			cfg := testConfig()
			cfg.UnsatisfiableGrace = time.Hour
			if tc.nodes == nil {
				cfg.UnsatisfiableGrace = 0
			}
			e.replica(cfg, time.Now)
			e.publish(requested("r", "acme", onDemand(9, nil), time.Now()))
			e.seen.waitFor(t, 30*time.Second, func(o *outcomes) error {
				if len(o.pending["r"]) == 0 {
					return fmt.Errorf("r: pending %d, rejected %d", len(o.pending["r"]), len(o.rejected["r"]))
				}
				if msg := o.pending["r"][0].GetMessage(); !strings.Contains(msg, tc.want) {
					return fmt.Errorf("r: pending %q; want it to say %q", msg, tc.want)
				}
				return nil
			})
		})
	}
}

// A request may choose its pending timeout: a short one is rejected by
// its own timeout (the message says how long it waited), one above the
// scheduler's maximum is rejected at once as an invalid spec saying so.
func TestARequestChoosesItsPendingTimeoutWithinTheMaximum(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register(gpuNode("n1", 1, capacity.MarketOnDemand))
	cfg := testConfig()
	cfg.MaxPendingTimeout = 30 * time.Minute
	e.replica(cfg, time.Now)
	e.publish(requested("holder", "acme", onDemand(1, nil), time.Now()))
	e.seen.waitFor(t, 30*time.Second, func(o *outcomes) error {
		if len(o.scheduled["holder"]) == 0 {
			return fmt.Errorf("holder: not scheduled")
		}
		return nil
	})
	e.publish(requested("short", "acme", onDemand(1, func(s *shizuv1.RentalSpec) { s.PendingTimeout = durationpb.New(300 * time.Millisecond) }), time.Now()),
		requested("long", "acme", onDemand(1, func(s *shizuv1.RentalSpec) { s.PendingTimeout = durationpb.New(2 * time.Hour) }), time.Now()))
	short := e.rejectedWith(t, "short")
	if short.GetReason() != shizuv1.RejectReason_REJECT_REASON_PENDING_TIMEOUT || !strings.Contains(short.GetMessage(), "within 300ms") {
		t.Errorf("short: rejected %s %q; want its own 300ms timeout", short.GetReason(), short.GetMessage())
	}
	long := e.rejectedWith(t, "long")
	if long.GetReason() != shizuv1.RejectReason_REJECT_REASON_INVALID_SPEC ||
		!strings.Contains(long.GetMessage(), "pending timeout 2h0m0s is longer than this scheduler allows (at most 30m0s)") {
		t.Errorf("long: rejected %s %q; want an invalid spec naming the maximum", long.GetReason(), long.GetMessage())
	}
}
