package app_test

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/app"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// BenchmarkEndToEnd pushes b.N rental requests (80 % quarter GPUs, 20 %
// whole GPUs) through one scheduler replica on a 1,000-node × 8-GPU fleet,
// with real NATS and Redis, and measures in the same run:
//
//   - requests/s: b.N requests are queued in the stream, then the replica
//     starts; from its start to the last RentalScheduled received;
//   - the Redis ceiling: capacity-store reserves/s (32 clients, the
//     scheduler's commit parallelism), one reserve per placement;
//   - the JetStream ceiling: async publishes/s of 200-byte events with
//     acks; each placement costs three (request, scheduled, start) plus a
//     delivery;
//   - p50/p99 request→scheduled latency at half the burst rate (paced);
//   - the CPU the burst cost: this process (scheduler, nats-server, the
//     subscriber counting outcomes) plus redis-server, per request, and
//     the cores that 10,000 requests/s would take at that cost. On a
//     shared machine the wall-clock rate follows the load of others; the
//     CPU per request much less.
func BenchmarkEndToEnd(b *testing.B) {
	for _, pol := range []string{"shizu", "fgd", "bestfit"} {
		for _, limit := range []int{64, 0} {
			b.Run(fmt.Sprintf("policy=%s/candidates=%s", pol, map[bool]string{true: "all", false: fmt.Sprint(limit)}[limit == 0]), func(b *testing.B) {
				benchEndToEnd(b, pol, limit)
			})
		}
	}
}

func benchEndToEnd(b *testing.B, policy string, limit int) {
	e := newQuietEnv(b)
	for i := range 1000 {
		e.register(gpuNode(fmt.Sprintf("node-%04d", i), 8, capacity.MarketOnDemand))
	}
	cfg := testConfig()
	cfg.Policy, cfg.MaxCandidates = policy, limit
	cfg.SnapshotMaxAge = app.DefaultConfig().SnapshotMaxAge

	// Scheduled events, by rental, with the time they arrived.
	nc, err := nats.Connect(e.nats.URL, nats.UserInfo(topology.Admin, password(topology.Admin)))
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	var (
		mu      sync.Mutex
		sent    = map[string]time.Time{}
		latency []time.Duration
		got     atomic.Int64
	)
	sub, err := nc.Subscribe(subject.RentalScheduledAll, func(m *nats.Msg) {
		ev := &shizuv1.RentalScheduled{}
		if proto.Unmarshal(m.Data, ev) != nil {
			return
		}
		now := time.Now()
		mu.Lock()
		if t0, ok := sent[ev.GetRentalId()]; ok {
			latency = append(latency, now.Sub(t0))
			delete(sent, ev.GetRentalId())
		}
		mu.Unlock()
		got.Add(1)
	})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		b.Fatal(err)
	}

	reqs := func(prefix string, n int) []*shizuv1.RentalRequested {
		out := make([]*shizuv1.RentalRequested, n)
		for i := range out {
			sp := spec(1, 250, 8*1024, shizuv1.Plan_PLAN_ON_DEMAND)
			if i%5 == 0 {
				sp = spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND)
			}
			out[i] = requested(fmt.Sprintf("%s%d", prefix, i), fmt.Sprintf("tenant-%d", i%16), sp, time.Time{})
		}
		return out
	}
	send := func(evs []*shizuv1.RentalRequested) {
		batch := e.admin.NewBatch()
		for _, ev := range evs {
			now := time.Now()
			ev.Meta.OccurredAt = timestampOf(now)
			mu.Lock()
			sent[ev.GetRentalId()] = now
			mu.Unlock()
			subj, _ := subject.Format(subject.RentalRequested, ev.GetTenantId())
			if err := batch.Publish(b.Context(), subj, ev); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := batch.Wait(b.Context()); err != nil {
			b.Fatal(err)
		}
	}
	waitFor := func(n int64) {
		deadline := time.Now().Add(2 * time.Minute)
		for got.Load() < n {
			if time.Now().After(deadline) {
				b.Fatalf("%d of %d scheduled after 2 minutes", got.Load(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}

	// The burst is queued in the stream before the replica starts (as in
	// Nomad's C1M), so the rate is the scheduler's own, not the load
	// generator's; it includes the replica's first snapshot of the fleet.
	burst := reqs("r-", b.N)
	send(burst)
	cpu0 := cpuSeconds(b, e)
	b.ResetTimer()
	start := time.Now()
	e.replica(cfg, time.Now)
	waitFor(int64(b.N))
	elapsed := time.Since(start)
	b.StopTimer()
	cpuPerRequest := (cpuSeconds(b, e) - cpu0) / float64(b.N)
	rate := float64(b.N) / elapsed.Seconds()

	// Paced: half the burst rate, in 10 ms ticks, for 2,000 requests.
	mu.Lock()
	latency = latency[:0]
	mu.Unlock()
	paced := reqs("p-", 2000)
	perTick := max(1, int(rate/2/100))
	tick := time.NewTicker(10 * time.Millisecond)
	for i := 0; i < len(paced); i += perTick {
		<-tick.C
		send(paced[i:min(len(paced), i+perTick)])
	}
	tick.Stop()
	waitFor(int64(b.N) + 2000)
	mu.Lock()
	lat := slices.Clone(latency)
	mu.Unlock()
	slices.Sort(lat)

	redisRate := reserveCeiling(b, e, 32, min(b.N, 8000))
	jsRate := publishCeiling(b, e, min(b.N, 20000))
	b.ReportMetric(rate, "requests/s")
	b.ReportMetric(redisRate, "redis_reserves/s")
	b.ReportMetric(jsRate, "js_publishes/s")
	b.ReportMetric(rate/redisRate, "ratio_vs_redis")
	b.ReportMetric(rate/(jsRate/3), "ratio_vs_js/3")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50_ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99_ms")
	b.ReportMetric(cpuPerRequest*1e6, "cpu_us/request")
	b.ReportMetric(cpuPerRequest*10000, "cores_for_10k/s")
}

// cpuSeconds is the CPU time used so far by this process and by the
// benchmark's redis-server (its INFO cpu), user and system.
func cpuSeconds(b *testing.B, e *env) float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	self := time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	info, err := e.redis.Client(b).Info(b.Context(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var redisCPU float64
	for _, line := range strings.Split(info, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatalf("INFO cpu %s: %v", k, err)
			}
			redisCPU += f
		}
	}
	return self + redisCPU
}

// reserveCeiling is the capacity store's reserve rate on the same Redis
// with the given number of clients (own key prefix, 250 nodes × 8 GPUs,
// quarter-GPU reserves).
func reserveCeiling(b *testing.B, e *env, clients, n int) float64 {
	s, err := capacity.New(e.redis.Client(b), capacity.WithPrefix("ceiling"))
	if err != nil {
		b.Fatal(err)
	}
	for i := range 250 {
		if _, err := s.Register(b.Context(), gpuNode(fmt.Sprintf("c%03d", i), 8, capacity.MarketOnDemand)); err != nil {
			b.Fatal(err)
		}
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				slot := i / 250 // node i%250, GPU (i/250)%8
				p := capacity.Placement{RentalID: fmt.Sprintf("c%d", i), NodeID: fmt.Sprintf("c%03d", i%250), Epoch: 1, Tenant: "bench",
					CPUMilli: 1000, MemoryMiB: 1024, GPUs: []capacity.GPUShare{{Index: slot % 8, Milli: 250, VRAMMiB: 8 * 1024}}}
				if _, err := s.Reserve(b.Context(), p); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return float64(n) / time.Since(start).Seconds()
}

// publishCeiling is raw JetStream async publishing of 200-byte messages,
// with every ack awaited, on the same server.
func publishCeiling(b *testing.B, e *env, n int) float64 {
	js := e.admin.JetStream()
	if _, err := js.CreateStream(b.Context(), jetstream.StreamConfig{Name: "CEILING", Subjects: []string{"ceiling.>"},
		Storage: jetstream.FileStorage}); err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, 200)
	start := time.Now()
	futs := make([]jetstream.PubAckFuture, 0, n)
	for i := range n {
		f, err := js.PublishAsync("ceiling.x", payload, jetstream.WithMsgID(fmt.Sprintf("c%d", i)))
		if err != nil {
			b.Fatal(err)
		}
		futs = append(futs, f)
	}
	for _, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			b.Fatal(err)
		}
	}
	return float64(n) / time.Since(start).Seconds()
}
