package capacity_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/shizu-gpu/shizu/shared/capacity"
)

// Eight goroutines race 10,000 reserves, with releases mixed in, for the
// same two GPUs of one node. An observer reads the node atomically the whole
// time; at no moment may a GPU be over-committed or the books not add up.
func TestConcurrentReservesNeverOverCommit(t *testing.T) {
	t.Parallel()
	const (
		workers  = 8
		reserves = 10_000
	)
	s, _ := newStore(t)
	ctx := t.Context()
	node := gpuNode("n1", 2)
	node.CPUMilli, node.MemoryMiB = 1_000_000, 1<<30 // only the GPUs are contended
	epoch := mustRegister(t, s, node)

	var (
		granted, short, released atomic.Int64
		next                     atomic.Int64
		stop                     = make(chan struct{})
		observed                 atomic.Int64
		wg                       sync.WaitGroup
		observer                 sync.WaitGroup
	)
	observer.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			st, err := s.Node(ctx, "n1")
			if err != nil {
				t.Errorf("observer: %v", err)
				return
			}
			if err := conserved(st); err != nil {
				t.Errorf("observer saw broken books after %d reads: %v", observed.Load(), err)
				return
			}
			observed.Add(1)
		}
	})
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			var held []string
			for {
				i := next.Add(1)
				if i > reserves {
					break
				}
				p := place(fmt.Sprintf("w%d-%d", w, i), "n1", epoch)
				p.CPUMilli, p.MemoryMiB = 100, 1024
				for _, g := range rng.Perm(2)[:1+rng.IntN(2)] {
					p.GPUs = append(p.GPUs, share(g, []int64{125, 250, 500, 1000}[rng.IntN(4)], 5*1024+rng.Int64N(30*1024)))
				}
				_, err := s.Reserve(ctx, p)
				switch {
				case err == nil:
					granted.Add(1)
					held = append(held, p.RentalID)
				case capacity.IsInsufficient(err):
					short.Add(1)
				default:
					t.Errorf("reserve %s: %v", p.RentalID, err)
					return
				}
				// Give something back about as often as something is taken.
				if len(held) > 0 && (rng.IntN(2) == 0 || err != nil) {
					k := rng.IntN(len(held))
					ok, err := s.Release(ctx, held[k])
					if err != nil || !ok {
						t.Errorf("release %s: %v %v", held[k], ok, err)
						return
					}
					released.Add(1)
					held = append(held[:k], held[k+1:]...)
				}
			}
			for _, id := range held {
				if ok, err := s.Release(ctx, id); err != nil || !ok {
					t.Errorf("final release %s: %v %v", id, ok, err)
				}
				released.Add(1)
			}
		})
	}
	wg.Wait()
	close(stop)
	observer.Wait()

	t.Logf("%d reserves: %d granted, %d refused as insufficient, %d released; observer read the node %d times",
		reserves, granted.Load(), short.Load(), released.Load(), observed.Load())
	if granted.Load()+short.Load() != reserves {
		t.Fatalf("%d granted + %d refused != %d reserves", granted.Load(), short.Load(), reserves)
	}
	if granted.Load() == 0 || short.Load() == 0 || observed.Load() == 0 {
		t.Fatal("the race did not happen: want grants, refusals and observations")
	}
	if released.Load() != granted.Load() {
		t.Fatalf("released %d, granted %d", released.Load(), granted.Load())
	}
	st := mustNode(t, s, "n1")
	if len(st.Allocations) != 0 || st.FreeCPUMilli != node.CPUMilli {
		t.Fatalf("after releasing everything: %+v", st)
	}
	for _, g := range st.FreeGPUs {
		if g.Milli != capacity.MilliPerGPU || g.VRAMMiB != 80*1024 || g.Sharers != 0 {
			t.Fatalf("GPU %d not whole again: %+v", g.Index, g)
		}
	}
}

// Eight scheduler replicas commit the same rental at once, each on a
// different node: exactly one books it, the others get that booking back.
func TestConcurrentReservesOfOneRentalBookItOnce(t *testing.T) {
	t.Parallel()
	const replicas = 8
	s, _ := newStore(t)
	for i := range replicas {
		mustRegister(t, s, gpuNode(fmt.Sprintf("n%d", i), 1))
	}
	allocs := make([]capacity.Allocation, replicas)
	errs := make([]error, replicas)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range replicas {
		wg.Go(func() {
			<-start
			allocs[i], errs[i] = s.Reserve(t.Context(), place("r1", fmt.Sprintf("n%d", i), 1, share(0, 1000, 1)))
		})
	}
	close(start)
	wg.Wait()
	fresh := 0
	for i, a := range allocs {
		if errs[i] != nil {
			t.Fatalf("replica %d: %v", i, errs[i])
		}
		if !a.Existing {
			fresh++
		}
		if a.NodeID != allocs[0].NodeID {
			t.Fatalf("replica %d got the rental on %s, replica 0 on %s", i, a.NodeID, allocs[0].NodeID)
		}
	}
	if fresh != 1 {
		t.Fatalf("%d replicas booked the rental, want exactly 1", fresh)
	}
	snap, err := s.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	booked := 0
	for _, st := range snap.Nodes {
		booked += len(st.Allocations)
	}
	if booked != 1 {
		t.Fatalf("%d allocations recorded, want 1", booked)
	}
}
