// Package benchmark measures the autoscaler's decision latency: traffic
// sample published -> ScalingDecided received, the service running as
// deployed (app.Run) on real NATS and Redis, next to one bare JetStream
// publish -> receipt measured in the same run. `go test -bench`
// (BenchmarkDecisionLatency here) and `shizu bench` (its autoscaler check)
// both call Run.
package benchmark

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/types/known/durationpb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/autoscaler/app"
	"github.com/shizu-gpu/shizu/shared/benchkit"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// GoalP99MS is the sample -> decision p99 the autoscaler must stay under,
// in milliseconds (the autoscaler issue).
const GoalP99MS = 100

// policy is one pool that scales out above 10 concurrent requests per
// replica and in below 3, a replica at a time, without cooldowns: samples
// alternating load and quiet each change the pool.
const policy = `{"pools": [{"id": "bench", "tenant": "bench",
  "rental": {"gpu_count": 1, "milli_gpu": 1000, "models": ["H100-SXM5-80GB"]},
  "min_replicas": 1, "max_replicas": 4, "max_step_out": 4, "max_step_in": 4,
  "scale_out_cooldown": "0s", "scale_in_cooldown": "0s", "stale_after": "1m",
  "thresholds": [{"name": "busy", "metric": "concurrent_requests_per_replica", "scale_out_above": 10, "scale_in_below": 3, "step": 1}]}]}`

// Run starts the autoscaler with a one-pool policy (written to env.Dir)
// and measures, n times, a sample published to the ScalingDecided it
// causes, each followed by one bare publish -> receipt (the ceiling).
func Run(ctx context.Context, env *benchkit.Env, n int) (benchkit.Result, error) {
	start := time.Now()
	svc, err := startAutoscaler(ctx, env)
	if err != nil {
		return benchkit.Result{}, err
	}
	defer func() { _ = svc.Stop() }()
	decidedSubj, _ := subject.Format(subject.ScaleDecided, "bench")
	decided := make(chan *nats.Msg, 64)
	sub, err := env.Admin.NATS().ChanSubscribe(decidedSubj, decided)
	if err != nil {
		return benchkit.Result{}, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	ceilingSubj, _ := subject.Format(subject.ScaleDecided, "bench-ceiling")
	probe, err := env.NewReceiptProbe(ceilingSubj)
	if err != nil {
		return benchkit.Result{}, err
	}
	defer probe.Close()
	wait := func() error {
		select {
		case <-decided:
			return nil
		case <-svc.Exited():
			return fmt.Errorf("autoscaler: %w", svc.Err())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Second):
			return errors.New("no ScalingDecided within 10s of a sample")
		}
	}
	// Warm up: the pool reaches its floor and its first decision.
	env.Step("warm-up", 0.02)
	if err := sample(ctx, env, -1, 100); err != nil {
		return benchkit.Result{}, err
	}
	if err := wait(); err != nil {
		return benchkit.Result{}, err
	}
	for len(decided) > 0 {
		<-decided
	}
	lat := make([]time.Duration, 0, n)
	bare := make([]time.Duration, 0, n)
	for i := range n {
		if i%10 == 0 {
			env.Step("samples", 0.05+0.95*float64(i)/float64(n))
		}
		// Load takes the pool to 2 replicas, quiet back to 1.
		load := int64(100)
		if i%2 == 1 {
			load = 0
		}
		t := time.Now()
		if err := sample(ctx, env, i, load); err != nil {
			return benchkit.Result{}, err
		}
		if err := wait(); err != nil {
			return benchkit.Result{}, fmt.Errorf("sample %d: %w", i, err)
		}
		lat = append(lat, time.Since(t))
		d, err := probe.Measure(ctx, i)
		if err != nil {
			return benchkit.Result{}, err
		}
		bare = append(bare, d)
	}
	r := benchkit.Result{
		Measured: "p99 of traffic sample published -> ScalingDecided received (sample stored, pool state read and written in Redis, decision and replica rentals published)",
		Value:    benchkit.PercentileMS(lat, 0.99), Unit: "ms", Ceiling: benchkit.PercentileMS(bare, 0.99),
		CeilingWhat: "p99 of one bare JetStream publish (acked) to its receipt by a subscriber, same server",
		Goal:        GoalP99MS, AtMost: true, Size: n, Seconds: time.Since(start).Seconds(),
		Extra: map[string]float64{"p50_ms": benchkit.PercentileMS(lat, 0.5), "ceiling_p50_ms": benchkit.PercentileMS(bare, 0.5)},
	}
	r.Finish()
	return r, nil
}

// startAutoscaler runs the service with the benchmark's policy and waits
// until it is ready.
func startAutoscaler(ctx context.Context, env *benchkit.Env) (*benchkit.Service, error) {
	if env.Dir == "" {
		return nil, errors.New("autoscaler benchmark: the env has no scratch directory for the policy file")
	}
	path := filepath.Join(env.Dir, "autoscaler-policy.json")
	if err := os.WriteFile(path, []byte(policy), 0o644); err != nil {
		return nil, err
	}
	cfg := app.DefaultConfig()
	var err error
	if cfg.Service, err = env.ServiceConfig(topology.Autoscaler); err != nil {
		return nil, err
	}
	cfg.PolicyFile = path
	svc := benchkit.StartService(ctx, func(ctx context.Context) error { return app.Run(ctx, cfg) })
	if err := svc.WaitReady(ctx, cfg.Service.HTTPAddr); err != nil {
		_ = svc.Stop()
		return nil, fmt.Errorf("autoscaler not ready: %w", err)
	}
	return svc, nil
}

// sample publishes the i-th traffic sample of the pool with concurrent
// requests in flight.
func sample(ctx context.Context, env *benchkit.Env, i int, concurrent int64) error {
	subj, _ := subject.Format(subject.TrafficSample, "bench")
	now := time.Now()
	ev := &shizuv1.TrafficSampled{Meta: shizuv1.NewMeta("bench:traffic:"+strconv.Itoa(i)+":"+strconv.FormatInt(now.UnixNano(), 10), benchkit.Source, "", "bench", now),
		PoolId: "bench", ConcurrentRequests: concurrent, RequestsPerSecond: float64(concurrent) * 10, Window: durationpb.New(10 * time.Second)}
	_, err := env.Admin.Publish(ctx, subj, ev)
	return err
}
