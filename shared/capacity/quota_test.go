package capacity_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/shizu-gpu/shizu/shared/capacity"
)

// Two stores on one Redis (two scheduler replicas) race 400 one-GPU
// reserves, with releases mixed in, of one tenant whose quota is 5 GPUs,
// on nodes with far more room. An observer reads the tenant's usage the
// whole time: it never passes 5 GPUs, and at the end it is what the live
// allocations hold.
func TestRacingReservesNeverPassTheQuota(t *testing.T) {
	t.Parallel()
	const (
		workers  = 8
		reserves = 400
		limit    = 5
	)
	a, rdb := newStore(t)
	b := storeOn(t, rdb)
	ctx := t.Context()
	var epochs [4]uint64
	for i := range epochs {
		n := gpuNode(fmt.Sprintf("n%d", i), 8)
		n.CPUMilli, n.MemoryMiB = 1_000_000, 1<<30
		epochs[i] = mustRegister(t, a, n)
	}
	q := &capacity.Quota{MaxGPUs: limit}
	var granted, refused, next atomic.Int64
	var maxSeen atomic.Int64
	stop := make(chan struct{})
	var observer, wg sync.WaitGroup
	observer.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			u, err := a.Usage(ctx, "acme")
			if err != nil {
				t.Error(err)
				return
			}
			if u.MilliGPU > maxSeen.Load() {
				maxSeen.Store(u.MilliGPU)
			}
		}
	})
	for w := range workers {
		s := a
		if w%2 == 1 {
			s = b
		}
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > reserves {
					return
				}
				node := int(i) % len(epochs)
				p := place(fmt.Sprintf("r%d", i), fmt.Sprintf("n%d", node), epochs[node], share(int(i/4)%8, 1000, 1024))
				p.Quota = q
				_, err := s.Reserve(ctx, p)
				switch {
				case err == nil:
					granted.Add(1)
					if i%3 == 0 {
						if _, err := s.Release(ctx, p.RentalID); err != nil {
							t.Error(err)
						}
					}
				case capacity.IsQuota(err):
					refused.Add(1)
				case capacity.IsInsufficient(err):
				default:
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	observer.Wait()
	if got := maxSeen.Load(); got > limit*capacity.MilliPerGPU {
		t.Fatalf("the tenant held %d milli-GPU at one point; its quota is %d GPUs", got, limit)
	}
	if granted.Load() < limit || refused.Load() == 0 {
		t.Fatalf("granted %d, refused %d over quota: the race did not reach the quota", granted.Load(), refused.Load())
	}
	u, err := a.Usage(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	snap, err := a.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var held int64
	for _, n := range snap.Nodes {
		for _, al := range n.Allocations {
			for _, g := range al.GPUs {
				held += g.Milli
			}
		}
	}
	if u.MilliGPU != held || u.PerModel["H100-SXM-80GB"] != held || held > limit*capacity.MilliPerGPU {
		t.Fatalf("usage %+v; the allocations hold %d", u, held)
	}
	t.Logf("granted %d, refused over quota %d, held at the end %d milli-GPU", granted.Load(), refused.Load(), held)
}

// A node stored before GPU models were kept (no model.<i> fields)
// registers again with the same facts: its models are written, and from
// then on its GPUs count per model.
func TestRegisterAddsTheModelsOfAnOldNode(t *testing.T) {
	t.Parallel()
	s, rdb := newStore(t)
	ctx := t.Context()
	e := mustRegister(t, s, gpuNode("n1", 2))
	if err := rdb.HDel(ctx, "shizu:node:{n1}", "model.0", "model.1").Err(); err != nil {
		t.Fatal(err)
	}
	mustReserve(t, s, place("r1", "n1", e, share(0, 1000, 1024)))
	if u, _ := s.Usage(ctx, "acme"); u.MilliGPU != 1000 || len(u.PerModel) != 0 {
		t.Fatalf("usage on a node without models = %+v; want the total only", u)
	}
	mustRegister(t, s, gpuNode("n1", 2))
	mustReserve(t, s, place("r2", "n1", e, share(1, 1000, 1024)))
	if u, _ := s.Usage(ctx, "acme"); u.MilliGPU != 2000 || u.PerModel["H100-SXM-80GB"] != 1000 {
		t.Fatalf("usage after the node registered again = %+v", u)
	}
	// r1 was counted without a model: its release takes away only that.
	if _, err := s.Release(ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	if u, _ := s.Usage(ctx, "acme"); u.MilliGPU != 1000 || u.PerModel["H100-SXM-80GB"] != 1000 {
		t.Fatalf("usage after releasing the rental counted without a model = %+v", u)
	}
}
