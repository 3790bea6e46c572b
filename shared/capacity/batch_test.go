package capacity_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

// ReserveMany decides every placement of a batch exactly as Reserve called
// once per placement, in order, would: same allocations, same errors
// (conflicts inside the batch included), same books afterwards.
func TestReserveManyIsReserveInOrder(t *testing.T) {
	t.Parallel()
	rdb := testkit.StartRedis(t).Client(t)
	ctx := t.Context()
	clock := func() time.Time { return time.Unix(1_700_000_000, 0) }
	setup := func(prefix string) *capacity.Store {
		s := storeOn(t, rdb, capacity.WithPrefix(prefix), capacity.WithClock(clock))
		mustRegister(t, s, gpuNode("n1", 2))
		mustRegister(t, s, gpuNode("n2", 1))
		mustRegister(t, s, gpuNode("drain", 1))
		if err := s.SetStatus(ctx, "drain", capacity.StatusDraining, 1); err != nil {
			t.Fatal(err)
		}
		mustReserve(t, s, place("old", "n2", 1, share(0, 250, 1024)))
		return s
	}
	batch := []capacity.Placement{
		place("a", "n1", 1, share(0, 600, 40*1024)),
		place("b", "n1", 1, share(0, 600, 1024)),                       // GPU 0 taken by a in the same batch
		place("c", "n1", 1, share(0, 400, 40*1024), share(1, 1000, 1)), // fits beside a
		place("d", "n1", 1, share(1, 1, 1)),                            // GPU 1 is whole-booked by c
		place("a", "n2", 1, share(0, 100, 1)),                          // a again: the earlier allocation
		place("old", "n1", 1, share(0, 1, 1)),                          // recorded before the batch
		place("e", "nowhere", 1, share(0, 1, 1)),
		place("f", "n2", 7, share(0, 1, 1)),
		place("g", "drain", 1, share(0, 1, 1)),
		place("h", "n2", 1, share(3, 1, 1)),
		place("", "n2", 1, share(0, 1, 1)), // invalid: never sent
		place("i", "n2", 1, share(0, 750, 1024)),
		place("j", "n2", 1, share(0, 1, 1)), // n2's GPU 0 is full now
	}

	one := setup("one")
	type result struct {
		a   capacity.Allocation
		err string
	}
	var want []result
	for _, p := range batch {
		a, err := one.Reserve(ctx, p)
		r := result{a: a}
		if err != nil {
			r.err = err.Error()
		}
		want = append(want, r)
	}

	many := setup("many")
	got := many.ReserveMany(ctx, batch)
	if len(got) != len(batch) {
		t.Fatalf("%d results for %d placements", len(got), len(batch))
	}
	kinds := map[string]int{}
	for i, r := range got {
		g := result{a: r.Allocation}
		if r.Err != nil {
			g.err = r.Err.Error()
		}
		if !reflect.DeepEqual(g, want[i]) {
			t.Errorf("placement %d (%s on %s):\n got  %+v\n want %+v", i, batch[i].RentalID, batch[i].NodeID, g, want[i])
		}
		for name, is := range map[string]func(error) bool{"insufficient": capacity.IsInsufficient, "not_found": capacity.IsNotFound,
			"fenced": capacity.IsFenced, "conflict": capacity.IsConflict, "invalid": capacity.IsInvalid} {
			if is(r.Err) {
				kinds[name]++
			}
		}
		if r.Allocation.Existing {
			kinds["existing"]++
		}
	}
	// The batch covers every outcome.
	for name, n := range map[string]int{"insufficient": 3, "not_found": 1, "fenced": 1, "conflict": 1, "invalid": 2, "existing": 2} {
		if kinds[name] != n {
			t.Errorf("%d %s results, want %d (%v)", kinds[name], name, n, kinds)
		}
	}
	for _, id := range []string{"n1", "n2", "drain"} {
		a, b := mustNode(t, one, id), mustNode(t, many, id)
		if !reflect.DeepEqual(a.FreeGPUs, b.FreeGPUs) || !reflect.DeepEqual(a.Allocations, b.Allocations) ||
			a.FreeCPUMilli != b.FreeCPUMilli || a.FreeMemoryMiB != b.FreeMemoryMiB {
			t.Errorf("node %s differs:\n one  %+v\n many %+v", id, a, b)
		}
	}
	if v1, v2 := mustVersion(t, one), mustVersion(t, many); v1 != v2 {
		t.Errorf("version %d after Reserve, %d after ReserveMany", v1, v2)
	}
	if got := many.ReserveMany(ctx, nil); len(got) != 0 {
		t.Errorf("an empty batch: %v", got)
	}
}

// Six goroutines commit batches of 32 quarter and half GPUs against the
// same four GPUs: no GPU is ever over-committed, every grant is recorded
// and every refusal is an *InsufficientError.
func TestConcurrentReserveManyNeverOverCommits(t *testing.T) {
	t.Parallel()
	const (
		workers = 6
		batches = 40
		size    = 32
	)
	s, _ := newStore(t)
	ctx := t.Context()
	node := gpuNode("n1", 4)
	node.CPUMilli, node.MemoryMiB = 1_000_000, 1<<30
	epoch := mustRegister(t, s, node)
	var granted, short atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			var held []string
			for b := range batches {
				ps := make([]capacity.Placement, size)
				for k := range ps {
					p := place(fmt.Sprintf("w%d-%d-%d", w, b, k), "n1", epoch, share(rng.IntN(4), []int64{250, 500}[rng.IntN(2)], 1024))
					p.CPUMilli, p.MemoryMiB = 100, 1024
					ps[k] = p
				}
				for k, r := range s.ReserveMany(ctx, ps) {
					switch {
					case r.Err == nil:
						granted.Add(1)
						held = append(held, ps[k].RentalID)
					case capacity.IsInsufficient(r.Err):
						short.Add(1)
					default:
						t.Errorf("reserve %s: %v", ps[k].RentalID, r.Err)
						return
					}
				}
				if err := conserved(mustNode(t, s, "n1")); err != nil {
					t.Error(err)
					return
				}
				// Give back half of what is held, so the race goes on.
				for len(held) > 0 && rng.IntN(2) == 0 {
					if ok, err := s.Release(ctx, held[0]); err != nil || !ok {
						t.Errorf("release %s: %v %v", held[0], ok, err)
						return
					}
					held = held[1:]
				}
			}
		})
	}
	wg.Wait()
	st := mustNode(t, s, "n1")
	t.Logf("%d granted, %d refused, %d held at the end", granted.Load(), short.Load(), len(st.Allocations))
	if granted.Load()+short.Load() != workers*batches*size {
		t.Fatalf("%d granted + %d refused != %d", granted.Load(), short.Load(), workers*batches*size)
	}
	if granted.Load() == 0 || short.Load() == 0 {
		t.Fatal("the race did not happen: want grants and refusals")
	}
	for _, g := range st.FreeGPUs {
		if g.Milli < 0 || g.Sharers > g.MaxSharers {
			t.Fatalf("GPU %d over-committed: %+v", g.Index, g)
		}
	}
}

func TestReserveManyReloadsTheScript(t *testing.T) {
	t.Parallel()
	s, rdb := newStore(t)
	mustRegister(t, s, gpuNode("n1", 1))
	if err := rdb.ScriptFlush(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	got := s.ReserveMany(t.Context(), []capacity.Placement{place("r1", "n1", 1, share(0, 100, 1)), place("r2", "n1", 1, share(0, 100, 1))})
	for i, r := range got {
		if r.Err != nil {
			t.Fatalf("placement %d after SCRIPT FLUSH: %v", i, r.Err)
		}
	}
	if st := mustNode(t, s, "n1"); len(st.Allocations) != 2 {
		t.Fatalf("%d allocations, want 2", len(st.Allocations))
	}
}

func TestReserveManyWithRedisDownIsUnavailable(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	s := storeOn(t, rdb)
	got := s.ReserveMany(t.Context(), []capacity.Placement{place("r1", "n1", 1, share(0, 100, 1)), place("", "n1", 1)})
	if !capacity.IsUnavailable(got[0].Err) {
		t.Errorf("want unavailable, got %v", got[0].Err)
	}
	if !capacity.IsInvalid(got[1].Err) || errors.Is(got[1].Err, capacity.ErrUnavailable) {
		t.Errorf("an invalid placement is refused before Redis: %v", got[1].Err)
	}
}

// BenchmarkReserveMany compares, on one redis-server and in the same run
// (rounds alternate), 4,000 quarter-GPU reserves on 250 nodes made with
// Reserve from 32 goroutines (the ceiling the scheduler used to reach) and
// with ReserveMany in pipelines of 64 from 8 goroutines.
func BenchmarkReserveMany(b *testing.B) {
	r := testkit.StartRedis(b)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr, PoolSize: 80})
	b.Cleanup(func() { _ = rdb.Close() })
	ctx := b.Context()
	const n, nodes = 4000, 250
	setup := func(prefix string) (*capacity.Store, []capacity.Placement) {
		s := storeOn(b, rdb, capacity.WithPrefix(prefix))
		for i := range nodes {
			mustRegister(b, s, gpuNode(fmt.Sprintf("n%03d", i), 8))
		}
		ps := make([]capacity.Placement, n)
		for i := range ps {
			ps[i] = place(fmt.Sprintf("r%d", i), fmt.Sprintf("n%03d", i%nodes), 1, share((i/nodes)%8, 250, 1024))
			ps[i].CPUMilli, ps[i].MemoryMiB = 100, 100
		}
		return s, ps
	}
	var one, many time.Duration
	b.ResetTimer()
	for round := range b.N {
		b.StopTimer()
		s, ps := setup(fmt.Sprintf("one%d", round))
		b.StartTimer()
		one += fanOut(b, 32, n, func(_, i int) error {
			_, err := s.Reserve(ctx, ps[i])
			return err
		})
		b.StopTimer()
		s, ps = setup(fmt.Sprintf("many%d", round))
		b.StartTimer()
		many += fanOut(b, 8, (n+63)/64, func(_, i int) error {
			for _, res := range s.ReserveMany(ctx, ps[i*64:min(n, i*64+64)]) {
				if res.Err != nil {
					return res.Err
				}
			}
			return nil
		})
	}
	b.StopTimer()
	oneRate := float64(b.N*n) / one.Seconds()
	manyRate := float64(b.N*n) / many.Seconds()
	b.ReportMetric(oneRate, "reserve/s")
	b.ReportMetric(manyRate, "reservemany/s")
	b.ReportMetric(manyRate/oneRate, "ratio_many_vs_one")
}
