package app_test

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// BenchmarkRebuildFromTheRentalsStream measures one rebuild of the
// records after their marker is gone, over the events of 4,000 placed
// rentals (a request and a scheduled event each), as events read per
// second.
//
//	go test -run '^$' -bench RebuildFromTheRentalsStream -benchtime 5x ./services/scheduler/app/
func BenchmarkRebuildFromTheRentalsStream(b *testing.B) {
	e := newEnv(b)
	for i := range 125 {
		e.register(gpuNode(fmt.Sprintf("node-%03d", i), 8, capacity.MarketOnDemand))
	}
	cfg := testConfig()
	cfg.RecordsCheck = 5 * time.Millisecond
	e.replica(cfg, time.Now)
	const rentals = 4000
	now := time.Now()
	for start := 0; start < rentals; start += 500 {
		var msgs []proto.Message
		for i := start; i < start+500; i++ {
			msgs = append(msgs, requested(fmt.Sprintf("bench-%04d", i), "acme", spec(1, 250, 8*1024, shizuv1.Plan_PLAN_ON_DEMAND), now))
		}
		e.publish(msgs...)
	}
	e.seen.waitFor(b, 120*time.Second, func(o *outcomes) error {
		if len(o.scheduled) < rentals {
			return fmt.Errorf("%d of %d scheduled", len(o.scheduled), rentals)
		}
		return nil
	})
	st, err := e.Admin.JetStream().Stream(b.Context(), topology.StreamRentals)
	if err != nil {
		b.Fatal(err)
	}
	events := st.CachedInfo().State.Msgs
	rdb := e.Redis.Client(b)
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		if err := rdb.Del(b.Context(), "shizu:sched:rebuilt").Err(); err != nil {
			b.Fatal(err)
		}
		testkit.Eventually(b, 120*time.Second, func() error {
			n, err := rdb.Exists(b.Context(), "shizu:sched:rebuilt").Result()
			if err != nil || n == 0 {
				return fmt.Errorf("not rebuilt yet: %w", err)
			}
			return nil
		})
	}
	per := time.Since(start) / time.Duration(b.N)
	b.ReportMetric(float64(events), "events")
	b.ReportMetric(float64(events)/per.Seconds(), "events/s")
	b.ReportMetric(float64(per.Milliseconds()), "ms/rebuild")
}
