package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/services/metering/pricing"
	"github.com/shizu-gpu/shizu/services/metering/redisstore"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Meter is the running metering: it merges rental and spot events into
// segment state, closes usage records (at every interval boundary for
// running rentals, at once when a rental stops), publishes them, and folds
// the published records into the Redis aggregates.
type Meter struct {
	cat      *pricing.Catalogue
	rules    ledger.Rules
	grace    time.Duration
	accounts Accounts
	store    *redisstore.Store
	conn     *bus.Conn
	log      *slog.Logger
	now      func() time.Time
	source   string
	opts     bus.ConsumeOptions
	metrics  *metrics
}

// Deps are what a Meter runs on.
type Deps struct {
	Store *redisstore.Store
	Conn  *bus.Conn
	Log   *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Meter receives metering's metrics (default none).
	Meter metric.MeterProvider
}

// NewMeter builds a Meter from a validated configuration.
func NewMeter(cfg Config, d Deps) (*Meter, error) {
	cat, accounts, err := cfg.load()
	if err != nil {
		return nil, err
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Log == nil {
		d.Log = slog.Default()
	}
	ms, err := newMetrics(d.Meter)
	if err != nil {
		return nil, err
	}
	return &Meter{metrics: ms, cat: cat, rules: cfg.Rules, grace: cfg.CloseGrace, accounts: accounts, store: d.Store, conn: d.Conn,
		log: d.Log, now: d.Now, source: topology.Metering,
		opts: bus.ConsumeOptions{Concurrency: cfg.Concurrency, FastAck: cfg.FastAck}}, nil
}

// Start starts the consumers and the closer; the returned parts stop them
// in reverse order.
func (m *Meter) Start(ctx context.Context, consumers []bus.Consumer, tick time.Duration) ([]Part, error) {
	var parts []Part
	for _, c := range consumers {
		r := bus.NewRouter()
		switch c.Stream {
		case topology.StreamRentals:
			bus.On(r, m.onScheduled)
			bus.On(r, m.onStarted)
			bus.On(r, m.onStopped)
			bus.On(r, m.onMigrating)
			bus.On(r, func(context.Context, *shizuv1.RentalMigrated, bus.Delivery) error { return nil })
			bus.On(r, func(context.Context, *shizuv1.RentalPreempted, bus.Delivery) error { return nil })
		case topology.StreamMarket:
			bus.On(r, m.onSpotPrice)
		case topology.StreamBilling:
			bus.On(r, m.onUsage)
		default:
			continue
		}
		sub, err := m.conn.Consume(ctx, c, r, m.opts)
		if err != nil {
			stopAll(ctx, parts)
			return nil, err
		}
		parts = append(parts, subscriptionPart{sub})
	}
	if tick > 0 {
		parts = append(parts, m.startCloser(ctx, tick))
	}
	return parts, nil
}

// Part is something Start started.
type Part interface {
	Stop(ctx context.Context) error
}

type subscriptionPart struct{ *bus.Subscription }

func (s subscriptionPart) Stop(ctx context.Context) error { return s.Drain(ctx) }

func stopAll(ctx context.Context, parts []Part) {
	for i := len(parts) - 1; i >= 0; i-- {
		_ = parts[i].Stop(ctx)
	}
}

func (m *Meter) onScheduled(ctx context.Context, ev *shizuv1.RentalScheduled, _ bus.Delivery) error {
	spec := ev.GetSpec()
	if _, err := m.cat.Type(ev.GetGpuModel()); err != nil {
		return fault.Invalid("rental %s: %v", ev.GetRentalId(), err)
	}
	milli, err := m.cat.BillableMilli(ev.GetGpuModel(), spec.GetMigProfile(), spec.GetMilliGpu())
	if err != nil {
		return fault.Invalid("rental %s: %v", ev.GetRentalId(), err)
	}
	st := ledger.SegmentState{RentalID: ev.GetRentalId(), Attempt: ev.GetAttempt(), Scheduled: true,
		TenantID: ev.GetTenantId(), NodeID: ev.GetNodeId(), Plan: spec.GetPlan(), Model: ev.GetGpuModel(),
		Zone: ev.GetZone(), GPUCount: spec.GetGpuCount(), MilliGPU: milli, Labels: spec.GetLabels()}
	if mx := spec.GetMaxSpotPricePerGpuHour(); mx != nil {
		if mx.GetCurrency() != m.cat.Currency {
			return fault.Invalid("rental %s: max spot price in %s, the catalogue prices in %s", ev.GetRentalId(), mx.GetCurrency(), m.cat.Currency)
		}
		p := pricing.FromProto(mx)
		st.MaxSpot = &p
	}
	merged, err := m.store.Scheduled(ctx, st)
	if err != nil {
		return err
	}
	return m.closeState(ctx, merged)
}

func (m *Meter) onStarted(ctx context.Context, ev *shizuv1.RentalStarted, _ bus.Delivery) error {
	ref := redisstore.SegmentRef{RentalID: ev.GetRentalId(), Attempt: ev.GetAttempt()}
	at := ev.GetStartedAt().AsTime()
	// The closer first looks at it when its first interval can close.
	st, err := m.store.Started(ctx, ref, ev.GetNodeId(), at, nextBoundary(at, m.rules.Interval).Add(m.grace))
	if err != nil {
		return err
	}
	return m.closeState(ctx, st)
}

func (m *Meter) onStopped(ctx context.Context, ev *shizuv1.RentalStopped, _ bus.Delivery) error {
	ref := redisstore.SegmentRef{RentalID: ev.GetRentalId(), Attempt: ev.GetAttempt()}
	start, stop := ev.GetStartedAt().AsTime(), ev.GetStoppedAt().AsTime()
	if stop.Before(start) {
		return fault.Invalid("rental %s attempt %d: negative duration: stopped at %s before it started at %s",
			ref.RentalID, ref.Attempt, stop.Format(time.RFC3339Nano), start.Format(time.RFC3339Nano))
	}
	st, err := m.store.Stopped(ctx, ref, start, stop, ev.GetExitReason())
	if err != nil {
		return err
	}
	return m.closeState(ctx, st)
}

func (m *Meter) onMigrating(ctx context.Context, ev *shizuv1.RentalMigrating, d bus.Delivery) error {
	last := ev.GetMeta().GetOccurredAt().AsTime()
	if hb := ev.GetLastHeartbeatAt(); hb != nil {
		last = hb.AsTime()
	}
	if err := m.store.Lost(ctx, ev.GetRentalId(), max(ev.GetFromAttempt(), 1), last); err != nil {
		return err
	}
	attempts, err := m.store.Attempts(ctx, ev.GetRentalId())
	if err != nil {
		return err
	}
	for _, a := range attempts {
		if err := m.closeSegment(ctx, redisstore.SegmentRef{RentalID: ev.GetRentalId(), Attempt: a}); err != nil {
			return err
		}
	}
	return nil
}

func (m *Meter) onSpotPrice(ctx context.Context, ev *shizuv1.SpotPriceChanged, _ bus.Delivery) error {
	if _, err := m.cat.Type(ev.GetModel()); err != nil {
		return fault.Invalid("spot price: %v", err)
	}
	p := pricing.FromProto(ev.GetPricePerGpuHour())
	if p.Currency != m.cat.Currency {
		return fault.Invalid("spot price of %s in %s is in %s, the catalogue prices in %s", ev.GetModel(), ev.GetZone(), p.Currency, m.cat.Currency)
	}
	if p.Micros < 0 || p.Micros > pricing.MaxPriceMicros {
		return fault.Invalid("spot price %d micros is outside 0..%d", p.Micros, int64(pricing.MaxPriceMicros))
	}
	return m.store.SpotPrice(ctx, ev.GetZone(), ev.GetModel(), ledger.PricePoint{At: ev.GetEffectiveAt().AsTime(), Price: p})
}

func (m *Meter) onUsage(ctx context.Context, ev *shizuv1.UsageRecorded, _ bus.Delivery) error {
	applied, err := m.store.Apply(ctx, "", ev)
	if err != nil {
		return err
	}
	if !applied.New {
		m.metrics.duplicates.Add(ctx, 1)
		return nil
	}
	m.metrics.applied.Add(ctx, 1)
	budget, ok := m.accounts.budget(ev.GetTenantId())
	if !ok || budget.Currency != ev.GetAmount().GetCurrency() {
		return nil
	}
	month := ev.GetIntervalStart().AsTime().UTC().Format("2006-01")
	for _, t := range budget.Crossed(applied.MonthBefore, applied.MonthAfter) {
		first, err := m.store.Alert(ctx, ev.GetTenantId(), month, t)
		if err != nil {
			return err
		}
		if first {
			m.metrics.budget.Add(ctx, 1)
			m.log.WarnContext(ctx, "budget threshold crossed", "tenant", ev.GetTenantId(), "month", month,
				"threshold_micros", t, "spend_micros", applied.MonthAfter, "currency", budget.Currency)
		}
	}
	return nil
}

// tariff is what seg is priced at.
func (m *Meter) tariff(ctx context.Context, seg ledger.Segment) (ledger.Tariff, error) {
	list, err := m.cat.OnDemand(seg.Model)
	if err != nil {
		return ledger.Tariff{}, fault.Invalid("rental %s: %v", seg.RentalID, err)
	}
	t := ledger.Tariff{Base: list}
	switch seg.Plan {
	case shizuv1.Plan_PLAN_RESERVED:
		if c, ok := m.accounts.commitment(seg.TenantID, seg.Model, seg.Start); ok {
			rate, err := c.Rate(m.cat)
			if err != nil {
				return ledger.Tariff{}, err
			}
			t.Base = rate
		}
	case shizuv1.Plan_PLAN_SPOT:
		var until time.Time
		if seg.Ended() {
			until = seg.End
		}
		if t.Spot, err = m.store.SpotPrices(ctx, seg.Zone, seg.Model, until); err != nil {
			return ledger.Tariff{}, err
		}
	}
	return t, nil
}

// closeSegment publishes every record of a segment that is closed now and
// advances its cursor. Two replicas closing the same segment publish the
// same records under the same ids, which the stream and the aggregates
// deduplicate.
func (m *Meter) closeSegment(ctx context.Context, ref redisstore.SegmentRef) error {
	st, err := m.store.Segment(ctx, ref)
	if err != nil {
		return err
	}
	return m.closeState(ctx, st)
}

// closeState is closeSegment for a state just loaded.
func (m *Meter) closeState(ctx context.Context, st ledger.SegmentState) error {
	ref := redisstore.SegmentRef{RentalID: st.RentalID, Attempt: st.Attempt}
	seg, ok := st.Segment()
	if !ok || st.Done || st.Finished() {
		return nil
	}
	tariff, err := m.tariff(ctx, seg)
	if err != nil {
		return err
	}
	until := m.now().Add(-m.grace)
	if seg.Ended() && until.Before(seg.End) {
		until = seg.End
	}
	recs, cursor, err := ledger.Close(seg, tariff, m.rules, st.Cursor, until)
	if err != nil {
		return fault.Invalid("rental %s attempt %d: %v", ref.RentalID, ref.Attempt, err)
	}
	if len(recs) > 0 {
		batch := m.conn.NewBatch()
		for _, r := range recs {
			subj, err := subject.Format(subject.UsageRecorded, r.TenantID)
			if err != nil {
				return fault.Invalid("rental %s: %v", ref.RentalID, err)
			}
			if err := batch.Publish(ctx, subj, r.Proto(m.source)); err != nil {
				return err
			}
		}
		if _, err := batch.Wait(ctx); err != nil {
			return fmt.Errorf("publish usage of %s: %w", ref.RentalID, err)
		}
		for _, r := range recs {
			m.metrics.published(ctx, r.Plan.String(), r.Amount.Currency, r.Amount.Micros)
		}
	}
	if len(recs) == 0 && cursor.Equal(st.Cursor) && !seg.Ended() {
		return nil // nothing closed yet; the start already made it due
	}
	st.Cursor = cursor
	finished := st.Finished()
	due := cursor
	if due.Before(seg.Start) {
		due = seg.Start
	}
	due = nextBoundary(due, m.rules.Interval).Add(m.grace)
	return m.store.Advance(ctx, ref, cursor, due, finished)
}

// nextBoundary is the first multiple of interval since the Unix epoch after t.
func nextBoundary(t time.Time, interval time.Duration) time.Time {
	step := int64(interval / time.Second)
	return time.Unix((t.Unix()/step+1)*step, 0).UTC()
}

// CloseDue closes every segment whose next interval boundary has passed
// (up to 10,000 a call, Concurrency at a time), and returns how many it
// looked at.
func (m *Meter) CloseDue(ctx context.Context) (int, error) {
	refs, err := m.store.Due(ctx, m.now(), 10_000)
	if err != nil {
		return 0, err
	}
	m.metrics.due.Add(ctx, int64(len(refs)))
	work := make(chan redisstore.SegmentRef)
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	for range min(max(m.opts.Concurrency, 1), len(refs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ref := range work {
				err := m.closeSegment(ctx, ref)
				if err == nil {
					continue
				}
				if fault.IsInvalid(err) {
					m.log.ErrorContext(ctx, "segment cannot be billed", "rental", ref.RentalID, "attempt", ref.Attempt, "err", err)
					continue
				}
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	for _, ref := range refs {
		work <- ref
	}
	close(work)
	wg.Wait()
	return len(refs), errors.Join(errs...)
}

type closer struct {
	cancel context.CancelFunc
	done   sync.WaitGroup
}

func (c *closer) Stop(ctx context.Context) error {
	c.cancel()
	ch := make(chan struct{})
	go func() { c.done.Wait(); close(ch) }()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (m *Meter) startCloser(ctx context.Context, tick time.Duration) *closer {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c := &closer{cancel: cancel}
	c.done.Add(1)
	go func() {
		defer c.done.Done()
		t := time.NewTicker(tick)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if _, err := m.CloseDue(ctx); err != nil && ctx.Err() == nil {
					m.log.WarnContext(ctx, "closing due usage failed", "err", err)
				}
			}
		}
	}()
	return c
}

// Accounts are the tenants' commitments and budgets.
type Accounts struct {
	Commitments []ledger.Commitment `json:"commitments"`
	Budgets     []ledger.Budget     `json:"budgets"`
}

func (a Accounts) budget(tenant string) (ledger.Budget, bool) {
	for _, b := range a.Budgets {
		if b.TenantID == tenant {
			return b, true
		}
	}
	return ledger.Budget{}, false
}

// commitment is the tenant's earliest-started commitment for model in force
// at t.
func (a Accounts) commitment(tenant, model string, t time.Time) (ledger.Commitment, bool) {
	var found []ledger.Commitment
	for _, c := range a.Commitments {
		if c.TenantID == tenant && c.Model == model && !t.Before(c.Start) && t.Before(c.End()) {
			found = append(found, c)
		}
	}
	if len(found) == 0 {
		return ledger.Commitment{}, false
	}
	sort.Slice(found, func(i, j int) bool { return found[i].Start.Before(found[j].Start) })
	return found[0], true
}
