package app_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/gateway/identity"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// BenchmarkGetRental reads random rentals of 1,000 through GET
// /v1/rentals/{id} (key check, rate limit, request validation, read model,
// JSON) and prints its p50 and p99 next to a bare KV get of the same
// records measured in the same run.
//
//	go test -run '^$' -bench BenchmarkGetRental -benchtime 1x ./app/
func BenchmarkGetRental(b *testing.B) {
	h := newHarness(b, 1, testOptions())
	key := h.tenant("acme", identity.ReadOnly)
	const rentals = 1000
	for i := range rentals {
		id := fmt.Sprintf("r-%d", i)
		h.publish(subject.RentalRequested, "acme", &shizuv1.RentalRequested{
			Meta: shizuv1.NewMeta("rental:"+id+":requested", "bench", "", id, time.Now()), RentalId: id, TenantId: "acme",
			Spec: &shizuv1.RentalSpec{GpuCount: 1, MilliGpu: 1000, Plan: shizuv1.Plan_PLAN_ON_DEMAND}})
	}
	kv, err := h.admin.JetStream().KeyValue(b.Context(), topology.RentalViewBucket)
	if err != nil {
		b.Fatal(err)
	}
	testkit.Eventually(b, 60*time.Second, func() error {
		_, err := kv.Get(b.Context(), fmt.Sprintf("acme.r-%d", rentals-1))
		return err
	})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	var api, bare []time.Duration
	b.ResetTimer()
	for range max(b.N, 1) {
		for range 2000 {
			id := fmt.Sprintf("r-%d", rand.IntN(rentals))
			req, _ := http.NewRequestWithContext(context.WithoutCancel(b.Context()), "GET", h.urls[0]+"/v1/rentals/"+id, nil)
			req.Header.Set("Authorization", "Bearer "+key)
			t := time.Now()
			resp, err := client.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			api = append(api, time.Since(t))
			if resp.StatusCode != http.StatusOK {
				b.Fatalf("GET %s: %d", id, resp.StatusCode)
			}
			t = time.Now()
			if _, err := kv.Get(b.Context(), "acme."+id); err != nil {
				b.Fatal(err)
			}
			bare = append(bare, time.Since(t))
		}
	}
	b.StopTimer()
	pct := func(ds []time.Duration, p float64) float64 {
		s := slices.Clone(ds)
		slices.Sort(s)
		return float64(s[int(p*float64(len(s)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(api, 0.99), "p99-ms")
	b.ReportMetric(pct(api, 0.50), "p50-ms")
	b.ReportMetric(pct(bare, 0.99), "bare-kv-p99-ms")
	b.Logf("GET /v1/rentals/{id} (%d rentals): p50 %.3f ms, p99 %.3f ms; bare KV get p50 %.3f ms, p99 %.3f ms (%d calls each)",
		rentals, pct(api, 0.5), pct(api, 0.99), pct(bare, 0.5), pct(bare, 0.99), len(api))
}
