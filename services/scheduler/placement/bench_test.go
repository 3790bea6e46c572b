package placement_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
)

// benchShapes is a trace-like mix: fractions, whole GPUs, a few multi-GPU.
var benchShapes = []struct {
	gpus  int
	milli int64
	cpu   int64
	w     int
}{{1, 1000, 8000, 45}, {1, 500, 4000, 15}, {1, 250, 2000, 10}, {1, 100, 2000, 10}, {0, 0, 4000, 10}, {2, 1000, 16000, 4}, {4, 1000, 32000, 3}, {8, 1000, 64000, 3}}

func benchRequest(rng *rand.Rand, i int) placement.Request {
	k := rng.IntN(100)
	for _, s := range benchShapes {
		if k < s.w {
			if s.gpus == 0 { // the placer rents GPUs: use the smallest fraction
				return req(fmt.Sprintf("b%d", i), fraction(50, 1024), func(r *placement.Request) { r.CPUMilli = s.cpu })
			}
			r := req(fmt.Sprintf("b%d", i), gpus(s.gpus), func(r *placement.Request) { r.MilliPerGPU, r.CPUMilli = s.milli, s.cpu })
			if s.milli < 1000 {
				r.VRAMMiB = 8 * 1024
			}
			return r
		}
		k -= s.w
	}
	panic("unreachable")
}

// BenchmarkPlace makes placement decisions on a 1,000-node × 8-GPU cluster
// kept about 60 % full (each placement is applied; the oldest are released
// once 60 % is reached), per policy. decisions/s counts Place calls.
func BenchmarkPlace(b *testing.B) {
	for _, limit := range []int{0, 64} {
		for _, pol := range placement.Policies {
			b.Run(fmt.Sprintf("candidates=%s/policy=%s", candidates(limit), pol), func(b *testing.B) { benchPlace(b, pol, limit) })
		}
	}
}

func candidates(limit int) string {
	if limit == 0 {
		return "all"
	}
	return fmt.Sprint(limit)
}

func benchPlace(b *testing.B, pol placement.Policy, limit int) {
	{
		{
			c := &placement.Cluster{}
			for i := range 1000 {
				c.Nodes = append(c.Nodes, node(fmt.Sprintf("node-%04d", i), 8))
			}
			index := map[string]int{}
			for i := range c.Nodes {
				index[c.Nodes[i].ID] = i
			}
			rng := rand.New(rand.NewPCG(1, 2))
			var shapes []placement.TaskShape
			for i := range 2000 {
				r := benchRequest(rng, i)
				shapes = append(shapes, placement.ShapeOf(&r))
			}
			w := placement.NewWorkload(shapes, placement.DefaultCoveragePct)
			pl, err := placement.NewPlacer(placement.Options{Policy: pol, Workload: &w, MaxCandidates: limit})
			if err != nil {
				b.Fatal(err)
			}
			type held struct {
				id   string
				node int
			}
			var live []held
			var used, capacity int64 = 0, 1000 * 8 * 1000
			reqs := make([]placement.Request, 4096)
			for i := range reqs {
				reqs[i] = benchRequest(rng, i)
			}
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				r := reqs[i%len(reqs)]
				r.ID = fmt.Sprintf("r%d", i)
				p, err := pl.Place(c, &r)
				if err != nil {
					continue
				}
				ni := index[p.NodeID]
				c.Nodes[ni].Apply(&r, p, t0)
				live = append(live, held{r.ID, ni})
				for _, s := range p.GPUs {
					used += s.Milli
				}
				for used*10 > capacity*6 && len(live) > 0 {
					h := live[0]
					live = live[1:]
					n := &c.Nodes[h.node]
					for _, a := range n.Allocations {
						if a.RentalID == h.id {
							for _, s := range a.GPUs {
								used -= s.Milli
							}
						}
					}
					n.Remove(h.id)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
		}
	}
}

// BenchmarkPlanPreemption plans room for an on-demand whole GPU on 1,000
// nodes × 8 GPUs where every GPU holds two half-GPU spot rentals of
// different ages.
func BenchmarkPlanPreemption(b *testing.B) {
	c := &placement.Cluster{}
	for i := range 1000 {
		n := node(fmt.Sprintf("node-%04d", i), 8)
		for g := range 8 {
			for k := range 2 {
				id := fmt.Sprintf("s-%d-%d-%d", i, g, k)
				r := placement.Request{ID: id, Tenant: "spot", Class: placement.ClassSpot, GPUCount: 1, MilliPerGPU: 500, VRAMMiB: 1024, CPUMilli: 1000, MemoryMiB: 1024}
				n.Apply(&r, placement.Placement{NodeID: n.ID, CPUMilli: 1000, MemoryMiB: 1024,
					GPUs: []placement.Share{{Index: g, Milli: 500, VRAMMiB: 1024}}}, t0.Add(-time.Duration(1+(i*16+g*2+k)%997)*time.Second))
			}
		}
		c.Nodes = append(c.Nodes, n)
	}
	pl := placer(b, placement.PolicyFGD)
	r := req("od")
	for b.Loop() {
		if _, ok := pl.PlanPreemption(c, &r, t0); !ok {
			b.Fatal("no plan")
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "plans/s")
}
