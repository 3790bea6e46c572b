package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/shared/testkit"
)

// TestASpotPriceRiseInterruptsASpotRentalThroughTheCLI runs `shizu dev`
// and drives it through the CLI: two capped spot rentals run, `shizu
// spot-price` raises the market price above one maximum, and that rental
// is preempted (spot price above max) and stopped by its agent after the
// notice, while the other keeps running.
func TestASpotPriceRiseInterruptsASpotRentalThroughTheCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	d := startDev(t, "-ephemeral", "-fleet", "rtx4090x8:1")
	type rental struct {
		ID       string `json:"rental_id"`
		State    string `json:"state"`
		Why      string `json:"why"`
		Node     string `json:"node"`
		Segments []struct {
			Reason string `json:"exit_reason"`
		} `json:"segments"`
	}
	rent := func(maxPrice string) rental {
		var r rental
		d.json(&r, "rent", "-wait", "60s", "-plan", "spot", "-model", "RTX4090-24GB", "-max-price", maxPrice)
		if r.State != stateRunning {
			t.Fatalf("rent -max-price %s: %s (%s), want running", maxPrice, r.State, r.Why)
		}
		return r
	}
	// The dev fleet's list price is 2.00 USD per GPU-hour.
	low, high := rent("3.00"), rent("8.00")
	if code, out, errOut := d.cli("spot-price", "local", "RTX4090-24GB", "5.00"); code != 0 || !strings.Contains(out, "5.00 USD") {
		t.Fatalf("spot-price: exit %d %q %q", code, out, errOut)
	}
	// The notice is the scheduler's -preemption-notice (30 s in dev).
	testkit.Eventually(t, 120*time.Second, func() error {
		var r rental
		d.json(&r, "show", low.ID)
		if r.State != stateStopped || len(r.Segments) == 0 || r.Segments[len(r.Segments)-1].Reason != "preempted" {
			return fmt.Errorf("%s is %s (%s) %+v, want stopped as preempted", low.ID, r.State, r.Why, r.Segments)
		}
		return nil
	})
	var r rental
	d.json(&r, "show", high.ID)
	if r.State != stateRunning {
		t.Fatalf("the rental capped above the price is %s (%s)", r.State, r.Why)
	}
}
