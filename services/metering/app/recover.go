package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/services/metering/redisstore"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/service"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Recovery keeps metering's store whole across a Redis loss (a restart
// that comes back empty): it looks for the store's marker
// (redisstore.Store.Ready) before the meter starts, then every tick and
// whenever a guarded write was refused (Watch),
// and when the marker is missing it pauses the meter's consumers, rebuilds
// the store from the streams (RebuildStore) under the rebuild lock, so one
// replica rebuilds while the others wait for the marker, writes the marker
// last, and resumes the consumers. Until then the guarded store refuses
// every billing write (redisstore.ErrLost), so nothing is billed from a
// half-empty store.
type Recovery struct {
	m     *Meter
	store *redisstore.Store // unguarded: the rebuild writes through it
	owner string
	// lockTTL bounds how long a crashed rebuilder holds the lock.
	lockTTL time.Duration
	// poll is how often a waiting replica looks for the marker.
	poll time.Duration
}

// NewRecovery recovers m's store; store is the unguarded store the meter's
// guarded one was made from.
func NewRecovery(m *Meter, store *redisstore.Store) *Recovery {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &Recovery{m: m, store: store, owner: hex.EncodeToString(b[:]), lockTTL: 10 * time.Minute, poll: 200 * time.Millisecond}
}

// Ensure returns once the store holds what the streams say: at once when
// its marker is there, else after this replica rebuilt it (true) or
// another one did.
func (r *Recovery) Ensure(ctx context.Context) (bool, error) {
	ready, err := r.store.Ready(ctx)
	if err != nil {
		return false, err
	}
	if ready {
		// Consumers a rebuild paused and could not start again (or that
		// another replica's rebuild left paused) are started now: the
		// marker alone would never bring them back.
		if r.m.subs != nil {
			if err := r.m.subs.resume(); err != nil {
				return false, fmt.Errorf("resume consumers: %w", err)
			}
		}
		return false, nil
	}
	r.m.log.WarnContext(ctx, "metering store lost (its marker is missing): pausing and rebuilding from the streams")
	if r.m.subs != nil {
		if err := r.m.subs.pause(ctx); err != nil {
			r.m.log.WarnContext(ctx, "pausing the consumers for the rebuild", "err", err)
		}
	}
	rebuilt, err := r.rebuildOrWait(ctx)
	if err != nil {
		return false, err
	}
	if r.m.subs != nil {
		if err := r.m.subs.resume(); err != nil {
			return rebuilt, fmt.Errorf("resume consumers after the rebuild: %w", err)
		}
	}
	return rebuilt, nil
}

func (r *Recovery) rebuildOrWait(ctx context.Context) (bool, error) {
	t := time.NewTicker(r.poll)
	defer t.Stop()
	for {
		if ready, err := r.store.Ready(ctx); err != nil || ready {
			return false, err
		}
		locked, err := r.store.LockRebuild(ctx, r.owner, r.lockTTL)
		if err != nil {
			return false, err
		}
		if locked {
			res, err := r.rebuild(ctx)
			if uerr := r.store.UnlockRebuild(context.WithoutCancel(ctx), r.owner); uerr != nil && err == nil {
				err = uerr
			}
			if err != nil {
				return false, err
			}
			r.m.metrics.rebuilds.Add(ctx, 1)
			r.m.log.WarnContext(ctx, "metering store rebuilt from the streams", "rental_events", res.RentalEvents,
				"segments", res.Segments, "usage_records", res.UsageRecords, "spot_prices", res.SpotPrices,
				"alerts", res.Alerts, "aggregates_applied", res.Aggregates.Applied)
			return true, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-t.C:
		}
	}
}

func (r *Recovery) rebuild(ctx context.Context) (StoreRebuild, error) {
	res, err := RebuildStore(ctx, r.m, r.store)
	if err != nil {
		return res, err
	}
	return res, r.store.MarkReady(ctx, r.m.now())
}

// check is the recovery loop's body: Ensure, logging a failure (the next
// tick tries again).
func (r *Recovery) check(ctx context.Context) {
	if _, err := r.Ensure(ctx); err != nil && ctx.Err() == nil {
		r.m.log.WarnContext(ctx, "metering store recovery failed; retrying", "err", err)
	}
}

// Watch starts the recovery's watch for a later loss: Ensure every tick,
// and at once when a guarded write was refused (Meter.noteLost). The
// returned part stops it.
func (r *Recovery) Watch(ctx context.Context, tick time.Duration) service.Part {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(tick)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case <-r.m.lost:
			}
			r.check(ctx)
		}
	}()
	return service.PartFunc(func(stopCtx context.Context) error {
		cancel()
		select {
		case <-done:
			return nil
		case <-stopCtx.Done():
			return stopCtx.Err()
		}
	})
}

// noteLost wakes the recovery when err is a guarded write refused for a
// missing marker: the store was lost since the last look.
func (m *Meter) noteLost(err error) {
	if redisstore.IsLost(err) {
		select {
		case m.lost <- struct{}{}:
		default:
		}
	}
}

// StoreRebuild says what RebuildStore replayed.
type StoreRebuild struct {
	// RentalEvents, SpotPrices, UsageRecords and Alerts count the
	// messages replayed from RENTALS, MARKET and BILLING.
	RentalEvents, SpotPrices, UsageRecords, Alerts int
	// Segments counts the placements restored.
	Segments int
	// Aggregates is the aggregates' Rebuild.
	Aggregates RebuildResult
}

// RebuildStore rebuilds everything metering keeps in store from the
// streams, through the code the live consumers run: the spot history from
// MARKET (HandleSpotPrice's checks), every placement's segment, due entry
// and losses from RENTALS (the consumer's decoding, folded by
// ledger.Replay with ledger.Merge), the cursors and budget alerts from
// what BILLING already holds (ledger.CursorOf: billing resumes after the
// last record published, so no record is published twice and none is
// skipped), then the aggregates (Rebuild). It writes through an
// unguarded store and leaves the marker to the caller.
func RebuildStore(ctx context.Context, m *Meter, store *redisstore.Store) (StoreRebuild, error) {
	var res StoreRebuild
	js := m.conn.JetStream()
	_, err := bus.ScanStream(ctx, js, topology.StreamMarket, subject.SpotPriceChangedAll, func(msg *jetstream.RawStreamMsg) error {
		var ev shizuv1.SpotPriceChanged
		if proto.Unmarshal(msg.Data, &ev) != nil || ev.Validate() != nil {
			return nil // dead-lettered by the live consumer
		}
		zone, model, p, err := m.spotPoint(&ev)
		if err != nil {
			return nil
		}
		res.SpotPrices++
		return store.SpotPrice(ctx, zone, model, p)
	})
	if err != nil {
		return res, err
	}
	replay := ledger.NewReplay()
	if res.RentalEvents, err = m.replayRentals(ctx, replay); err != nil {
		return res, err
	}
	if err := scanBilling(ctx, js, store, replay, &res); err != nil {
		return res, err
	}
	segs := replay.Segments(m.rules, m.grace)
	res.Segments = len(segs)
	if err := store.Restore(ctx, segs, replay.Losses()); err != nil {
		return res, err
	}
	res.Aggregates, err = Rebuild(ctx, m.conn, store)
	return res, err
}

// replayRentals folds the lifecycle events of RENTALS that the metering
// durable consumes into replay, in stream order, decoded as HandleRentals
// decodes them (events it dead-letters are skipped here too).
func (m *Meter) replayRentals(ctx context.Context, replay *ledger.Replay) (int, error) {
	svc, _ := topology.ServiceNamed(topology.Metering)
	var filters []string
	for _, c := range svc.Consumers {
		if c.Stream == topology.StreamRentals {
			filters = append(filters, c.FilterSubjects...)
		}
	}
	n := 0
	_, err := bus.ScanStream(ctx, m.conn.JetStream(), topology.StreamRentals, subject.RentalAll, func(msg *jetstream.RawStreamMsg) error {
		if !matchesAny(filters, msg.Subject) {
			return nil
		}
		d, ok := replayed(msg)
		if !ok {
			return nil
		}
		n++
		b := m.sortRentals([]bus.Delivery{d})
		for j, ev := range b.events {
			if b.out[b.merged[j]] == nil {
				replay.Merge(ev)
			}
		}
		for _, mig := range b.lost {
			last := mig.GetMeta().GetOccurredAt().AsTime()
			if hb := mig.GetLastHeartbeatAt(); hb != nil {
				last = hb.AsTime()
			}
			replay.Lost(mig.GetRentalId(), mig.GetFromNodeId(), mig.GetFromAttempt(), last)
		}
		return nil
	})
	return n, err
}

// replayed is a stored message as the consumer would have been handed it
// (bus.EventOn: the event its subject carries); false when the consumer
// would have dead-lettered it unread.
func replayed(msg *jetstream.RawStreamMsg) (bus.Delivery, bool) {
	d := bus.Delivery{Subject: msg.Subject, Event: msg.Header.Get(bus.HeaderEvent), MsgID: msg.Header.Get(bus.HeaderMsgID),
		Header: msg.Header, Data: msg.Data, Delivered: 1, StreamSeq: msg.Sequence}
	want, declared := bus.EventOn(msg.Subject)
	switch {
	case declared && d.Event != "" && d.Event != want:
		return d, false
	case declared:
		d.Event = want
	case d.Event == "":
		return d, false
	}
	return d, true
}

// scanBilling notes every usage record on BILLING in replay (the
// cursors) and restores the budget thresholds alerted.
func scanBilling(ctx context.Context, js jetstream.JetStream, store *redisstore.Store, replay *ledger.Replay, res *StoreRebuild) error {
	_, err := bus.ScanStream(ctx, js, topology.StreamBilling, subject.UsageAll, func(msg *jetstream.RawStreamMsg) error {
		switch {
		case subject.Matches(subject.UsageRecordedAll, msg.Subject):
			var ev shizuv1.UsageRecorded
			if proto.Unmarshal(msg.Data, &ev) != nil || ev.Validate() != nil {
				return nil
			}
			res.UsageRecords++
			replay.Billed(ledger.BilledRecord{RentalID: ev.GetRentalId(), NodeID: ev.GetNodeId(),
				Start: ev.GetIntervalStart().AsTime(), End: ev.GetIntervalEnd().AsTime()})
		case subject.Matches(subject.UsageBudgetCrossedAll, msg.Subject):
			var ev shizuv1.BudgetThresholdCrossed
			if proto.Unmarshal(msg.Data, &ev) != nil || ev.Validate() != nil {
				return nil
			}
			res.Alerts++
			month := ledger.Month(ev.GetPeriodStart().AsTime())
			if _, err := store.Alert(ctx, ev.GetTenantId(), month, ev.GetThreshold().GetMicros()); err != nil {
				return err
			}
		}
		return nil
	})
	return err
}

func matchesAny(filters []string, subj string) bool {
	for _, f := range filters {
		if subject.Matches(f, subj) {
			return true
		}
	}
	return false
}
