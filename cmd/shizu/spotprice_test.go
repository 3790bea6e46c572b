package main

import (
	"strings"
	"testing"
	"time"
)

func TestASpotPriceChangeIsTheEventTheMarketStreamCarries(t *testing.T) {
	now := time.Date(2026, 12, 3, 14, 30, 15, 500, time.UTC)
	ev, subj, err := spotPriceChanged([]string{"local", "A100-SXM4-80GB", "2.10"}, "USD", "", now)
	if err != nil {
		t.Fatal(err)
	}
	if subj != "spot.local.A100-SXM4-80GB.price" || ev.GetMeta().GetEventId() != "spot:local:A100-SXM4-80GB:2026-12-03T14:30:15Z" {
		t.Fatalf("subject %s, id %s", subj, ev.GetMeta().GetEventId())
	}
	if p := ev.GetPricePerGpuHour(); p.GetMicros() != 2_100_000 || p.GetCurrency() != "USD" || !ev.GetEffectiveAt().AsTime().Equal(now.Truncate(time.Second)) {
		t.Fatalf("price %v from %v", p, ev.GetEffectiveAt().AsTime())
	}
	ev, _, err = spotPriceChanged([]string{"eu-1", "H100-SXM5-80GB", "3"}, "USD", "2026-12-03T15:00:00.75Z", now)
	if err != nil {
		t.Fatal(err)
	}
	if ev.GetEffectiveAt().AsTime() != time.Date(2026, 12, 3, 15, 0, 0, 0, time.UTC) || ev.GetMeta().GetEventId() != "spot:eu-1:H100-SXM5-80GB:2026-12-03T15:00:00Z" {
		t.Fatalf("at %v, id %s", ev.GetEffectiveAt().AsTime(), ev.GetMeta().GetEventId())
	}
	if _, _, err := spotPriceChanged([]string{"eu-1", "H100-SXM5-80GB", "3"}, "USD", "tomorrow", now); err == nil {
		t.Fatal("a bad -at was taken")
	}
	// What metering would refuse to bill by is refused, naming why.
	for _, c := range []struct {
		args     []string
		currency string
		want     string
	}{
		{[]string{"eu-1", "H200-NOPE", "3"}, "USD", "not in the price catalogue"},
		{[]string{"eu-1", "H100-SXM5-80GB", "3"}, "EUR", "the catalogue prices in USD"},
		{[]string{"eu-1", "H100-SXM5-80GB", "20000"}, "USD", "above the most a GPU-hour may cost"},
	} {
		if _, _, err := spotPriceChanged(c.args, c.currency, "", now); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("spot-price %v %s: %v; want %q", c.args, c.currency, err, c.want)
		}
	}
}
