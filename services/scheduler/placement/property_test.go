package placement_test

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/shared/rent"
)

// Whatever the policy and the stream of requests and releases, no GPU ever
// has negative free milli or VRAM, more sharers than its cap, or a MIG GPU
// over 7 slices, and the books add up.
func TestNoPlacementEverExceedsAGPU(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		pol := rapid.SampledFrom(placement.Policies).Draw(t, "policy")
		var nodes []placement.Node
		for i := range rapid.IntRange(1, 4).Draw(t, "nodes") {
			n := node(fmt.Sprintf("n%d", i), rapid.SampledFrom([]int{1, 2, 4, 8}).Draw(t, "gpus"))
			n.FreeCPUMilli, n.CPUMilli = 32_000, 32_000
			for g := range n.GPUs {
				n.GPUs[g].NVLinkDomain = g / 4
				n.GPUs[g].MaxSharers = rapid.IntRange(0, 6).Draw(t, "cap")
				if rapid.IntRange(0, 3).Draw(t, "mig mode") == 0 {
					n.GPUs[g].MIGEnabled = true
					for k, p := range rapid.SliceOfN(rapid.SampledFrom([]string{"1g.10gb", "2g.20gb", "3g.40gb"}), 0, 7).Draw(t, "instances") {
						n.GPUs[g].MIGInstances = append(n.GPUs[g].MIGInstances, placement.MIGInstance{UUID: fmt.Sprintf("MIG-%d-%d-%d", i, g, k), Profile: p})
					}
					n.GPUs[g].MaxSharers = max(1, len(n.GPUs[g].MIGInstances))
				}
			}
			nodes = append(nodes, n)
		}
		c := &placement.Cluster{Nodes: nodes}
		pl, err := placement.NewPlacer(placement.Options{Policy: pol})
		if err != nil {
			t.Fatal(err)
		}
		where := map[string]int{}
		for step := range rapid.IntRange(1, 60).Draw(t, "steps") {
			if len(where) > 0 && rapid.IntRange(0, 3).Draw(t, "release?") == 0 {
				for id, ni := range where {
					if !c.Nodes[ni].Remove(id) {
						t.Fatalf("release %s: not on node", id)
					}
					delete(where, id)
					break
				}
				continue
			}
			r := placement.Request{ID: fmt.Sprintf("r%d", step), Tenant: "t", Class: rent.ClassOnDemand,
				CPUMilli: rapid.Int64Range(0, 8000).Draw(t, "cpu"), MemoryMiB: rapid.Int64Range(0, 64*1024).Draw(t, "mem")}
			switch rapid.IntRange(0, 3).Draw(t, "kind") {
			case 0:
				r.GPUCount, r.MilliPerGPU = 1, rapid.Int64Range(1, 1000).Draw(t, "milli")
				r.VRAMMiB = rapid.Int64Range(1, 40*1024).Draw(t, "vram")
			case 1:
				r.GPUCount, r.MilliPerGPU = rapid.IntRange(1, 8).Draw(t, "count"), 1000
				r.NVLink = r.GPUCount > 1 && rapid.Bool().Draw(t, "nvlink")
			case 2:
				r.GPUCount, r.MilliPerGPU = 1, 1000
				r.MIGProfile = rapid.SampledFrom([]string{"1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}).Draw(t, "mig")
			case 3:
				r.GPUCount, r.MilliPerGPU = 1, 1000
				r.VRAMMiB = rapid.Int64Range(0, 80*1024).Draw(t, "vram")
			}
			p, err := pl.Place(c, &r)
			if errors.Is(err, placement.ErrNoFit) {
				continue
			}
			if err != nil {
				t.Fatalf("place %+v: %v", r, err)
			}
			if len(p.GPUs) != r.GPUCount {
				t.Fatalf("%d GPUs for a %d-GPU request", len(p.GPUs), r.GPUCount)
			}
			ni := -1
			for i := range c.Nodes {
				if c.Nodes[i].ID == p.NodeID {
					ni = i
				}
			}
			c.Nodes[ni].Apply(&r, p, t0)
			where[r.ID] = ni
			check(t, &c.Nodes[ni])
		}
	})
}

func check(t *rapid.T, n *placement.Node) {
	if n.FreeCPUMilli < 0 || n.FreeMemoryMiB < 0 {
		t.Fatalf("node %s over-committed: cpu %d mem %d", n.ID, n.FreeCPUMilli, n.FreeMemoryMiB)
	}
	milli := make([]int64, len(n.GPUs))
	vram := make([]int64, len(n.GPUs))
	for _, a := range n.Allocations {
		for _, s := range a.GPUs {
			milli[s.Index] += s.Milli
			vram[s.Index] += s.VRAMMiB
		}
	}
	for i, g := range n.GPUs {
		if g.FreeMilli < 0 || g.FreeVRAMMiB < 0 || milli[i] > placement.MilliPerGPU || vram[i] > g.VRAMMiB {
			t.Fatalf("GPU %d of %s exceeded: free milli %d vram %d, allocated %d / %d", i, n.ID, g.FreeMilli, g.FreeVRAMMiB, milli[i], vram[i])
		}
		if g.Sharers > g.EffectiveMaxSharers() {
			t.Fatalf("GPU %d of %s: %d sharers, cap %d", i, n.ID, g.Sharers, g.EffectiveMaxSharers())
		}
		if g.MIGSlices > placement.MIGSlicesPerGPU {
			t.Fatalf("GPU %d of %s: %d MIG slices", i, n.ID, g.MIGSlices)
		}
	}
	// MIG rentals only on GPUs in MIG mode, each on its own instance of its
	// profile; nothing else on a GPU in MIG mode.
	holders := map[string]string{}
	for _, a := range n.Allocations {
		for _, s := range a.GPUs {
			g := n.GPUs[s.Index]
			if (s.MIGProfile != "") != g.MIGEnabled {
				t.Fatalf("rental %s: share %+v on GPU %d, MIG mode %v", a.RentalID, s, s.Index, g.MIGEnabled)
			}
			if s.MIGProfile == "" {
				continue
			}
			k := slices.IndexFunc(g.MIGInstances, func(m placement.MIGInstance) bool { return m.UUID == s.MIGInstance })
			if k < 0 || g.MIGInstances[k].Profile != s.MIGProfile || g.MIGInstances[k].Holder != a.RentalID || holders[s.MIGInstance] != "" {
				t.Fatalf("rental %s: instance %q of GPU %d (%+v), held by %q", a.RentalID, s.MIGInstance, s.Index, g.MIGInstances, holders[s.MIGInstance])
			}
			holders[s.MIGInstance] = a.RentalID
		}
	}
}

// The incremental FGD score equals the definition: 100·σ((F_n(M) before −
// F_n(M) after)/1000), with both fragments measured from scratch.
func TestIncrementalFGDScoreMatchesTheDefinition(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		var classes []placement.TaskClass
		for range rapid.IntRange(1, 6).Draw(t, "classes") {
			k := rapid.SampledFrom([]int{0, 1, 1, 2, 4}).Draw(t, "k")
			d := int64(0)
			if k == 1 {
				d = rapid.Int64Range(1, 1000).Draw(t, "d")
			} else if k > 1 {
				d = 1000
			}
			classes = append(classes, class(rapid.Int64Range(0, 16000).Draw(t, "cpu"), k, d,
				float64(rapid.IntRange(1, 10).Draw(t, "w")), rapid.SampledFrom([]string{"", "G2", "T4|G2", "T4"}).Draw(t, "models")))
		}
		w := rebuild(placement.Workload{Classes: classes})
		g := rapid.IntRange(1, 8).Draw(t, "gpus")
		free := make([]int64, g)
		for i := range free {
			free[i] = rapid.Int64Range(0, 1000).Draw(t, "free")
		}
		n := freeNode("n", rapid.Int64Range(0, 32000).Draw(t, "node cpu"), free...)
		cpu := rapid.Int64Range(0, n.FreeCPUMilli).Draw(t, "task cpu")
		var shares []placement.Share
		for i := range free {
			if free[i] > 0 && rapid.Bool().Draw(t, "take") {
				shares = append(shares, placement.Share{Index: i, Milli: rapid.Int64Range(1, free[i]).Draw(t, "milli")})
			}
		}
		after := n.Clone()
		after.FreeCPUMilli -= cpu
		for _, s := range shares {
			after.GPUs[s.Index].FreeMilli -= s.Milli
		}
		delta := w.NodeFragAmount(&n) - w.NodeFragAmount(&after)
		want := int64(100 / (1 + math.Exp(-delta/1000)))
		if got := w.ScoreFGD(&n, cpu, shares); got != want {
			t.Fatalf("score %d, definition %d (Δ %v)", got, want, delta)
		}
	})
}
