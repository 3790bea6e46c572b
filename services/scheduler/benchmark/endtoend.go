// Package benchmark measures the scheduler end to end: a queued burst of
// rental requests placed by one replica (app.Run) on 1,000 registered
// nodes x 8 GPUs, through real NATS and Redis, next to the capacity
// store's bare reserves and JetStream's bare publishes measured in the
// same run. `go test -bench` (BenchmarkEndToEnd here) and `shizu bench`
// (its scheduler check) both call Run.
package benchmark

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/app"
	"github.com/shizu-gpu/shizu/services/scheduler/records"
	"github.com/shizu-gpu/shizu/shared/benchkit"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Goal is the placements/s one replica must reach end to end (DESIGN.md).
const Goal = 10_000

// Options are the replica's placement settings under test.
type Options struct {
	Policy string
	// MaxCandidates bounds the feasible nodes scored (0 = all).
	MaxCandidates int
}

// DefaultOptions are the scheduler's defaults.
func DefaultOptions() Options {
	def := app.DefaultConfig()
	return Options{Policy: def.Policy, MaxCandidates: def.MaxCandidates}
}

// Run measures n requests with the scheduler's default configuration.
func Run(ctx context.Context, env *benchkit.Env, n int) (benchkit.Result, error) {
	return RunWith(ctx, env, n, DefaultOptions())
}

// RunWith queues n rental requests (80 % quarter GPUs, 20 % whole GPUs),
// starts one replica with opts and measures placements/s from its start to
// the last RentalScheduled, and the CPU that cost; then request ->
// scheduled latency at half that rate, then the ceilings. The env must be
// fresh, and n at most MaxRequests: the fleet is full after that, and the
// requests that do not fit would wait forever.
func RunWith(ctx context.Context, env *benchkit.Env, n int, opts Options) (benchkit.Result, error) {
	if n < 1 || n > MaxRequests {
		return benchkit.Result{}, fmt.Errorf("%d requests: the benchmark's fleet (%d nodes x 8 GPUs) holds %d requests with their paced ones; ask for 1 to %d",
			n, fleetNodes, fleetRequests, MaxRequests)
	}
	start := time.Now()
	cfg := app.DefaultConfig()
	cfg.Policy, cfg.MaxCandidates = opts.Policy, opts.MaxCandidates
	var err error
	if cfg.Service, err = env.ServiceConfig(topology.Scheduler); err != nil {
		return benchkit.Result{}, err
	}
	env.Step("registering 1,000 nodes", 0.02)
	if err := registerFleet(ctx, env, cfg.KeyPrefix); err != nil {
		return benchkit.Result{}, err
	}
	// A running deployment: its records were whole before the burst came
	// (fresh ones would first be rebuilt from the RENTALS stream).
	if err := records.New(env.Redis, cfg.KeyPrefix, cfg.OutcomeTTL).MarkRebuilt(ctx, 0); err != nil {
		return benchkit.Result{}, err
	}
	out, err := watchScheduled(env)
	if err != nil {
		return benchkit.Result{}, err
	}
	defer out.close()

	// The burst is queued before the replica starts, so the rate is the
	// scheduler's own, not the load generator's; it includes the replica's
	// start and its first snapshot of the fleet.
	env.Step("queueing requests", 0.05)
	if err := out.send(ctx, env, requests("r-", n)); err != nil {
		return benchkit.Result{}, err
	}
	cpu, err := env.StartCPU(ctx)
	if err != nil {
		return benchkit.Result{}, err
	}
	t0 := time.Now()
	svc := benchkit.StartService(ctx, func(ctx context.Context) error { return app.Run(ctx, cfg) })
	defer func() { _ = svc.Stop() }()
	if err := out.waitFor(ctx, env, svc, int64(n), "placing the burst", 0.1, 0.6); err != nil {
		return benchkit.Result{}, err
	}
	rate := float64(n) / time.Since(t0).Seconds()
	used, err := cpu.Stop(ctx, n)
	if err != nil {
		return benchkit.Result{}, err
	}
	lat, err := out.paced(ctx, env, svc, n, rate)
	if err != nil {
		return benchkit.Result{}, err
	}

	env.Step("Redis reserve ceiling", 0.75)
	redisRate, err := env.ReserveCeiling(ctx, 32, min(n, 8000))
	if err != nil {
		return benchkit.Result{}, err
	}
	env.Step("JetStream publish ceiling", 0.9)
	jsRate, err := env.PublishCeiling(ctx, min(n*3, 20000))
	if err != nil {
		return benchkit.Result{}, err
	}
	r := benchkit.Result{
		Measured: "rental requests placed end to end by one replica (queued burst, 80% quarter GPUs, 1,000 nodes x 8 GPUs)",
		Value:    rate, Unit: "placements/s", Ceiling: redisRate,
		CeilingWhat: "bare capacity-store reserves/s on the same Redis, 32 clients (one reserve per placement)",
		Goal:        Goal, Size: n, Seconds: time.Since(start).Seconds(), CPU: used,
		Extra: map[string]float64{
			"jetstream_publishes_per_s_div_3": jsRate / 3, "ratio_vs_jetstream_div_3": rate / (jsRate / 3),
			"paced_p50_ms": benchkit.PercentileMS(lat, 0.5), "paced_p99_ms": benchkit.PercentileMS(lat, 0.99),
		},
	}
	r.Finish()
	return r, nil
}

// The fleet and what it holds: every fifth request takes a whole GPU,
// the others a quarter, so five requests fill two GPUs.
const (
	fleetNodes    = 1000
	fleetRequests = fleetNodes * 8 * 5 / 2
	// MaxRequests is the largest burst whose paced requests still fit.
	MaxRequests = fleetRequests - 2000
)

func registerFleet(ctx context.Context, env *benchkit.Env, prefix string) error {
	store, err := capacity.New(env.Redis, capacity.WithPrefix(prefix))
	if err != nil {
		return err
	}
	for i := range fleetNodes {
		if _, err := store.Register(ctx, benchkit.CapacityNode(fmt.Sprintf("node-%04d", i))); err != nil {
			return err
		}
	}
	return nil
}

// batch is rental requests and the subjects they are published on.
type batch struct {
	subjects []string
	evs      []*shizuv1.RentalRequested
}

func (b batch) slice(i, j int) batch { return batch{b.subjects[i:j], b.evs[i:j]} }

// requests are count requests: every fifth a whole GPU, the others a
// quarter GPU with 8 GiB, from 16 tenants.
func requests(prefix string, count int) batch {
	b := batch{make([]string, count), make([]*shizuv1.RentalRequested, count)}
	for i := range count {
		id := prefix + strconv.Itoa(i)
		sp := &shizuv1.RentalSpec{GpuCount: 1, MilliGpu: 250, VramMib: 8 * 1024, Plan: shizuv1.Plan_PLAN_ON_DEMAND}
		if i%5 == 0 {
			sp = &shizuv1.RentalSpec{GpuCount: 1, MilliGpu: 1000, Plan: shizuv1.Plan_PLAN_ON_DEMAND}
		}
		tenant := "tenant-" + strconv.Itoa(i%16)
		b.subjects[i], _ = subject.Format(subject.RentalRequested, tenant)
		b.evs[i] = &shizuv1.RentalRequested{Meta: shizuv1.NewMeta("req:"+id, benchkit.Source, "", id, time.Now()),
			RentalId: id, TenantId: tenant, Spec: sp}
	}
	return b
}

// scheduled counts the RentalScheduled events the replica publishes and
// the time from each request's publish to its outcome.
type scheduled struct {
	sub     *nats.Subscription
	mu      sync.Mutex
	sent    map[string]time.Time
	latency []time.Duration
	got     atomic.Int64
}

func watchScheduled(env *benchkit.Env) (*scheduled, error) {
	s := &scheduled{sent: map[string]time.Time{}}
	var err error
	if s.sub, err = env.Admin.NATS().Subscribe(subject.RentalScheduledAll, s.receive); err != nil {
		return nil, err
	}
	if err := env.Admin.NATS().Flush(); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

func (s *scheduled) receive(m *nats.Msg) {
	ev := &shizuv1.RentalScheduled{}
	if proto.Unmarshal(m.Data, ev) != nil {
		return
	}
	now := time.Now()
	s.mu.Lock()
	if t0, ok := s.sent[ev.GetRentalId()]; ok {
		s.latency = append(s.latency, now.Sub(t0))
		delete(s.sent, ev.GetRentalId())
	}
	s.mu.Unlock()
	s.got.Add(1)
}

func (s *scheduled) close() { _ = s.sub.Unsubscribe() }

// send stamps b's requests with the time now and publishes them.
func (s *scheduled) send(ctx context.Context, env *benchkit.Env, b batch) error {
	now := time.Now()
	msgs := make([]proto.Message, len(b.evs))
	s.mu.Lock()
	for i, ev := range b.evs {
		ev.Meta.OccurredAt = timestamppb.New(now)
		s.sent[ev.GetRentalId()] = now
		msgs[i] = ev
	}
	s.mu.Unlock()
	return env.PublishAll(ctx, b.subjects, msgs)
}

// waitFor waits until count requests are scheduled, reporting progress
// from..to of the run.
func (s *scheduled) waitFor(ctx context.Context, env *benchkit.Env, svc *benchkit.Service, count int64, phase string, from, to float64) error {
	err := benchkit.WaitUntil(ctx, 5*time.Minute, func() (bool, error) {
		if err := svc.Err(); err != nil {
			return false, fmt.Errorf("scheduler: %w", err)
		}
		g := s.got.Load()
		env.Step(phase, from+(to-from)*float64(g)/float64(count))
		return g >= count, nil
	})
	if err != nil {
		return fmt.Errorf("%d of %d requests scheduled: %w", s.got.Load(), count, err)
	}
	return nil
}

// paced sends min(2000, max(100, n/2)) more requests at half the burst
// rate, in 10 ms ticks, and returns their request -> scheduled latencies.
func (s *scheduled) paced(ctx context.Context, env *benchkit.Env, svc *benchkit.Service, n int, rate float64) ([]time.Duration, error) {
	s.mu.Lock()
	s.latency = s.latency[:0]
	s.mu.Unlock()
	count := min(2000, max(100, n/2))
	b := requests("p-", count)
	perTick := max(1, int(rate/2/100))
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for i := 0; i < count; i += perTick {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		j := min(count, i+perTick)
		if err := s.send(ctx, env, b.slice(i, j)); err != nil {
			return nil, err
		}
		env.Step("paced latency", 0.6+0.1*float64(j)/float64(count))
	}
	if err := s.waitFor(ctx, env, svc, int64(n+count), "paced latency", 0.7, 0.7); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.latency), nil
}
