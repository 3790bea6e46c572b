package app_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// spotCapped is a spot spec for one whole GPU at most micros USD per
// GPU-hour.
func spotCapped(micros int64) *shizuv1.RentalSpec {
	sp := spec(1, 1000, 0, shizuv1.Plan_PLAN_SPOT)
	sp.MaxSpotPricePerGpuHour = &shizuv1.Money{Micros: micros, Currency: "USD"}
	return sp
}

func TestASpotRentalIsNeverScheduledOnANodePricedAboveItsMax(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h100 := gpuNode("h100", 2, capacity.MarketOnDemand)
	h100.PricePerGPUHourMicros = 2_490_000 // the H100's list price
	e.register(h100)
	e.replica(testConfig(), time.Now)
	e.publish(requested("cheap", "acme", spotCapped(1_200_000), time.Now()),
		requested("enough", "acme", spotCapped(2_490_000), time.Now()))
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) error {
		if len(o.scheduled["enough"]) != 1 {
			return fmt.Errorf("the spot rental whose max is the price: %d scheduled", len(o.scheduled["enough"]))
		}
		if len(o.pending["cheap"]) != 1 {
			return fmt.Errorf("the spot rental capped at 1.20: %d pending events", len(o.pending["cheap"]))
		}
		return nil
	})
	e.seen.mu.Lock()
	defer e.seen.mu.Unlock()
	if s := e.seen.scheduled["cheap"]; len(s) != 0 {
		t.Fatalf("the spot rental capped at 1.20 was scheduled on %s, priced 2.49", s[0].GetNodeId())
	}
	p := e.seen.pending["cheap"][0]
	if p.GetReason() != shizuv1.PendingReason_PENDING_REASON_SPOT_PRICE_ABOVE_MAX || !strings.Contains(p.GetMessage(), "1.200000 USD") {
		t.Fatalf("pending %v %q, want waiting for the spot price, naming the max", p.GetReason(), p.GetMessage())
	}
	if e.seen.shortages != 0 {
		t.Fatalf("%d capacity shortages: a rental waiting for the price asks for no node", e.seen.shortages)
	}
}

// spotCappedIn is spotCapped in currency.
func spotCappedIn(micros int64, currency string) *shizuv1.RentalSpec {
	sp := spotCapped(micros)
	sp.MaxSpotPricePerGpuHour.Currency = currency
	return sp
}

// setSpotPrice publishes a SpotPriceChanged for the market of node (its
// zone and GPU model) as the admin, and waits until the scheduler's
// durable acknowledged it: its handler returned, every decision it takes
// is taken.
func (e *env) setSpotPrice(node capacity.NodeState, micros int64, at time.Time) {
	t := e.t
	t.Helper()
	zone, model := node.Zone, node.GPUs[0].Model
	subj, err := subject.Format(subject.SpotPriceChanged, zone, model)
	if err != nil {
		t.Fatal(err)
	}
	ev := &shizuv1.SpotPriceChanged{
		Meta: &shizuv1.EventMeta{EventId: fmt.Sprintf("spot:%s:%s:%s", zone, model, at.UTC().Format(time.RFC3339)),
			OccurredAt: timestamppb.New(at), Source: "test", CorrelationId: zone},
		Model: model, Zone: zone, PricePerGpuHour: &shizuv1.Money{Micros: micros, Currency: node.Currency},
		EffectiveAt: timestamppb.New(at),
	}
	ack, err := e.Admin.Publish(t.Context(), subj, ev)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, func() error {
		cons, err := e.Admin.JetStream().Consumer(t.Context(), topology.StreamMarket, "scheduler-spot")
		if err != nil {
			return err
		}
		info, err := cons.Info(t.Context())
		if err != nil {
			return err
		}
		if info.AckFloor.Stream < ack.Sequence || info.NumAckPending != 0 {
			return fmt.Errorf("scheduler-spot acknowledged up to %d, the price is %d", info.AckFloor.Stream, ack.Sequence)
		}
		return nil
	})
}

// A running capped spot rental is interrupted (notice, then a stop by its
// agent, as preempted) when the spot price of its zone and model rises
// above its maximum; a change that stays at or under a rental's maximum,
// a rental without a maximum, and a rental placed under the new price
// are left alone, and a request capped under the new price is no longer
// placed (the list price it would have fitted under is not the price).
func TestASpotRentalIsInterruptedWhenThePriceRisesAboveItsMax(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testkit.WithHeartbeats(3*time.Second))
	down := e.watchStops()
	e.startAgent("n1", "a100pcie4") // 4 GPUs
	cfg := testConfig()
	cfg.PreemptionNotice = time.Second
	cfg.ReconcileInterval = 200 * time.Millisecond // the sweep runs often too
	e.replica(cfg, time.Now)
	e.replica(cfg, time.Now)
	node, err := e.store.Node(t.Context(), "n1")
	if err != nil {
		t.Fatal(err)
	}
	list, cur := node.PricePerGPUHourMicros, node.Currency
	if list <= 0 || cur == "" {
		t.Fatalf("the agent registered no list price (%d %q)", list, cur)
	}
	// Placed under the list price: capped a bit above it, well above it,
	// and without a cap.
	e.publish(requested("capped", "spotty", spotCappedIn(list+500_000, cur), time.Now()),
		requested("high", "spotty", spotCappedIn(list+2_000_000, cur), time.Now()),
		requested("uncapped", "spotty", spec(1, 1000, 0, shizuv1.Plan_PLAN_SPOT), time.Now()))
	e.seen.waitFor(t, 30*time.Second, func(o *outcomes) error {
		for _, id := range []string{"capped", "high", "uncapped"} {
			if len(o.scheduled[id]) == 0 {
				return fmt.Errorf("%s not scheduled", id)
			}
		}
		return nil
	})
	at := time.Now().Truncate(time.Second)
	// A rise that stays under every maximum touches nothing.
	e.setSpotPrice(node, list+300_000, at)
	e.seen.mu.Lock()
	for id, ps := range e.seen.preempted {
		t.Errorf("a price under every maximum preempted %s: %v", id, ps[0].GetMessage())
	}
	e.seen.mu.Unlock()

	// A rise above capped's maximum, and only capped's.
	rise := list + 1_000_000
	e.setSpotPrice(node, rise, at.Add(time.Second))
	testkit.Eventually(t, 60*time.Second, func() error {
		got := down.of("capped")
		if len(got) == 0 {
			return errors.New("capped not stopped")
		}
		if r := got[0].GetExitReason(); r != shizuv1.ExitReason_EXIT_REASON_PREEMPTED || !strings.HasPrefix(got[0].GetMeta().GetSource(), "node-agent") {
			return fmt.Errorf("capped stopped with %v by %s", r, got[0].GetMeta().GetSource())
		}
		return nil
	})
	// Placed now: capped at the new price (fits), and capped between the
	// list price and the new price (must wait for the price).
	e.publish(requested("late", "spotty", spotCappedIn(rise, cur), time.Now()),
		requested("under", "spotty", spotCappedIn(list+800_000, cur), time.Now()))
	e.seen.waitFor(t, 30*time.Second, func(o *outcomes) error {
		if len(o.scheduled["late"]) == 0 {
			return errors.New("late not scheduled")
		}
		if len(o.pending["under"]) == 0 {
			return errors.New("under not pending")
		}
		return nil
	})
	// The same price again (a repeated change) leaves everything else.
	e.setSpotPrice(node, rise, at.Add(2*time.Second))

	e.seen.mu.Lock()
	defer e.seen.mu.Unlock()
	var notices []*shizuv1.RentalPreempted
	for _, p := range e.seen.preempted["capped"] {
		if !slices.ContainsFunc(notices, func(q *shizuv1.RentalPreempted) bool { return q.GetMeta().GetEventId() == p.GetMeta().GetEventId() }) {
			notices = append(notices, p)
		}
	}
	if len(notices) != 1 {
		t.Fatalf("capped: %d RentalPreempted (distinct event ids), want one", len(notices))
	}
	n := notices[0]
	if n.GetReason() != shizuv1.PreemptReason_PREEMPT_REASON_SPOT_PRICE_ABOVE_MAX || n.GetPreemptingRentalId() != "" ||
		n.GetNodeId() != "n1" || !n.GetNoticeDeadline().IsValid() || !strings.Contains(n.GetMessage(), "above the rental's maximum") {
		t.Errorf("notice %v", n)
	}
	if e.seen.stops["capped"] != 1 {
		t.Errorf("capped: %d stop commands, want one", e.seen.stops["capped"])
	}
	for _, id := range []string{"high", "uncapped", "late"} {
		if len(e.seen.preempted[id]) != 0 || e.seen.stops[id] != 0 || len(down.of(id)) != 0 {
			t.Errorf("%s was interrupted (%d notices, %d stops)", id, len(e.seen.preempted[id]), e.seen.stops[id])
		}
	}
	if s := e.seen.scheduled["under"]; len(s) != 0 {
		t.Errorf("a request capped under the spot price was placed on %s", s[0].GetNodeId())
	}
	if p := e.seen.pending["under"]; p[len(p)-1].GetReason() != shizuv1.PendingReason_PENDING_REASON_SPOT_PRICE_ABOVE_MAX {
		t.Errorf("under waits with %v", p[len(p)-1].GetReason())
	}
}
