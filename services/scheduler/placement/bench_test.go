package placement_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/shared/rent"
)

// benchShapes is a trace-like mix (BenchmarkFragMeterUpdate's workload): fractions, whole GPUs, a few multi-GPU.
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
				r := placement.Request{ID: id, Tenant: "spot", Class: rent.ClassSpot, GPUCount: 1, MilliPerGPU: 500, VRAMMiB: 1024, CPUMilli: 1000, MemoryMiB: 1024}
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
