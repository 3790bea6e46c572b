package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/failover/migrate"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Losing Redis. Failover's records (placements, moves in flight,
// quarantines) live in Redis, which as shipped keeps nothing on disk. A
// marker key (<prefix>:failover:records) is written last by each rebuild;
// a replica looks for it before it starts and then every tick. When it is
// missing the replica stops acting (no loss is acted on, no move handed
// over, its rental handlers redeliver) until the records are rebuilt from
// the RENTALS stream (migrate.Records): each rental's latest placement,
// so a node lost afterwards moves its rentals with their specs and
// attempts, and the moves handed to the scheduler and not completed, whose
// starts already on the stream are handed to the start handler (the
// RentalMigrated published, the old run of a make-before-break move told
// to stop). Quarantines are not rebuilt: a flapping node comes back into
// service early, which costs at most another loss. Moves recorded but not
// yet published are not on the stream: the sweep finds the rentals of a
// fenced node again (moveOrphans) once the capacity store holds them.

// errRecordsLost is what a rental handler returns while the records are
// being rebuilt: transient, so the delivery comes back.
var errRecordsLost = fmt.Errorf("failover records lost: waiting for their rebuild: %w", fault.ErrUnavailable)

func (r records) markerKey() string { return r.prefix + ":failover:records" }
func (r records) lockKey() string   { return r.prefix + ":failover:rebuilding" }

// ensureRecords returns once the records hold what the stream says: at
// once when the marker is there, else after this replica rebuilt them
// (holding the rebuild lock) or another one did. The replica does not act
// meanwhile (ready is false).
func (f *Failover) ensureRecords(ctx context.Context) error {
	rec := f.rec
	n, err := rec.rdb.Exists(ctx, rec.markerKey()).Result()
	if err != nil {
		f.ready.Store(false)
		return unavailable("read the records marker", err)
	}
	if n == 1 {
		f.ready.Store(true)
		return nil
	}
	f.ready.Store(false)
	f.d.Log.WarnContext(ctx, "failover records lost (their marker is missing): rebuilding them from the rental stream")
	var b [8]byte
	_, _ = rand.Read(b[:])
	owner := hex.EncodeToString(b[:])
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if n, err := rec.rdb.Exists(ctx, rec.markerKey()).Result(); err != nil || n == 1 {
			if err != nil {
				return unavailable("read the records marker", err)
			}
			f.ready.Store(true)
			return nil
		}
		locked, err := rec.rdb.SetNX(ctx, rec.lockKey(), owner, 10*time.Minute).Result()
		if err != nil {
			return unavailable("take the rebuild lock", err)
		}
		if locked {
			return f.rebuildRecords(ctx, owner)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// rebuildRecords rebuilds, marks the records whole, releases the lock and
// completes the moves whose next attempt already started.
func (f *Failover) rebuildRecords(ctx context.Context, owner string) error {
	rec := f.rec
	rebuilt, events, err := f.replayRentals(ctx)
	if err == nil {
		err = f.restoreRecords(ctx, rebuilt)
	}
	if err == nil {
		err = rec.rdb.Set(ctx, rec.markerKey(), f.d.Now().UTC().Format(time.RFC3339Nano), 0).Err()
	}
	if cur, _ := rec.rdb.Get(context.WithoutCancel(ctx), rec.lockKey()).Result(); cur == owner {
		rec.rdb.Del(context.WithoutCancel(ctx), rec.lockKey())
	}
	if err != nil {
		return unavailable("rebuild records", err)
	}
	f.ready.Store(true)
	f.d.Log.WarnContext(ctx, "failover records rebuilt from the rental stream", "events", events,
		"placements", len(rebuilt.Placements()), "moves", len(rebuilt.Moves()))
	for _, ev := range rebuilt.Completions() {
		if err := f.onStarted(ctx, ev, bus.Delivery{MsgID: ev.GetMeta().GetEventId()}); err != nil {
			// The marker says the records are whole; without the moves
			// left to complete they are not. Removed, the next check
			// rebuilds again (idempotent) and completes them then.
			f.ready.Store(false)
			if derr := rec.rdb.Del(context.WithoutCancel(ctx), rec.markerKey()).Err(); derr != nil {
				err = errors.Join(err, derr)
			}
			return unavailable("complete the moves after the rebuild", err)
		}
	}
	return nil
}

// replayRentals folds the RENTALS stream into migrate.Records.
func (f *Failover) replayRentals(ctx context.Context) (*migrate.Records, int, error) {
	out := migrate.NewRecords()
	n := 0
	_, err := bus.ScanStream(ctx, f.d.Bus.JetStream(), topology.StreamRentals, subject.RentalAll, func(msg *jetstream.RawStreamMsg) error {
		event, ok := bus.EventOn(msg.Subject)
		if !ok {
			return nil
		}
		n++
		switch event {
		case bus.EventName(&shizuv1.RentalScheduled{}):
			if ev := decoded[*shizuv1.RentalScheduled](msg); ev != nil {
				out.Scheduled(ev.GetRentalId(), placementOf(ev))
			}
		case bus.EventName(&shizuv1.RentalStarted{}):
			if ev := decoded[*shizuv1.RentalStarted](msg); ev != nil {
				out.Started(ev)
			}
		case bus.EventName(&shizuv1.RentalStopped{}):
			ev := &shizuv1.RentalStopped{}
			if proto.Unmarshal(msg.Data, ev) == nil {
				shizuv1.ClampStop(ev) // as onStoppedRaw: a clock-stepped stop is a stop
				if ev.Validate() == nil {
					out.Stopped(ev.GetRentalId(), ev.GetAttempt())
				}
			}
		case bus.EventName(&shizuv1.RentalMigrating{}):
			if ev := decoded[*shizuv1.RentalMigrating](msg); ev != nil {
				out.Migrating(ev)
			}
		case bus.EventName(&shizuv1.RentalMigrated{}):
			if ev := decoded[*shizuv1.RentalMigrated](msg); ev != nil {
				out.Migrated(ev.GetRentalId(), migratedAttempt(ev))
			}
		}
		return nil
	})
	return out, n, err
}

// migratedAttempt is the attempt a RentalMigrated completes, from its id
// ("rental:<rental>:migrated:<attempt>", rentalMigrated); one it cannot
// read completes whatever move is recorded.
func migratedAttempt(ev *shizuv1.RentalMigrated) int32 {
	id := ev.GetMeta().GetEventId()
	n, err := strconv.ParseInt(id[strings.LastIndex(id, ":")+1:], 10, 32)
	if err != nil {
		return math.MaxInt32
	}
	return int32(n)
}

// decoded is msg's event when it decodes and validates, else nil (the
// live consumer dead-letters it).
func decoded[E interface {
	proto.Message
	Validate() error
}](msg *jetstream.RawStreamMsg) E {
	var ev E
	ev = ev.ProtoReflect().Type().New().Interface().(E)
	if proto.Unmarshal(msg.Data, ev) != nil || ev.Validate() != nil {
		var zero E
		return zero
	}
	return ev
}

// placementOf is the placement a RentalScheduled records (onScheduled).
func placementOf(ev *shizuv1.RentalScheduled) migrate.Placement {
	return migrate.Placement{Attempt: ev.GetAttempt(), Tenant: ev.GetTenantId(), Node: ev.GetNodeId(), Spec: ev.GetSpec(),
		Model: ev.GetGpuModel(), VRAMMiB: gpuVRAM(ev.GetGpus())}
}

// restoreRecords writes the rebuilt records, keeping what a live handler
// wrote meanwhile: a placement only replaces an older attempt's, a move is
// written only where none is recorded.
func (f *Failover) restoreRecords(ctx context.Context, rebuilt *migrate.Records) error {
	for rental, p := range rebuilt.Placements() {
		if err := f.placements.Put(ctx, rental, p); err != nil {
			return err
		}
	}
	rec := f.rec
	for _, m := range rebuilt.Moves() {
		raw, err := json.Marshal(m)
		if err != nil {
			return fmt.Errorf("encode migration %s: %w", m.Rental, err)
		}
		set, err := rec.rdb.SetNX(ctx, rec.migrationKey(m.Rental), raw, 0).Result()
		if err != nil {
			return err
		}
		if set {
			if err := rec.rdb.SAdd(ctx, rec.migrationsKey(), m.Rental).Err(); err != nil {
				return err
			}
		}
	}
	return nil
}

// recordsIntact returns errRecordsLost (and stops the replica acting)
// when the marker is missing: what was just read of the records may come
// from a Redis that lost them. Callers look after their reads, so a read
// from an emptied Redis is never acted on (a rebuild in between rewrites
// the records before the marker).
func (f *Failover) recordsIntact(ctx context.Context) error {
	if f.rec.rdb == nil {
		return nil // records of a test's fakes, never lost
	}
	n, err := f.rec.rdb.Exists(ctx, f.rec.markerKey()).Result()
	if err != nil {
		return unavailable("read the records marker", err)
	}
	if n == 0 {
		f.ready.Store(false)
		return errRecordsLost
	}
	return nil
}

// watchRecords is the records' watch loop body: ensureRecords, logging a
// failure (the next tick tries again).
func (f *Failover) watchRecords(ctx context.Context, _ time.Time) {
	if err := f.ensureRecords(ctx); err != nil && ctx.Err() == nil {
		f.d.Log.ErrorContext(ctx, "failover records recovery failed; retrying", "err", err)
	}
}
