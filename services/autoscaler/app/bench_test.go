package app_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
)

// BenchmarkDecisionLatency measures, on real NATS and Redis, the time from
// publishing a traffic sample to receiving the ScalingDecided it causes
// (sample stored, delivered, state read and written in Redis, decision and
// rental events published and acknowledged). Samples alternate between
// load and quiet so each one changes the pool. The ceiling, measured in the
// same run, is one bare JetStream publish to its receipt by a subscriber:
// the decision path has two such hops plus Redis.
//
//	go test -run '^$' -bench DecisionLatency -benchtime 300x ./services/autoscaler/app
func BenchmarkDecisionLatency(b *testing.B) {
	file := testPolicy()
	file.Pools[0].Thresholds[0].Step = 1
	file.Pools[0].MaxReplicas = 4
	e := start(b, file)
	nc := e.admin.NATS()
	decided := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe("scale.web.decided", decided)
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	ceiling := make(chan *nats.Msg, 64)
	csub, err := nc.ChanSubscribe("scale.ceiling.decided", ceiling)
	if err != nil {
		b.Fatal(err)
	}
	defer csub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		b.Fatal(err)
	}
	wait := func(ch chan *nats.Msg) {
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			b.Fatal("no event within 10 s")
		}
	}
	// Warm up: the pool reaches its floor and its first decision.
	e.sample(b, "web", 100)
	wait(decided)
	for len(decided) > 0 {
		<-decided
	}

	lat := make([]time.Duration, 0, b.N)
	base := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		// The warm-up woke the pool to 1 replica: load takes it to 2,
		// quiet back to 1, so every sample changes the pool.
		load := int64(100)
		if i%2 == 1 {
			load = 0
		}
		start := time.Now()
		e.sample(b, "web", load)
		wait(decided)
		lat = append(lat, time.Since(start))

		start = time.Now()
		ev := &shizuv1.ScalingDecided{Meta: &shizuv1.EventMeta{EventId: fmt.Sprintf("ceiling-%d", i), OccurredAt: timestamppb.Now(), Source: "bench"},
			PoolId: "ceiling", FromReplicas: 1, ToReplicas: 2, Rule: "bench", Metric: "bench"}
		if _, err := e.admin.Publish(b.Context(), "scale.ceiling.decided", ev); err != nil {
			b.Fatal(err)
		}
		wait(ceiling)
		base = append(base, time.Since(start))
	}
	b.StopTimer()
	p := func(xs []time.Duration, q float64) float64 {
		s := slices.Clone(xs)
		slices.Sort(s)
		return float64(s[min(len(s)-1, int(q*float64(len(s))))]) / float64(time.Millisecond)
	}
	b.ReportMetric(p(lat, 0.50), "p50_ms")
	b.ReportMetric(p(lat, 0.99), "p99_ms")
	b.ReportMetric(p(base, 0.50), "ceiling_p50_ms")
	b.ReportMetric(p(base, 0.99), "ceiling_p99_ms")
	b.ReportMetric(p(lat, 0.99)/p(base, 0.99), "p99_vs_ceiling")
}
