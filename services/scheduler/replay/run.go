package replay

import (
	"context"
	"fmt"
	"runtime"
	"sync"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
)

// Plan is a set of runs: every policy under every seed.
type Plan struct {
	Policies []placement.Policy
	Seeds    []int64
	Options  Options
	// Workers runs that many (policy, seed) runs at once; 0 = GOMAXPROCS.
	Workers int
	// Progress, when set, is called after each run (from one goroutine at
	// a time) with the number done and the total.
	Progress func(done, total int, r Result)
}

// Seeds returns n seeds from first (the paper: 42..51).
func Seeds(first int64, n int) []int64 {
	s := make([]int64, n)
	for i := range s {
		s[i] = first + int64(i)
	}
	return s
}

// Execute runs the plan, in parallel, and returns one summary per policy in
// the plan's order with its runs. Each run owns its cluster, so runs share
// nothing but the read-only trace.
func Execute(ctx context.Context, tr *Trace, p Plan) ([]Summary, [][]Result, error) {
	if len(p.Policies) == 0 || len(p.Seeds) == 0 {
		return nil, nil, fmt.Errorf("replay: need at least one policy and one seed")
	}
	workers := p.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	type job struct{ pi, si int }
	jobs := make(chan job)
	results := make([][]Result, len(p.Policies))
	for i := range results {
		results[i] = make([]Result, len(p.Seeds))
	}
	var mu sync.Mutex
	var firstErr error
	done, total := 0, len(p.Policies)*len(p.Seeds)
	var wg sync.WaitGroup
	for range min(workers, total) {
		wg.Go(func() {
			for j := range jobs {
				r, err := Run(tr, p.Policies[j.pi], p.Seeds[j.si], p.Options)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = fmt.Errorf("policy %s seed %d: %w", p.Policies[j.pi], p.Seeds[j.si], err)
				}
				results[j.pi][j.si] = r
				done++
				if p.Progress != nil && err == nil {
					p.Progress(done, total, r)
				}
				mu.Unlock()
			}
		})
	}
feed:
	for pi := range p.Policies {
		for si := range p.Seeds {
			select {
			case jobs <- job{pi, si}:
			case <-ctx.Done():
				break feed
			}
		}
	}
	close(jobs)
	wg.Wait()
	if firstErr != nil {
		return nil, nil, firstErr
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	sums := make([]Summary, len(p.Policies))
	for i := range results {
		sums[i] = Summarise(results[i])
	}
	return sums, results, nil
}
