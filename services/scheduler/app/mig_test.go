package app_test

import (
	"fmt"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/capacity"
)

// GPU 0 of the node is in MIG mode with two 1g.10gb instances and one
// 3g.40gb; GPU 1 is MIG-capable but not in MIG mode. Two replicas place
// three 1g.10gb rentals: two get one existing instance each (named in
// RentalScheduled and the start command), the third waits; a time-shared
// fraction lands on GPU 1 only; a 2g.20gb, which no GPU is partitioned
// into, waits too.
func TestMIGRentalsGetTheirOwnExistingInstance(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	n := gpuNode("n1", 2, capacity.MarketOnDemand)
	n.GPUs[0].MIGEnabled = true
	n.GPUs[0].MIGInstances = []capacity.MIGInstance{
		{UUID: "MIG-n1-0-a", Profile: "1g.10gb", VRAMMiB: 9856},
		{UUID: "MIG-n1-0-b", Profile: "1g.10gb", VRAMMiB: 9856},
		{UUID: "MIG-n1-0-c", Profile: "3g.40gb", VRAMMiB: 40192},
	}
	e.register(n)
	cfg := testConfig()
	e.replica(cfg, time.Now)
	e.replica(cfg, time.Now)

	mig := func(profile string) *shizuv1.RentalSpec {
		sp := spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND)
		sp.MigProfile = profile
		return sp
	}
	e.publish(requested("m0", "acme", mig("1g.10gb"), time.Now()), requested("m1", "acme", mig("1g.10gb"), time.Now()),
		requested("m2", "acme", mig("1g.10gb"), time.Now()), requested("big", "acme", mig("2g.20gb"), time.Now()),
		requested("frac", "acme", spec(1, 250, 4096, shizuv1.Plan_PLAN_ON_DEMAND), time.Now()))
	e.seen.waitFor(t, 30*time.Second, func(o *outcomes) error {
		placed, waiting := 0, 0
		for _, id := range []string{"m0", "m1", "m2"} {
			if len(o.scheduled[id]) > 0 {
				placed++
			}
			if len(o.pending[id]) > 0 {
				waiting++
			}
		}
		if placed != 2 || waiting != 1 || len(o.pending["big"]) == 0 || len(o.scheduled["frac"]) == 0 {
			return fmt.Errorf("%d 1g.10gb scheduled, %d pending; big pending %d; frac scheduled %d",
				placed, waiting, len(o.pending["big"]), len(o.scheduled["frac"]))
		}
		// The start command follows its RentalScheduled on another
		// subject: wait for it too before counting (the count below
		// still catches a second start).
		if starts := o.starts["m0"] + o.starts["m1"] + o.starts["m2"]; starts < placed {
			return fmt.Errorf("%d start commands for %d placed MIG rentals", starts, placed)
		}
		return nil
	})
	e.seen.mu.Lock()
	defer e.seen.mu.Unlock()
	got := map[string]string{}
	for _, id := range []string{"m0", "m1", "m2"} {
		for _, s := range e.seen.scheduled[id] {
			as := s.GetGpus()[0]
			inst := as.GetMigInstance()
			if as.GetGpuIndex() != 0 || as.GetGpuUuid() != "GPU-n1-0" || inst.GetProfile() != "1g.10gb" {
				t.Errorf("%s: assignment %v", id, as)
			}
			if inst.GetUuid() != "MIG-n1-0-a" && inst.GetUuid() != "MIG-n1-0-b" {
				t.Errorf("%s: instance %q is not one the node has", id, inst.GetUuid())
			}
			if other, dup := got[inst.GetUuid()]; dup && other != id {
				t.Errorf("%s and %s both got instance %s", id, other, inst.GetUuid())
			}
			got[inst.GetUuid()] = id
		}
	}
	if len(got) != 2 {
		t.Errorf("instances given: %v", got)
	}
	if g := e.seen.scheduled["frac"][0].GetGpus()[0]; g.GetGpuIndex() != 1 || g.GetMigInstance() != nil {
		t.Errorf("the fraction must time-share GPU 1, got %v", g)
	}
	st, err := e.store.Node(t.Context(), "n1")
	if err != nil {
		t.Fatal(err)
	}
	if free := st.FreeGPUs[0].FreeMIGInstances; len(free) != 1 || free[0] != "MIG-n1-0-c" {
		t.Errorf("free instances in the store: %v", free)
	}
	if n := e.seen.starts["m0"] + e.seen.starts["m1"] + e.seen.starts["m2"]; n != 2 {
		t.Errorf("%d start commands; want one per placed MIG rental (2)", n)
	}
}
