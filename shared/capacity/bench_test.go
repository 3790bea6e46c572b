package capacity_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

// BenchmarkReserveRelease measures, against one real redis-server and in
// the same run, the ceiling (PING round trips per second) and what the store
// achieves (reserve+release pairs per second, each pair = one reserve script,
// one HGET and one release script), serially and with 8 and 32 goroutines.
// ns/op is the time of one pair; ratio_vs_ping compares the two rates.
func BenchmarkReserveRelease(b *testing.B) {
	r := testkit.StartRedis(b)
	for _, workers := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("goroutines=%d", workers), func(b *testing.B) {
			rdb := redis.NewClient(&redis.Options{Addr: r.Addr, PoolSize: 2*workers + 8})
			b.Cleanup(func() { _ = rdb.Close() })
			s := storeOn(b, rdb, capacity.WithPrefix(fmt.Sprintf("bench%d", workers)))
			ctx := b.Context()
			// One node per goroutine, so every reserve fits and the pairs
			// measure the scripts, not refusals.
			for w := range workers {
				mustRegister(b, s, gpuNode(fmt.Sprintf("n%d", w), 8))
			}

			// PINGs and pairs alternate in ten rounds, so that both rates
			// see the same machine load; ns/op counts the pairs only.
			b.ResetTimer()
			var ping, pairs time.Duration
			for round := range 10 {
				n := b.N/10 + boolInt(round < b.N%10)
				b.StopTimer()
				ping += fanOut(b, workers, n, func(_, _ int) error { return rdb.Ping(ctx).Err() })
				b.StartTimer()
				pairs += fanOut(b, workers, n, func(w, i int) error {
					return reserveRelease(ctx, s, fmt.Sprintf("b%d-%d-%d", round, w, i), fmt.Sprintf("n%d", w), i%8)
				})
			}
			b.StopTimer()

			pingRate := float64(b.N) / ping.Seconds()
			pairRate := float64(b.N) / pairs.Seconds()
			b.ReportMetric(pingRate, "ping/s")
			b.ReportMetric(pairRate, "reserve+release/s")
			b.ReportMetric(pairRate/pingRate, "ratio_vs_ping")
		})
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func reserveRelease(ctx context.Context, s *capacity.Store, rental, node string, gpu int) error {
	if _, err := s.Reserve(ctx, place(rental, node, 1, share(gpu, 500, 40*1024))); err != nil {
		return err
	}
	ok, err := s.Release(ctx, rental)
	if err == nil && !ok {
		err = fmt.Errorf("release %s: nothing released", rental)
	}
	return err
}

// fanOut runs op n times over the given number of goroutines and returns
// the wall time. op gets the goroutine and the operation number.
func fanOut(b *testing.B, workers, n int, op func(w, i int) error) time.Duration {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := op(w, i); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start)
}

// BenchmarkSnapshot reads a store of nodes × 8 GPUs, each node holding two
// allocations, at a few batch sizes.
func BenchmarkSnapshot(b *testing.B) {
	r := testkit.StartRedis(b)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	b.Cleanup(func() { _ = rdb.Close() })
	for _, nodes := range []int{1000, 5000} {
		prefix := fmt.Sprintf("snap%d", nodes)
		fill := storeOn(b, rdb, capacity.WithPrefix(prefix))
		for i := range nodes {
			id := fmt.Sprintf("node-%05d", i)
			mustRegister(b, fill, gpuNode(id, 8))
			mustReserve(b, fill, place(id+"-a", id, 1, share(0, 1000, 80*1024), share(1, 1000, 80*1024)))
			mustReserve(b, fill, place(id+"-b", id, 1, share(2, 250, 10*1024)))
		}
		for _, batch := range []int{50, 250, 1000} {
			if nodes == 5000 && batch != capacity.DefaultSnapshotBatch {
				continue
			}
			b.Run(fmt.Sprintf("nodes=%d/gpus=8/batch=%d", nodes, batch), func(b *testing.B) {
				s := storeOn(b, rdb, capacity.WithPrefix(prefix), capacity.WithSnapshotBatch(batch))
				for b.Loop() {
					snap, err := s.Snapshot(b.Context())
					if err != nil {
						b.Fatal(err)
					}
					if len(snap.Nodes) != nodes {
						b.Fatalf("%d nodes, want %d", len(snap.Nodes), nodes)
					}
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "snapshots/s")
			})
		}
	}
}
