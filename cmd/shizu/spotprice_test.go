package main

import (
	"testing"
	"time"
)

func TestASpotPriceChangeIsTheEventTheMarketStreamCarries(t *testing.T) {
	now := time.Date(2026, 12, 3, 14, 30, 15, 500, time.UTC)
	ev, subj, err := spotPriceChanged([]string{"local", "A100-PCIE-40GB", "2.10"}, "USD", "", now)
	if err != nil {
		t.Fatal(err)
	}
	if subj != "spot.local.A100-PCIE-40GB.price" || ev.GetMeta().GetEventId() != "spot:local:A100-PCIE-40GB:2026-12-03T14:30:15Z" {
		t.Fatalf("subject %s, id %s", subj, ev.GetMeta().GetEventId())
	}
	if p := ev.GetPricePerGpuHour(); p.GetMicros() != 2_100_000 || p.GetCurrency() != "USD" || !ev.GetEffectiveAt().AsTime().Equal(now.Truncate(time.Second)) {
		t.Fatalf("price %v from %v", p, ev.GetEffectiveAt().AsTime())
	}
	ev, _, err = spotPriceChanged([]string{"eu-1", "H100-SXM5-80GB", "3"}, "EUR", "2026-12-03T15:00:00Z", now)
	if err != nil {
		t.Fatal(err)
	}
	if ev.GetEffectiveAt().AsTime() != time.Date(2026, 12, 3, 15, 0, 0, 0, time.UTC) || ev.GetMeta().GetEventId() != "spot:eu-1:H100-SXM5-80GB:2026-12-03T15:00:00Z" {
		t.Fatalf("at %v, id %s", ev.GetEffectiveAt().AsTime(), ev.GetMeta().GetEventId())
	}
	if _, _, err := spotPriceChanged([]string{"eu-1", "H100-SXM5-80GB", "3"}, "EUR", "tomorrow", now); err == nil {
		t.Fatal("a bad -at was taken")
	}
}
