package app_test

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/app"
	"github.com/shizu-gpu/shizu/shared/bus"
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
		if err := batch.Publish(context.Background(), ev.subject, ev.msg); err != nil {
			tb.Fatal(err)
		}
		if i%5000 == 4999 {
			if _, err := batch.Wait(context.Background()); err != nil {
				tb.Fatal(err)
			}
			batch = e.pub.NewBatch()
		}
	}
	if _, err := batch.Wait(context.Background()); err != nil {
		tb.Fatal(err)
	}
}

// rawCeiling consumes n messages of the RENTALS stream with a plain
// JetStream pull consumer that only acknowledges: the most any consumer of
// that stream can ingest on this machine.
func (e *env) rawCeiling(tb testing.TB, n int) time.Duration {
	tb.Helper()
	ctx := context.Background()
	cons, err := e.pub.JetStream().CreateOrUpdateConsumer(ctx, topology.StreamRentals, jetstream.ConsumerConfig{
		Durable: "bench-raw", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 10_000})
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan struct{})
	count := 0
	start := time.Now()
	cc, err := cons.Consume(func(m jetstream.Msg) {
		var ev shizuv1.RentalStarted // decode like a handler would
		_ = proto.Unmarshal(m.Data(), &ev)
		_ = m.Ack()
		count++
		if count == n {
			close(done)
		}
	}, jetstream.PullMaxMessages(1000))
	if err != nil {
		tb.Fatal(err)
	}
	<-done
	elapsed := time.Since(start)
	cc.Stop()
	return elapsed
}

// BenchmarkIngest measures rental events ingested end to end (event in ->
// segment state in Redis -> usage record published -> folded into the
// aggregates, exactly once) against the raw JetStream consume ceiling of the
// same events in the same run.
//
//	go test -run '^$' -bench Ingest -benchtime 1x ./services/metering/app/
func BenchmarkIngest(b *testing.B) {
	const rentals = 20_000
	for range b.N {
		b.StopTimer()
		e := newEnv(b)
		cfg := testConfig()
		cfg.Concurrency = app.DefaultConfig().Concurrency
		evs := benchRentals(rentals, false)
		e.publishAsync(b, evs)
		rawCPU0 := processCPU()
		ceiling := e.rawCeiling(b, len(evs))
		rawCPU := processCPU() - rawCPU0
		cpu0 := redisCPU(b, e)
		proc0 := processCPU()
		b.StartTimer()
		start := time.Now()
		e.startMeter(b, cfg, fixed(base))
		testkit.Eventually(b, 10*time.Minute, func() error {
			n := 0
			for i := range 3 {
				v, _ := e.rdb.HGet(context.Background(), cfg.KeyPrefix+"agg:0:tenant:t"+strconv.Itoa(i), "mgs").Int64()
				n += int(v / (1000 * 5))
			}
			if n < rentals {
				return fmt.Errorf("%d of %d rentals billed", n, rentals)
			}
			return nil
		})
		elapsed := time.Since(start)
		b.StopTimer()
		redisUsed := redisCPU(b, e) - cpu0
		used := processCPU() - proc0 + redisUsed
		b.ReportMetric(redisUsed/elapsed.Seconds(), "redis-cpu")
		// CPU per event is steadier than wall time on a shared machine: the
		// whole pipeline (this process with the embedded NATS server, plus
		// redis-server) against the raw consumer's.
		b.ReportMetric(used/float64(len(evs))*1e6, "cpu-µs/event")
		b.ReportMetric(rawCPU/float64(len(evs))*1e6, "raw-cpu-µs/event")
		b.ReportMetric(2/(used/float64(len(evs))), "events/s-per-2-cores")
		b.ReportMetric(rawCPU/used, "cpu-ratio") // raw consume's CPU per event / the pipeline's
		got, msgs := e.billed(b)
		if len(got) != rentals || msgs != rentals {
			b.Fatalf("%d records in %d messages, want %d", len(got), msgs, rentals)
		}
		perSec := float64(len(evs)) / elapsed.Seconds()
		rawPerSec := float64(len(evs)) / ceiling.Seconds()
		b.ReportMetric(perSec, "events/s")
		b.ReportMetric(float64(rentals)/elapsed.Seconds(), "records/s")
		b.ReportMetric(rawPerSec, "raw-events/s")
		b.ReportMetric(perSec/rawPerSec, "ratio")
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
			cons, err := e.pub.JetStream().Consumer(context.Background(), topology.StreamRentals, "metering")
			if err != nil {
				return err
			}
			info, err := cons.Info(context.Background())
			if err != nil {
				return err
			}
			if info.NumPending > 0 || info.NumAckPending > 0 {
				return fmt.Errorf("%d pending", info.NumPending+uint64(info.NumAckPending))
			}
			return nil
		})
		n, err := e.rdb.ZCard(context.Background(), cfg.KeyPrefix+"due").Result()
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
			n, err := r.meter.CloseDue(context.Background())
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

// processCPU is the CPU seconds this process has used (user + system).
func processCPU() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
}

// redisCPU is the CPU seconds the Redis server has used.
func redisCPU(tb testing.TB, e *env) float64 {
	tb.Helper()
	info, err := e.rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		tb.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		for _, k := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), k); ok {
				f, _ := strconv.ParseFloat(v, 64)
				total += f
			}
		}
	}
	return total
}

func redisMemory(tb testing.TB, e *env) int64 {
	tb.Helper()
	info, err := e.rdb.Info(context.Background(), "memory").Result()
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

var _ = bus.HeaderEvent
