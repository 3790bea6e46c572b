package app_test

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/app"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// benchRentals are n short on-demand rentals (one usage record each).
func benchRentals(n int, running bool) []event {
	var out []event
	for i := range n {
		start := base.Add(time.Duration(i%50) * time.Second)
		s := seg{node: "node-" + strconv.Itoa(i%64), start: start, stop: start.Add(5 * time.Second), exit: shizuv1.ExitReason_EXIT_REASON_PREEMPTED}
		if running {
			s.stop = time.Time{}
		}
		r := rental{id: "b-" + strconv.Itoa(i), tenant: "t" + strconv.Itoa(i%3), model: "H100-SXM5-80GB", zone: "eu-1",
			plan: shizuv1.Plan_PLAN_ON_DEMAND, gpus: 1, milli: 1000, labels: map[string]string{"team": "bench"}, segs: []seg{s}}
		out = append(out, r.events()...)
	}
	return out
}

// publishAsync loads the stream fast with async publishes.
func (e *env) publishAsync(tb testing.TB, evs []event) {
	tb.Helper()
	batch := e.pub.NewBatch()
	for i, ev := range evs {
		if err := batch.Publish(tb.Context(), ev.subject, ev.msg); err != nil {
			tb.Fatal(err)
		}
		if i%5000 == 4999 {
			if _, err := batch.Wait(tb.Context()); err != nil {
				tb.Fatal(err)
			}
			batch = e.pub.NewBatch()
		}
	}
	if _, err := batch.Wait(tb.Context()); err != nil {
		tb.Fatal(err)
	}
}

// BenchmarkMemoryPer100kRunningRentals ingests 100,000 started rentals and
// reports the Redis memory they take, and the meter process's Go heap.
//
//	go test -run '^$' -bench Memory -benchtime 1x ./services/metering/app/
func BenchmarkMemoryPer100kRunningRentals(b *testing.B) {
	const rentals = 100_000
	for range b.N {
		e := newEnv(b)
		cfg := testConfig()
		cfg.Concurrency = app.DefaultConfig().Concurrency
		before := redisMemory(b, e)
		runtime.GC()
		var ms0 runtime.MemStats
		runtime.ReadMemStats(&ms0)
		e.publishAsync(b, benchRentals(rentals, true))
		var now atomic.Int64
		now.Store(base.UnixNano())
		r := e.startMeter(b, cfg, func() time.Time { return time.Unix(0, now.Load()).UTC() })
		testkit.Eventually(b, 10*time.Minute, func() error {
			cons, err := e.pub.JetStream().Consumer(b.Context(), topology.StreamRentals, "metering")
			if err != nil {
				return err
			}
			info, err := cons.Info(b.Context())
			if err != nil {
				return err
			}
			if info.NumPending > 0 || info.NumAckPending > 0 {
				return fmt.Errorf("%d pending", info.NumPending+uint64(info.NumAckPending))
			}
			return nil
		})
		n, err := e.rdb.ZCard(b.Context(), cfg.KeyPrefix+"due").Result()
		if err != nil || n != rentals {
			b.Fatalf("%d running segments tracked, want %d (%v)", n, rentals, err)
		}
		after := redisMemory(b, e)
		runtime.GC()
		var ms1 runtime.MemStats
		runtime.ReadMemStats(&ms1)
		b.ReportMetric(float64(after-before)/(1<<20), "redis-MiB/100k")
		b.ReportMetric(float64(after-before)/rentals, "redis-B/rental")
		b.ReportMetric(float64(int64(ms1.HeapAlloc)-int64(ms0.HeapAlloc))/(1<<20), "heap-MiB")

		// A minute later every one of them has an interval to close: how
		// fast does the closer bill 100,000 running rentals?
		now.Store(base.Add(time.Minute + cfg.CloseGrace).UnixNano())
		start := time.Now()
		closed := 0
		for {
			n, err := r.meter.CloseDue(b.Context())
			if err != nil {
				b.Fatal(err)
			}
			if n == 0 {
				break
			}
			closed += n
		}
		b.ReportMetric(float64(closed)/time.Since(start).Seconds(), "closed-segments/s")
		if closed != rentals {
			b.Fatalf("closed %d segments, want %d", closed, rentals)
		}
	}
}

func redisMemory(tb testing.TB, e *env) int64 {
	tb.Helper()
	info, err := e.rdb.Info(tb.Context(), "memory").Result()
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	tb.Fatal("no used_memory in INFO")
	return 0
}
