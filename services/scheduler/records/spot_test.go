package records_test

import (
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/ports"
	"github.com/shizu-gpu/shizu/services/scheduler/records"
	"github.com/shizu-gpu/shizu/services/scheduler/round"
	"github.com/shizu-gpu/shizu/shared/rent"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

func TestTheLatestSpotPriceStaysInForceWhateverOrderTheChangesCome(t *testing.T) {
	t.Parallel()
	rec := records.New(testkit.StartRedis(t).Client(t), "t", time.Hour)
	at := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	price := func(micros int64, effective time.Time) ports.SpotPrice {
		return ports.SpotPrice{Zone: "eu-1", Model: "H100-SXM5-80GB", Price: placement.Price{Micros: micros, Currency: "USD"}, EffectiveAt: effective}
	}
	for _, step := range []struct {
		name string
		set  ports.SpotPrice
		want int64
	}{
		{"the first price", price(2_000_000, at), 2_000_000},
		{"a later one replaces it", price(3_000_000, at.Add(time.Minute)), 3_000_000},
		{"an earlier one, delivered late, does not", price(1_000_000, at.Add(30*time.Second)), 3_000_000},
		{"the same change again keeps the first", price(5_000_000, at.Add(time.Minute)), 3_000_000},
	} {
		in, err := rec.SetSpotPrice(t.Context(), step.set)
		if err != nil {
			t.Fatal(err)
		}
		if in.Price.Micros != step.want {
			t.Fatalf("%s: in force %d, want %d", step.name, in.Price.Micros, step.want)
		}
	}
	other := ports.SpotPrice{Zone: "eu-2", Model: "H100-SXM5-80GB", Price: placement.Price{Micros: 7, Currency: "USD"}, EffectiveAt: at}
	if _, err := rec.SetSpotPrice(t.Context(), other); err != nil {
		t.Fatal(err)
	}
	all, err := rec.SpotPrices(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]ports.SpotPrice{}
	for _, p := range all {
		got[p.Zone] = p
	}
	if len(all) != 2 || got["eu-1"].Price.Micros != 3_000_000 || !got["eu-1"].EffectiveAt.Equal(at.Add(time.Minute)) ||
		got["eu-1"].Model != "H100-SXM5-80GB" || got["eu-2"].Price.Micros != 7 {
		t.Fatalf("prices %+v", all)
	}
}

func TestAPlacedSpotRentalsClassRecordKeepsItsMaxPrice(t *testing.T) {
	t.Parallel()
	rec := records.New(testkit.StartRedis(t).Client(t), "t", time.Hour)
	capped := ports.Class{Class: rent.ClassSpot, Priority: 2, MaxSpotPrice: placement.Price{Micros: 1_200_000, Currency: "USD"}}
	plain := ports.Class{Class: rent.ClassOnDemand, Priority: 1}
	if _, err := rec.Claim(t.Context(), []string{"capped", "plain"}, round.OutcomeScheduled, []string{"n1@1", "n1@2"},
		[]ports.Class{capped, plain}); err != nil {
		t.Fatal(err)
	}
	got, err := rec.Classes(t.Context(), []string{"capped", "plain"})
	if err != nil {
		t.Fatal(err)
	}
	if got["capped"] != capped || got["plain"] != plain {
		t.Fatalf("classes %+v, want %+v and %+v", got, capped, plain)
	}
}
