package rentalview_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/rentalview"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// BenchmarkGet fills RENTALS with 1,000 and with 1,000,000 events (ten a
// rental: a request and nine pending notices), projects them (Rebuild),
// and prints Get's p99 for each, their ratio, and a bare KV Get's p99.
//
//	go test -run '^$' -bench BenchmarkGet -benchtime 1x ./rentalview/
func BenchmarkGet(b *testing.B) {
	p99 := map[int]time.Duration{}
	var bare time.Duration
	for _, n := range []int{1_000, 1_000_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			e := setupB(b)
			ctx := context.Background()
			start := time.Now()
			rentals := fill(b, e.js, n)
			filled := time.Since(start)
			start = time.Now()
			if err := e.proj.Rebuild(ctx); err != nil {
				b.Fatal(err)
			}
			b.Logf("%d events: fill %v, projection (Rebuild, %d records) %v", n, filled, rentals, time.Since(start))
			kv, err := e.js.KeyValue(ctx, rentalview.Bucket)
			if err != nil {
				b.Fatal(err)
			}
			var gets, kvGets []time.Duration
			runtime.GC() // the rebuild's garbage is not Get's cost
			b.ResetTimer()
			for range max(b.N, 1) {
				for range 2000 {
					id := fmt.Sprintf("r-%d", rand.IntN(rentals))
					t := time.Now()
					if _, err := e.store.Get(ctx, "acme", id); err != nil {
						b.Fatal(err)
					}
					gets = append(gets, time.Since(t))
					t = time.Now()
					if _, err := kv.Get(ctx, "acme."+id); err != nil {
						b.Fatal(err)
					}
					kvGets = append(kvGets, time.Since(t))
				}
			}
			p99[n] = pct(gets, 99)
			if n == 1_000_000 {
				bare = pct(kvGets, 99)
			}
			b.Logf("%d events: Get p99 %v, bare KV Get p99 %v", n, p99[n], pct(kvGets, 99))
			if n == 1_000_000 && p99[1_000] > 0 {
				b.Logf("Get p99: 1k events %v, 1M events %v, ratio %.2f; bare KV Get p99 (1M run) %v",
					p99[1_000], p99[1_000_000], float64(p99[1_000_000])/float64(p99[1_000]), bare)
			}
		})
	}
}

func pct(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[(len(s)-1)*p/100]
}

func setupB(b *testing.B) env { return setup(b) }

// fill publishes n events, ten a rental, async in batches of 2,048, and
// returns the number of rentals.
func fill(b *testing.B, js jetstream.JetStream, n int) int {
	rentals := n / 10
	reqSubj, _ := subject.Format(subject.RentalRequested, "acme")
	pendSubj, _ := subject.Format(subject.RentalPending, "acme")
	var futs []jetstream.PubAckFuture
	flush := func() {
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(time.Minute):
			b.Fatal("publish did not complete")
		}
		for _, f := range futs {
			select {
			case err := <-f.Err():
				b.Fatal(err)
			default:
			}
		}
		futs = futs[:0]
	}
	for i := range n {
		r := i % rentals
		id := fmt.Sprintf("r-%d", r)
		var m proto.Message
		subj := pendSubj
		if i < rentals {
			m, subj = requested("acme", id, shizuv1.Plan_PLAN_SPOT, nil), reqSubj
		} else {
			m = &shizuv1.RentalPending{Meta: meta(t0), RentalId: id, TenantId: "acme", Reason: shizuv1.PendingReason_PENDING_REASON_NO_CAPACITY}
		}
		data, err := proto.Marshal(m)
		if err != nil {
			b.Fatal(err)
		}
		f, err := js.PublishAsync(subj, data)
		if err != nil {
			b.Fatal(err)
		}
		futs = append(futs, f)
		if len(futs) == 2048 {
			flush()
		}
	}
	flush()
	return rentals
}
