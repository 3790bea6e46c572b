package round_test

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/round"
	"github.com/shizu-gpu/shizu/services/scheduler/view"
	"github.com/shizu-gpu/shizu/shared/rent"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// node is a ready on-demand node in zone-a with n empty H100s.
func node(id string, n int) placement.Node {
	nd := placement.Node{
		ID: id, Epoch: 3, Ready: true, Zone: "zone-a", Market: rent.OnDemand,
		CPUMilli: 128_000, MemoryMiB: 1 << 20, FreeCPUMilli: 128_000, FreeMemoryMiB: 1 << 20,
	}
	for i := range n {
		nd.GPUs = append(nd.GPUs, placement.GPU{
			Index: i, UUID: fmt.Sprintf("GPU-%s-%d", id, i), Model: "H100-SXM5-80GB", VRAMMiB: 80 * 1024,
			FreeMilli: 1000, FreeVRAMMiB: 80 * 1024, NVLinkDomain: 0, PCIeSwitch: i / 2, NUMA: i * 2 / max(n, 1),
		})
	}
	return nd
}

// viewOf is a view of nodes read at t0.
func viewOf(nodes ...placement.Node) *view.View {
	v := view.New(100)
	v.Reset(nodes, 1, t0)
	return v
}

func config(t *testing.T) round.Config {
	t.Helper()
	pl, err := placement.NewPlacer(placement.Options{Policy: placement.PolicyShizu, Catalogue: placement.DefaultCatalogue()})
	if err != nil {
		t.Fatal(err)
	}
	// The autoscaler may provision H100x8 nodes in zone-a: a request that
	// no node of a test's small view holds waits for capacity (one that
	// even these could not hold is rejected as unsatisfiable).
	return round.Config{Placer: pl, AgingStep: time.Second, PendingTimeout: 10 * time.Minute, PreemptionNotice: 30 * time.Second,
		Offers: []placement.Offer{{Name: "h100x8", Model: "H100-SXM5-80GB", GPUs: 8, Zones: []string{"zone-a"}}}}
}

// job is a valid on-demand request for one whole GPU made at t0, first
// attempt.
func job(t *testing.T, id string, edit ...func(*round.Job)) *round.Job {
	t.Helper()
	ev := &shizuv1.RentalRequested{
		Meta:     &shizuv1.EventMeta{EventId: "req:" + id, OccurredAt: timestamppb.New(t0), Source: "test", CorrelationId: id},
		RentalId: id, TenantId: "tenant-" + id,
		Spec: &shizuv1.RentalSpec{GpuCount: 1, MilliGpu: 1000, Plan: shizuv1.Plan_PLAN_ON_DEMAND},
	}
	r := placement.Request{ID: id, Tenant: ev.GetTenantId(), Class: rent.ClassOnDemand, GPUCount: 1, MilliPerGPU: 1000,
		CPUMilli: 4000, MemoryMiB: 16 * 1024, Market: rent.OnDemand}
	j := round.NewJob(ev, r, 1, config(t))
	for _, e := range edit {
		e(&j)
	}
	return &j
}

func spot(j *round.Job) {
	j.Request.Class, j.Request.Market = rent.ClassSpot, rent.AnyMarket
}

func reserved(j *round.Job) { j.Request.Class = rent.ClassReserved }

func madeAt(at time.Time) func(*round.Job) {
	return func(j *round.Job) { j.Enqueued, j.Deadline = at, at.Add(10*time.Minute) }
}

func ids[J round.Planned](jobs []J) []string {
	out := make([]string, len(jobs))
	for i, j := range jobs {
		out[i] = j.Planning().Request.ID
	}
	return out
}
