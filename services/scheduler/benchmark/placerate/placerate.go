// Package placerate measures the pure placer: decisions/s of
// placement.Placer.Place (plus applying each placement) on a 1,000-node x
// 8-GPU cluster kept about 60 % full, next to a bare scan of the same
// candidate nodes measured in the same run. `go test -bench` (BenchmarkPlace
// here) and `shizu bench` (its placement check) both call Run.
package placerate

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/shizu-gpu/shizu/services/scheduler/app"
	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/shared/benchkit"
	"github.com/shizu-gpu/shizu/shared/rent"
)

// Goal is the decisions/s the placer must reach: the scheduler's end to
// end goal (DESIGN.md), since every placement is one decision.
const Goal = 10_000

// Options are the placer's settings under test.
type Options struct {
	Policy placement.Policy
	// MaxCandidates bounds the feasible nodes scored (0 = all).
	MaxCandidates int
}

// DefaultOptions are the scheduler's defaults.
func DefaultOptions() Options {
	def := app.DefaultConfig()
	return Options{Policy: placement.Policy(def.Policy), MaxCandidates: def.MaxCandidates}
}

// Run measures n decisions with the scheduler's default policy and
// candidates. The env's servers are not used; only its progress is.
func Run(ctx context.Context, env *benchkit.Env, n int) (benchkit.Result, error) {
	return RunWith(ctx, env, n, DefaultOptions())
}

// RunWith measures n decisions with opts, then the bare scan ceiling.
func RunWith(ctx context.Context, env *benchkit.Env, n int, opts Options) (benchkit.Result, error) {
	start := time.Now()
	rate, cluster, reqs, err := placeRate(ctx, opts, n, func(f float64) { env.Step(string(opts.Policy)+" policy", f*0.8) })
	if err != nil {
		return benchkit.Result{}, err
	}
	ceiling, err := scanRate(ctx, cluster, reqs, opts.MaxCandidates, n, func(f float64) { env.Step("bare scan (ceiling)", 0.8+f*0.2) })
	if err != nil {
		return benchkit.Result{}, err
	}
	candidates := strconv.Itoa(opts.MaxCandidates)
	if opts.MaxCandidates == 0 {
		candidates = "all"
	}
	measured := fmt.Sprintf("%s decisions/s: Place + apply on 1,000 nodes x 8 GPUs kept ~60%% full", opts.Policy)
	if opts == DefaultOptions() {
		measured = fmt.Sprintf("%s (the scheduler's default) decisions/s: Place + apply on 1,000 nodes x 8 GPUs kept ~60%% full", opts.Policy)
	}
	r := benchkit.Result{
		Measured: measured, Value: rate, Unit: "decisions/s", Ceiling: ceiling,
		CeilingWhat: fmt.Sprintf("a bare scan of %s candidate nodes' GPUs (free share and VRAM read) per request on the same cluster, no filters or scoring", candidates),
		Goal:        Goal, Size: n, Seconds: time.Since(start).Seconds(),
	}
	r.Finish()
	return r, nil
}

// shapes is a trace-like request mix: fractions, whole GPUs, a few
// multi-GPU (weights in percent).
var shapes = []struct {
	gpus  int
	milli int64
	cpu   int64
	w     int
}{{1, 1000, 8000, 45}, {1, 500, 4000, 15}, {1, 250, 2000, 10}, {1, 100, 2000, 20}, {2, 1000, 16000, 4}, {4, 1000, 32000, 3}, {8, 1000, 64000, 3}}

func request(rng *rand.Rand, id string) placement.Request {
	k := rng.IntN(100)
	for _, s := range shapes {
		if k < s.w {
			r := placement.Request{ID: id, Tenant: "bench", Class: rent.ClassOnDemand, GPUCount: s.gpus,
				MilliPerGPU: s.milli, CPUMilli: s.cpu, MemoryMiB: 16 * 1024}
			if s.milli < 1000 {
				r.VRAMMiB = 8 * 1024
			}
			return r
		}
		k -= s.w
	}
	return placement.Request{ID: id, Tenant: "bench", Class: rent.ClassOnDemand, GPUCount: 1, MilliPerGPU: 1000, CPUMilli: 4000, MemoryMiB: 16 * 1024}
}

func node(i int) placement.Node {
	id := fmt.Sprintf("node-%04d", i)
	n := placement.Node{ID: id, Epoch: 1, Ready: true, Zone: "zone-a", Market: rent.OnDemand,
		CPUMilli: 128_000, MemoryMiB: 1 << 20, FreeCPUMilli: 128_000, FreeMemoryMiB: 1 << 20}
	for g := range 8 {
		n.GPUs = append(n.GPUs, placement.GPU{Index: g, UUID: fmt.Sprintf("GPU-%s-%d", id, g), Model: "H100-SXM5-80GB",
			VRAMMiB: 80 * 1024, FreeMilli: 1000, FreeVRAMMiB: 80 * 1024, MIGCapable: true, PCIeSwitch: g / 2, NUMA: g / 4})
	}
	return n
}

// held is a placement kept on the cluster until the fill level is passed.
type held struct {
	id   string
	node int
}

// placeRate makes n decisions on a 1,000-node x 8-GPU cluster kept about
// 60 % full (each placement applied, the oldest released once 60 % is
// passed).
func placeRate(ctx context.Context, opts Options, n int, progress func(float64)) (float64, *placement.Cluster, []placement.Request, error) {
	c := &placement.Cluster{}
	for i := range 1000 {
		c.Nodes = append(c.Nodes, node(i))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	recent := make([]placement.TaskShape, 0, 2000)
	for i := range 2000 {
		r := request(rng, "w"+strconv.Itoa(i))
		recent = append(recent, placement.ShapeOf(&r))
	}
	w := placement.NewWorkload(recent, placement.DefaultCoveragePct)
	pl, err := placement.NewPlacer(placement.Options{Policy: opts.Policy, Workload: &w, MaxCandidates: opts.MaxCandidates})
	if err != nil {
		return 0, nil, nil, err
	}
	reqs := make([]placement.Request, 4096)
	for i := range reqs {
		reqs[i] = request(rng, "")
	}
	var live []held
	var used, capacityMilli int64 = 0, 1000 * 8 * 1000
	now := time.Now()
	start := time.Now()
	for i := range n {
		if i%1000 == 0 {
			if err := ctx.Err(); err != nil {
				return 0, nil, nil, err
			}
			progress(float64(i) / float64(n))
		}
		r := reqs[i%len(reqs)]
		r.ID = "r" + strconv.Itoa(i)
		p, err := pl.Place(c, &r)
		if err != nil {
			continue
		}
		ni, _ := strconv.Atoi(p.NodeID[len("node-"):])
		c.Nodes[ni].Apply(&r, p, now)
		live = append(live, held{r.ID, ni})
		for _, s := range p.GPUs {
			used += s.Milli
		}
		for used*10 > capacityMilli*6 && len(live) > 0 {
			used -= release(c, live[0])
			live = live[1:]
		}
	}
	return float64(n) / time.Since(start).Seconds(), c, reqs, nil
}

// release removes h's allocation and returns the milli-GPUs it held.
func release(c *placement.Cluster, h held) int64 {
	nd := &c.Nodes[h.node]
	var milli int64
	for _, a := range nd.Allocations {
		if a.RentalID == h.id {
			for _, s := range a.GPUs {
				milli += s.Milli
			}
		}
	}
	nd.Remove(h.id)
	return milli
}

// scanRate is the floor of any placement decision: for each request,
// visit as many candidate nodes as the placer may (all when 0) and read
// every GPU's free share and VRAM, with no filter chain, scoring or
// result. A ceiling, not a placer.
func scanRate(ctx context.Context, c *placement.Cluster, reqs []placement.Request, candidates, n int, progress func(float64)) (float64, error) {
	if candidates <= 0 || candidates > len(c.Nodes) {
		candidates = len(c.Nodes)
	}
	fits := 0
	start := time.Now()
	for i := range n {
		if i%1000 == 0 {
			if err := ctx.Err(); err != nil {
				return 0, err
			}
			progress(float64(i) / float64(n))
		}
		r := &reqs[i%len(reqs)]
		first := (i * 7919) % len(c.Nodes)
		for k := range candidates {
			nd := &c.Nodes[(first+k)%len(c.Nodes)]
			for g := range nd.GPUs {
				if nd.GPUs[g].FreeMilli >= r.MilliPerGPU && nd.GPUs[g].FreeVRAMMiB >= r.VRAMMiB {
					fits++
				}
			}
		}
	}
	rate := float64(n) / time.Since(start).Seconds()
	if fits < 0 { // keeps the loop from being optimised away
		return 0, errors.New("unreachable")
	}
	return rate, nil
}
