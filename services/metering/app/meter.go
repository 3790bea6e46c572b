package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"
	"google.golang.org/protobuf/proto"

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
	accounts ledger.Accounts
	store    *redisstore.Store
	conn     *bus.Conn
	log      *slog.Logger
	now      func() time.Time
	source   string
	opts     bus.ConsumeOptions
	batch    int
	metrics  *metrics
	// consumed bounds how far running rentals are billed: no later than
	// every rental and spot price event stored has been handled.
	consumed watermark
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
		opts: bus.ConsumeOptions{Concurrency: cfg.Concurrency, FastAck: cfg.FastAck}, batch: cfg.Batch}, nil
}

// Start starts the consumers and the closer; the returned parts stop them
// in reverse order. Rental events and usage records are handled in batches
// (see onRentals and onUsage); spot prices one by one.
func (m *Meter) Start(ctx context.Context, consumers []bus.Consumer, tick time.Duration) ([]Part, error) {
	// The watermark follows the durables whose events end or reprice a
	// running rental; set before any handler runs.
	for _, c := range consumers {
		if c.Stream == topology.StreamRentals || c.Stream == topology.StreamMarket {
			m.consumed.of = append(m.consumed.of, newConsumedTime(m.conn.JetStream(), c))
		}
	}
	var parts []Part
	batch := bus.BatchOptions{MaxBatch: m.batch, Concurrency: m.opts.Concurrency, FastAck: m.opts.FastAck}
	for _, c := range consumers {
		var sub *bus.Subscription
		var err error
		switch c.Stream {
		case topology.StreamRentals:
			sub, err = m.conn.ConsumeBatch(ctx, c, m.onRentals, batch)
		case topology.StreamMarket:
			r := bus.NewRouter()
			bus.On(r, m.onSpotPrice)
			sub, err = m.conn.Consume(ctx, c, r, m.opts)
		case topology.StreamBilling:
			sub, err = m.conn.ConsumeBatch(ctx, c, m.onUsage, batch)
		default:
			continue
		}
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

// Event names the rental consumer handles.
var (
	eventScheduled = bus.EventName(&shizuv1.RentalScheduled{})
	eventStarted   = bus.EventName(&shizuv1.RentalStarted{})
	eventStopped   = bus.EventName(&shizuv1.RentalStopped{})
	eventMigrating = bus.EventName(&shizuv1.RentalMigrating{})
	eventMigrated  = bus.EventName(&shizuv1.RentalMigrated{})
	eventPreempted = bus.EventName(&shizuv1.RentalPreempted{})
	eventUsage     = bus.EventName(&shizuv1.UsageRecorded{})
)

// decode decodes and validates a delivery; what fails is invalid input.
func decode(d bus.Delivery, ev proto.Message) error {
	if err := proto.Unmarshal(d.Data, ev); err != nil {
		return fault.Invalid("decode %s: %v", d.Event, err)
	}
	if v, ok := ev.(bus.Validator); ok {
		if err := v.Validate(); err != nil {
			return fault.Invalid("validate %s: %v", d.Event, err)
		}
	}
	return nil
}

// onRentals handles a batch of rental events: it merges every
// scheduled/started/stopped event into its segment (one script call for
// the batch), closes the segments that have records to close (all records
// in one async publish batch, all cursors in one script call), then
// handles failover reports one by one. Every step is
// idempotent (merges set the same fields, record ids are deterministic,
// cursors only move forward), so a batch redelivered in part or in whole
// after a crash changes nothing more.
func (m *Meter) onRentals(ctx context.Context, ds []bus.Delivery) []error {
	out := make([]error, len(ds))
	events := make([]redisstore.SegmentEvent, 0, len(ds))
	merged := make([]int, 0, len(ds)) // delivery of each event
	var migrating []int
	var lost []*shizuv1.RentalMigrating
	for i, d := range ds {
		var ev redisstore.SegmentEvent
		var err error
		switch d.Event {
		case eventScheduled:
			ev, err = m.scheduled(d)
		case eventStarted:
			ev, err = m.started(d)
		case eventStopped:
			ev, err = m.stopped(d)
		case eventMigrating:
			var mig shizuv1.RentalMigrating
			if out[i] = decode(d, &mig); out[i] == nil {
				migrating, lost = append(migrating, i), append(lost, &mig)
			}
			continue
		case eventMigrated:
			out[i] = decode(d, &shizuv1.RentalMigrated{})
			continue
		case eventPreempted:
			out[i] = decode(d, &shizuv1.RentalPreempted{})
			continue
		default:
			continue // an event this consumer does not know: acknowledged
		}
		if err != nil {
			out[i] = err
			continue
		}
		events = append(events, ev)
		merged = append(merged, i)
	}
	if len(events) > 0 {
		states, err := m.store.MergeSegments(ctx, events)
		segErr := map[redisstore.SegmentRef]error{}
		if err == nil {
			for i, e := range m.closeStates(ctx, states) {
				if e != nil {
					segErr[redisstore.SegmentRef{RentalID: states[i].RentalID, Attempt: states[i].Attempt}] = e
				}
			}
		}
		for j, i := range merged {
			if err != nil {
				out[i] = err
			} else {
				out[i] = segErr[events[j].Ref]
			}
		}
	}
	for j, i := range migrating {
		out[i] = m.onMigrating(ctx, lost[j])
	}
	return out
}

func (m *Meter) scheduled(d bus.Delivery) (redisstore.SegmentEvent, error) {
	var ev shizuv1.RentalScheduled
	if err := decode(d, &ev); err != nil {
		return redisstore.SegmentEvent{}, err
	}
	spec := ev.GetSpec()
	if _, err := m.cat.Type(ev.GetGpuModel()); err != nil {
		return redisstore.SegmentEvent{}, fault.Invalid("rental %s: %v", ev.GetRentalId(), err)
	}
	milli, err := m.cat.BillableMilli(ev.GetGpuModel(), spec.GetMigProfile(), spec.GetMilliGpu())
	if err != nil {
		return redisstore.SegmentEvent{}, fault.Invalid("rental %s: %v", ev.GetRentalId(), err)
	}
	st := ledger.SegmentState{RentalID: ev.GetRentalId(), Attempt: ev.GetAttempt(), Scheduled: true,
		TenantID: ev.GetTenantId(), NodeID: ev.GetNodeId(), Plan: spec.GetPlan(), Model: ev.GetGpuModel(),
		Zone: ev.GetZone(), GPUCount: spec.GetGpuCount(), MilliGPU: milli, Labels: spec.GetLabels()}
	if mx := spec.GetMaxSpotPricePerGpuHour(); mx != nil {
		if mx.GetCurrency() != m.cat.Currency {
			return redisstore.SegmentEvent{}, fault.Invalid("rental %s: max spot price in %s, the catalogue prices in %s", ev.GetRentalId(), mx.GetCurrency(), m.cat.Currency)
		}
		p := pricing.FromProto(mx)
		st.MaxSpot = &p
	}
	return redisstore.ScheduledEvent(st)
}

func (m *Meter) started(d bus.Delivery) (redisstore.SegmentEvent, error) {
	var ev shizuv1.RentalStarted
	if err := decode(d, &ev); err != nil {
		return redisstore.SegmentEvent{}, err
	}
	ref := redisstore.SegmentRef{RentalID: ev.GetRentalId(), Attempt: ev.GetAttempt()}
	at := ev.GetStartedAt().AsTime()
	// The closer first looks at it when its first interval can close.
	return redisstore.StartedEvent(ref, ev.GetNodeId(), at, ledger.NextBoundary(at, m.rules.Interval).Add(m.grace)), nil
}

func (m *Meter) stopped(d bus.Delivery) (redisstore.SegmentEvent, error) {
	var ev shizuv1.RentalStopped
	if err := decode(d, &ev); err != nil {
		return redisstore.SegmentEvent{}, err
	}
	ref := redisstore.SegmentRef{RentalID: ev.GetRentalId(), Attempt: ev.GetAttempt()}
	start, stop := ev.GetStartedAt().AsTime(), ev.GetStoppedAt().AsTime()
	if stop.Before(start) {
		return redisstore.SegmentEvent{}, fault.Invalid("rental %s attempt %d: negative duration: stopped at %s before it started at %s",
			ref.RentalID, ref.Attempt, stop.Format(time.RFC3339Nano), start.Format(time.RFC3339Nano))
	}
	return redisstore.StoppedEvent(ref, start, stop, ev.GetExitReason()), nil
}

func (m *Meter) onMigrating(ctx context.Context, ev *shizuv1.RentalMigrating) error {
	last := ev.GetMeta().GetOccurredAt().AsTime()
	if hb := ev.GetLastHeartbeatAt(); hb != nil {
		last = hb.AsTime()
	}
	attempts, err := m.store.Attempts(ctx, ev.GetRentalId())
	if err != nil {
		return err
	}
	refs := make([]redisstore.SegmentRef, len(attempts))
	for i, a := range attempts {
		refs[i] = redisstore.SegmentRef{RentalID: ev.GetRentalId(), Attempt: a}
	}
	attempt := ev.GetFromAttempt()
	if attempt == 0 {
		if attempt, err = m.lostAttempt(ctx, refs, ev.GetFromNodeId()); err != nil {
			return err
		}
	}
	if err := m.store.Lost(ctx, ev.GetRentalId(), attempt, last); err != nil {
		return err
	}
	return errors.Join(m.closeSegments(ctx, refs)...)
}

// lostAttempt is the placement a failover report that did not know the
// attempt was about: the latest one on the lost node that has not ended
// (else the latest one on that node). When no placement on that node is
// known yet (the report came before the rental's other events), it is the
// first, as before placements were looked up by node.
func (m *Meter) lostAttempt(ctx context.Context, refs []redisstore.SegmentRef, node string) (int32, error) {
	evs := make([]redisstore.SegmentEvent, len(refs))
	for i, r := range refs {
		evs[i] = redisstore.SegmentEvent{Ref: r}
	}
	states, err := m.store.MergeSegments(ctx, evs)
	if err != nil {
		return 0, err
	}
	var onNode, running int32
	for _, st := range states {
		if st.NodeID != node {
			continue
		}
		onNode = max(onNode, st.Attempt)
		if st.StoppedAt.IsZero() && st.LostAt.IsZero() {
			running = max(running, st.Attempt)
		}
	}
	switch {
	case running > 0:
		return running, nil
	case onNode > 0:
		return onNode, nil
	}
	return 1, nil
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

// onUsage folds a batch of usage records into the aggregates (one script
// call for the batch, each record once per record id) and then checks the
// budgets of the tenants they belong to.
func (m *Meter) onUsage(ctx context.Context, ds []bus.Delivery) []error {
	out := make([]error, len(ds))
	recs := make([]*shizuv1.UsageRecorded, 0, len(ds))
	idx := make([]int, 0, len(ds))
	for i, d := range ds {
		if d.Event != eventUsage {
			continue
		}
		ev := &shizuv1.UsageRecorded{}
		if out[i] = decode(d, ev); out[i] == nil {
			recs, idx = append(recs, ev), append(idx, i)
		}
	}
	applied, err := m.store.ApplyAll(ctx, "", recs)
	if err != nil {
		for _, i := range idx {
			out[i] = err
		}
		return out
	}
	var fresh int64
	type period struct{ tenant, month string }
	spends := map[period]int64{}
	recordsOf := map[period][]int{}
	for j, a := range applied {
		if a.New {
			fresh++
		}
		ev := recs[j]
		if b, ok := m.accounts.Budget(ev.GetTenantId()); !ok || b.Currency != ev.GetAmount().GetCurrency() {
			continue
		}
		k := period{ev.GetTenantId(), ev.GetIntervalStart().AsTime().UTC().Format("2006-01")}
		spends[k] = max(spends[k], a.MonthAfter)
		recordsOf[k] = append(recordsOf[k], idx[j])
	}
	m.metrics.applied.Add(ctx, fresh)
	m.metrics.duplicates.Add(ctx, int64(len(applied))-fresh)
	for k, spent := range spends {
		budget, _ := m.accounts.Budget(k.tenant)
		if err := m.alertBudget(ctx, budget, k.month, spent); err != nil {
			for _, i := range recordsOf[k] {
				out[i] = err
			}
		}
	}
	return out
}

// alertBudget publishes a BudgetThresholdCrossed for every threshold of
// budget that the tenant's spend in month has reached and that has not
// been alerted yet, then marks them alerted. It looks at the spend, not at
// the record that moved it, so a crossing whose alert failed is alerted on
// the redelivery. The event id is deterministic
// (budget:<tenant>:<budget>:<month>:<threshold micros>): two replicas, or a
// crash between publishing and marking, publish it again under the same
// id, which the stream stores once.
func (m *Meter) alertBudget(ctx context.Context, budget ledger.Budget, month string, spent int64) error {
	if len(budget.Reached(spent)) == 0 {
		return nil
	}
	done, err := m.store.Alerts(ctx, budget.TenantID, month)
	if err != nil {
		return err
	}
	todo := ledger.DueAlerts(budget, spent, done)
	if len(todo) == 0 {
		return nil
	}
	start, err := time.Parse("2006-01", month)
	if err != nil {
		return err
	}
	subj, err := subject.Format(subject.UsageBudgetCrossed, budget.TenantID)
	if err != nil {
		return fault.Invalid("budget of %s: %v", budget.TenantID, err)
	}
	batch := m.conn.NewBatch()
	for _, t := range todo {
		if err := batch.Publish(ctx, subj, ledger.BudgetCrossed(budget, t, start, spent, m.now(), m.source)); err != nil {
			return err
		}
	}
	if _, err := batch.Wait(ctx); err != nil {
		return fmt.Errorf("publish budget crossing of %s: %w", budget.TenantID, err)
	}
	for _, t := range todo {
		first, err := m.store.Alert(ctx, budget.TenantID, month, t.Micros)
		if err != nil {
			return err
		}
		if first {
			m.metrics.budget.Add(ctx, 1)
			m.log.WarnContext(ctx, "budget threshold crossed", "tenant", budget.TenantID, "budget", budget.Name(), "month", month,
				"threshold_micros", t.Micros, "threshold_percent", t.Percent, "spend_micros", spent, "currency", budget.Currency)
		}
	}
	return nil
}

// tariff is what seg is priced at (the spot history read up to its end).
func (m *Meter) tariff(ctx context.Context, seg ledger.Segment) (ledger.Tariff, error) {
	var spot []ledger.PricePoint
	if ledger.NeedsSpotHistory(seg) {
		var until time.Time
		if seg.Ended() {
			until = seg.End
		}
		var err error
		if spot, err = m.store.SpotPrices(ctx, seg.Zone, seg.Model, until); err != nil {
			return ledger.Tariff{}, err
		}
	}
	return ledger.TariffOf(m.cat, m.accounts, seg, spot)
}

// closeSegments loads segments and closes them (closeStates), returning
// one error per ref.
func (m *Meter) closeSegments(ctx context.Context, refs []redisstore.SegmentRef) []error {
	evs := make([]redisstore.SegmentEvent, len(refs))
	for i, r := range refs {
		evs[i] = redisstore.SegmentEvent{Ref: r}
	}
	errs := make([]error, len(refs))
	states, err := m.store.MergeSegments(ctx, evs)
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	byRef := map[redisstore.SegmentRef]error{}
	for i, e := range m.closeStates(ctx, states) {
		byRef[redisstore.SegmentRef{RentalID: states[i].RentalID, Attempt: states[i].Attempt}] = e
	}
	for i, r := range refs {
		errs[i] = byRef[r]
	}
	return errs
}

// closeStates publishes every record of the segments that is closed now
// (all in one async publish batch) and then advances their cursors (one
// script call); it returns one error per state. Two replicas closing the
// same segment publish the same records under the same ids, which the
// stream and the aggregates deduplicate; a cursor only moves forward and
// only after its records are stored.
func (m *Meter) closeStates(ctx context.Context, states []ledger.SegmentState) []error {
	errs := make([]error, len(states))
	batch := m.conn.NewBatch()
	var published []ledger.Record
	var withRecords []int
	advances := make([]redisstore.Advance, 0, len(states))
	advanced := make([]int, 0, len(states))
	until := m.cutoff().Add(-m.grace)
	for i, st := range states {
		recs, adv, ok, err := m.plan(ctx, st, until)
		if err != nil {
			errs[i] = err
			continue
		}
		for _, r := range recs {
			subj, err := subject.Format(subject.UsageRecorded, r.TenantID)
			if err == nil {
				err = batch.Publish(ctx, subj, r.Proto(m.source))
			}
			if err != nil {
				errs[i] = fault.Invalid("rental %s: %v", st.RentalID, err)
				break
			}
		}
		if errs[i] != nil {
			continue
		}
		if len(recs) > 0 {
			published = append(published, recs...)
			withRecords = append(withRecords, i)
		}
		if ok {
			advances, advanced = append(advances, adv), append(advanced, i)
		}
	}
	if batch.Len() > 0 {
		if _, err := batch.Wait(ctx); err != nil {
			// Which publish failed is not known: none of the segments with
			// records advances, and their events are redelivered.
			err = fmt.Errorf("publish usage: %w", err)
			for _, i := range withRecords {
				errs[i] = err
			}
			kept := advances[:0]
			keptIdx := advanced[:0]
			for j, a := range advances {
				if errs[advanced[j]] == nil {
					kept, keptIdx = append(kept, a), append(keptIdx, advanced[j])
				}
			}
			advances, advanced = kept, keptIdx
			published = nil
		}
		for _, r := range published {
			m.metrics.published(ctx, r.Plan.String(), r.Amount.Currency, r.Amount.Micros)
		}
	}
	if err := m.store.AdvanceAll(ctx, advances); err != nil {
		for _, i := range advanced {
			errs[i] = err
		}
	}
	return errs
}

// cutoff is the latest time the meter may bill a running rental up to, plus
// the close grace: its clock, held back to the watermark while rental or
// spot price events stored earlier are still to be handled (a backlog
// after a restart, a burst, a slow replica), so that a stop or a price
// change already on the bus is never billed past.
func (m *Meter) cutoff() time.Time {
	now := m.now()
	if !m.consumed.bounded() {
		return now
	}
	if w := m.consumed.time(); w.Before(now) {
		return w
	}
	return now
}

// plan is what closing a segment now takes: its records and the advance of
// its cursor (ok false when the cursor stays). A running segment is billed
// up to until; an ended one (stopped, or lost in a failover) to its end.
func (m *Meter) plan(ctx context.Context, st ledger.SegmentState, until time.Time) (recs []ledger.Record, adv redisstore.Advance, ok bool, err error) {
	ref := redisstore.SegmentRef{RentalID: st.RentalID, Attempt: st.Attempt}
	seg, known := st.Segment()
	if st.Done || (known && st.Finished()) {
		// Finished: nothing to bill, but it may still be on the due list
		// (a member left there before finished segments were kept off it).
		return nil, redisstore.Advance{Ref: ref, Cursor: st.Cursor, Finished: true}, true, nil
	}
	if !known {
		return nil, adv, false, nil // stays due until its other events arrive
	}
	tariff, err := m.tariff(ctx, seg)
	if err != nil {
		return nil, adv, false, err
	}
	if seg.Ended() && until.Before(seg.End) {
		until = seg.End
	}
	recs, cursor, err := ledger.Close(seg, tariff, m.rules, st.Cursor, until)
	if err != nil {
		return nil, adv, false, fault.Invalid("rental %s attempt %d: %v", ref.RentalID, ref.Attempt, err)
	}
	if len(recs) == 0 && cursor.Equal(st.Cursor) && !seg.Ended() {
		return nil, adv, false, nil // nothing closed yet; the start already made it due
	}
	st.Cursor = cursor
	due := cursor
	if due.Before(seg.Start) {
		due = seg.Start
	}
	due = ledger.NextBoundary(due, m.rules.Interval).Add(m.grace)
	return recs, redisstore.Advance{Ref: ref, Cursor: cursor, Due: due, Finished: st.Finished()}, true, nil
}

// CloseDue reads the watermark, then closes every segment whose next
// interval boundary has passed it and the clock, less the grace (up to
// 10,000 a call, in batches of the consumers' batch size), and returns how
// many it looked at. When the watermark cannot be read it closes up to the
// last one read, and says why.
func (m *Meter) CloseDue(ctx context.Context) (int, error) {
	var errs []error
	if m.consumed.bounded() {
		if err := m.consumed.refresh(ctx); err != nil {
			errs = append(errs, err)
		}
		if at := m.consumed.time(); !at.IsZero() {
			m.metrics.lag.Record(ctx, max(m.now().Sub(at), 0).Seconds())
		}
	}
	refs, err := m.store.Due(ctx, m.cutoff(), 10_000)
	if err != nil {
		return 0, errors.Join(append(errs, err)...)
	}
	m.metrics.due.Add(ctx, int64(len(refs)))
	for chunk := range slices.Chunk(refs, max(m.batch, 1)) {
		for i, err := range m.closeSegments(ctx, chunk) {
			switch {
			case err == nil:
			case fault.IsInvalid(err):
				m.log.ErrorContext(ctx, "segment cannot be billed", "rental", chunk[i].RentalID, "attempt", chunk[i].Attempt, "err", err)
			default:
				errs = append(errs, err)
			}
		}
	}
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
