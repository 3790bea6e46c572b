package app_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/services/metering/app"
	"github.com/shizu-gpu/shizu/services/metering/redisstore"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

// BenchmarkRebuildAfterLosingRedis bills 5,000 short rentals (15,000
// rental events, 5,000 usage records), empties Redis, and times
// RebuildStore (reported as messages replayed per second).
//
//	go test -run '^$' -bench RebuildAfter -benchtime 1x ./services/metering/app/
func BenchmarkRebuildAfterLosingRedis(b *testing.B) {
	const rentals = 5_000
	for range b.N {
		b.StopTimer()
		e := newEnv(b)
		cfg := testConfig()
		r := e.startMeter(b, cfg, fixed(base.Add(time.Hour)))
		e.publishAsync(b, benchRentals(rentals, false))
		testkit.Eventually(b, 5*time.Minute, func() error {
			_, n := e.billed(b)
			if n < rentals {
				return errNotYet(n)
			}
			return e.busy(b.Context())
		})
		r.stop(b.Context())
		if err := e.rdb.FlushAll(b.Context()).Err(); err != nil {
			b.Fatal(err)
		}
		m, err := app.NewMeter(cfg, app.Deps{Conn: e.pub, Now: fixed(base.Add(time.Hour))})
		if err != nil {
			b.Fatal(err)
		}
		store := redisstore.New(e.rdb, cfg.KeyPrefix)
		b.StartTimer()
		start := time.Now()
		res, err := app.RebuildStore(b.Context(), m, store)
		took := time.Since(start)
		b.StopTimer()
		if err != nil {
			b.Fatal(err)
		}
		if res.Segments != rentals || res.UsageRecords != rentals {
			b.Fatalf("rebuilt %+v", res)
		}
		msgs := res.RentalEvents + res.UsageRecords + res.SpotPrices
		b.ReportMetric(float64(msgs)/took.Seconds(), "msgs/s")
		b.ReportMetric(took.Seconds(), "s/rebuild")
	}
}

type errNotYet int

func (n errNotYet) Error() string { return "billed " + strconv.Itoa(int(n)) + " records so far" }
