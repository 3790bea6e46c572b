package app

import (
	"testing"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/ports"
	"github.com/shizu-gpu/shizu/shared/rent"
)

// The class a rebuild records for a running rental is the one its round
// recorded: a capped spot rental keeps its cap (the price-rise
// interruption reads it), and a rental whose request the stream no longer
// holds counts as on-demand, as one without a class record does.
func TestARebuiltClassIsTheOneItsRoundRecorded(t *testing.T) {
	t.Parallel()
	ev := &shizuv1.RentalRequested{RentalId: "r1", TenantId: "acme", Spec: &shizuv1.RentalSpec{GpuCount: 1, MilliGpu: 1000,
		Plan: shizuv1.Plan_PLAN_SPOT, Priority: 3, MaxSpotPricePerGpuHour: &shizuv1.Money{Micros: 1_200_000, Currency: "USD"}}}
	r := requestOf(ev)
	want := ports.Class{Class: r.Class, Priority: r.Priority, MaxSpotPrice: r.MaxSpotPrice}
	if got := classOf(ev); got != want || got.Class != rent.ClassSpot || got.MaxSpotPrice.Micros != 1_200_000 {
		t.Fatalf("rebuilt class %+v, want %+v (spot, priority 3, capped at 1.20 USD)", got, want)
	}
	if got := classOf(nil); got != (ports.Class{Class: rent.ClassOnDemand}) {
		t.Fatalf("class without a request: %+v, want on-demand", got)
	}
}
