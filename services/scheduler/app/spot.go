package app

import (
	"context"
	"fmt"
	"maps"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/ports"
	"github.com/shizu-gpu/shizu/services/scheduler/round"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// The spot market, as the scheduler follows it. A SpotPriceChanged
// (MARKET, the scheduler-spot durable the replicas share) is recorded in
// the SpotMarket (newer wins), which every replica's loop reads each
// PendingRetry into its view, so placement compares a capped spot request
// with the market price. Then the replica looks for running capped spot
// rentals the price in force now puts above their maximum
// (round.PricesOut) and interrupts each through the preemption path: a
// claim record per victim (preemptor spotPricePreemptor: decided once,
// whichever replica gets there first), RentalPreempted with
// PREEMPT_REASON_SPOT_PRICE_ABOVE_MAX and the notice, then, once the
// notice passed, StopRental (EXIT_REASON_PREEMPTED) from stopVictims. The
// replicas look again when their loop reads a new price and every
// ReconcileInterval (a request placed by a replica that had not read the
// new price yet, a replica that died between record and notice).

// spotPricePreemptor is the preemptor of a rental interrupted because the
// spot price rose above its maximum: no rental takes its place.
const spotPricePreemptor = "spot-price"

// onSpotPrice records a price change and interrupts the rentals it prices
// out.
func (s *Scheduler) onSpotPrice(ctx context.Context, ev *shizuv1.SpotPriceChanged, _ bus.Delivery) error {
	if s.market == nil {
		return nil
	}
	p := ev.GetPricePerGpuHour()
	in, err := s.market.SetSpotPrice(ctx, ports.SpotPrice{Zone: ev.GetZone(), Model: ev.GetModel(),
		Price: placement.Price{Micros: p.GetMicros(), Currency: p.GetCurrency()}, EffectiveAt: ev.GetEffectiveAt().AsTime()})
	if err != nil {
		return err
	}
	s.d.Log.InfoContext(ctx, "spot price in force", "zone", in.Zone, "model", in.Model, "micros", in.Price.Micros,
		"currency", in.Price.Currency, "effective_at", in.EffectiveAt)
	_, err = s.interruptPricedOut(ctx, ev.GetMeta().GetEventId())
	return err
}

// pricesOf indexes spot prices by market.
func pricesOf(ps []ports.SpotPrice) map[round.SpotKey]placement.Price {
	out := make(map[round.SpotKey]placement.Price, len(ps))
	for _, p := range ps {
		out[round.SpotKey{Zone: p.Zone, Model: p.Model}] = p.Price
	}
	return out
}

// refreshSpotPrices reads the market into the view (on the loop). When a
// price changed, the pending set is tried again: a fall may let a capped
// rental in.
func (s *Scheduler) refreshSpotPrices(ctx context.Context) {
	if s.market == nil {
		return
	}
	ps, err := s.market.SpotPrices(ctx)
	if err != nil {
		s.d.Log.WarnContext(ctx, "read spot prices", "err", err)
		return
	}
	prices := pricesOf(ps)
	if maps.Equal(prices, s.prices) {
		return
	}
	s.prices = prices
	round.SetSpotPrices(s.view.Cluster().Nodes, prices)
	s.wake()
	s.interruptPricedOutSoon(ctx)
}

// spotSweeper runs interruptPricedOut passes one at a time.
type spotSweeper struct{ running atomic.Bool }

// interruptPricedOutSoon starts an interruptPricedOut pass off the loop
// unless one runs: a replica that reads a new price looks again, for a
// rental it placed under the old one meanwhile.
func (s *Scheduler) interruptPricedOutSoon(ctx context.Context) {
	if !s.sweeping.running.CompareAndSwap(false, true) {
		return
	}
	s.publishers.Go(func() {
		defer s.sweeping.running.Store(false)
		if n, err := s.interruptPricedOut(ctx, ""); err != nil {
			s.d.Log.WarnContext(ctx, "interrupt spot rentals priced out", "err", err)
		} else if n > 0 {
			s.d.Log.InfoContext(ctx, "interrupted spot rentals priced above their maximum", "count", n)
		}
	})
}

// interruptPricedOut announces the interruption of every running capped
// spot rental whose node's spot price is above its maximum, and returns
// how many it newly interrupted. It reads the store, not the view (it runs off the
// loop). A victim preempted for another rental is left to that
// preemption; one already interrupted for the price is announced again
// with its recorded notice (the same event id: the stream keeps one)
// until its stop is sent, so a notice lost to a crash after the claim is
// still given.
func (s *Scheduler) interruptPricedOut(ctx context.Context, cause string) (int, error) {
	if s.market == nil || s.d.Store == nil {
		return 0, nil
	}
	nodes, held, err := s.pricedNodes(ctx)
	if err != nil {
		return 0, err
	}
	return s.interrupt(ctx, round.PricesOut(nodes), held, cause)
}

// interrupt claims and announces the rentals priced out; held are the
// preemption records by victim.
func (s *Scheduler) interrupt(ctx context.Context, out []round.PricedOut, held map[string]ports.Preemption, cause string) (int, error) {
	now := s.d.Now()
	b := s.pub.NewBatch()
	interrupted := 0
	for _, v := range out {
		p, ok := held[v.Rental.RentalID]
		if ok && (p.StopSent || p.Preemptor != spotPricePreemptor) {
			continue
		}
		if !ok {
			p = ports.Preemption{Victim: v.Rental.RentalID, Tenant: v.Rental.Tenant, Preemptor: spotPricePreemptor,
				NodeID: v.NodeID, NodeEpoch: v.NodeEpoch, Notice: now.Add(s.cfg.PreemptionNotice)}
			taken, err := s.rec.ClaimPreemption(ctx, []ports.Preemption{p})
			if err != nil {
				return interrupted, err
			}
			if len(taken) > 0 {
				continue // preempted for another rental meanwhile
			}
			s.d.Log.InfoContext(ctx, "spot price rose above a running rental's maximum", "rental", p.Victim, "node", p.NodeID,
				"price_micros", v.Price.Micros, "max_micros", v.Rental.MaxSpotPrice.Micros, "currency", v.Price.Currency)
			s.metrics.preempted(ctx)
			interrupted++
		}
		if err := s.queuePriceNotice(ctx, b, v, p, cause, now); err != nil {
			return interrupted, err
		}
	}
	if err := b.Wait(ctx); err != nil {
		return interrupted, err
	}
	return interrupted, nil
}

// pricedNodes reads the store as the view would (classes with their caps,
// the market's prices), hiding the victims of preemptions for other
// rentals, and the preemption records by victim.
func (s *Scheduler) pricedNodes(ctx context.Context) ([]placement.Node, map[string]ports.Preemption, error) {
	snap, err := s.d.Store.Snapshot(ctx)
	if err != nil {
		return nil, nil, err
	}
	var ids []string
	for i := range snap.Nodes {
		for _, a := range snap.Nodes[i].Allocations {
			ids = append(ids, a.RentalID)
		}
	}
	classes, err := s.rec.Classes(ctx, ids)
	if err != nil {
		return nil, nil, err
	}
	prices, err := s.market.SpotPrices(ctx)
	if err != nil {
		return nil, nil, err
	}
	ps, err := s.rec.Preemptions(ctx)
	if err != nil {
		return nil, nil, err
	}
	held := make(map[string]ports.Preemption, len(ps))
	others := map[string]bool{}
	for _, p := range ps {
		held[p.Victim] = p
		if p.Preemptor != spotPricePreemptor {
			others[p.Victim] = true
		}
	}
	nodes := make([]placement.Node, len(snap.Nodes))
	for i := range snap.Nodes {
		nodes[i] = nodeOf(&snap.Nodes[i], classes)
	}
	round.SetSpotPrices(nodes, pricesOf(prices))
	hideIn(nodes, others)
	return nodes, held, nil
}

// queuePriceNotice queues the RentalPreempted of a rental priced out.
func (s *Scheduler) queuePriceNotice(ctx context.Context, b ports.Batch, v round.PricedOut, p ports.Preemption, cause string, now time.Time) error {
	attempt, err := s.rec.CurrentAttempt(ctx, p.Victim)
	if err != nil {
		return err
	}
	if err := s.publish(ctx, b, subject.RentalPreempted, []string{p.Tenant}, &shizuv1.RentalPreempted{
		Meta:     shizuv1.NewMeta(fmt.Sprintf("rental:%s:preempted:%s:%d", p.Victim, spotPricePreemptor, attempt), s.source, cause, p.Victim, now),
		RentalId: p.Victim, TenantId: p.Tenant, NodeId: p.NodeID, NodeEpoch: int64(p.NodeEpoch),
		NoticeDeadline: timestamppb.New(p.Notice),
		Reason:         shizuv1.PreemptReason_PREEMPT_REASON_SPOT_PRICE_ABOVE_MAX,
		Message:        v.Message(),
	}); err != nil {
		return err
	}
	return nil
}
