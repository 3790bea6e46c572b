package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/fault"
)

// records is failover's own state in Redis, beside the capacity store:
//
//	<prefix>:failover:rental:<rental>     hash    attempt, tenant, node, spec (protobuf) of
//	                                              the rental's latest placement (from RentalScheduled)
//	<prefix>:failover:migration:<rental>  string  JSON migration in flight (until RentalMigrated)
//	<prefix>:failover:migrations          set     rentals with a migration in flight
//	<prefix>:failover:quarantine          hash    node -> JSON quarantine
//
// Placements are written by a script that keeps the highest attempt, so a
// redelivered old RentalScheduled never overwrites a newer one.
type records struct {
	rdb    redis.UniversalClient
	prefix string
}

func (r records) rentalKey(id string) string    { return r.prefix + ":failover:rental:" + id }
func (r records) migrationKey(id string) string { return r.prefix + ":failover:migration:" + id }
func (r records) migrationsKey() string         { return r.prefix + ":failover:migrations" }
func (r records) quarantineKey() string         { return r.prefix + ":failover:quarantine" }

func unavailable(op string, err error) error {
	return fmt.Errorf("failover records: %s: %w: %v", op, fault.ErrUnavailable, err)
}

// placement is what failover knows of a rental's latest placement.
type placement struct {
	Attempt int32
	Tenant  string
	Node    string
	Spec    *shizuv1.RentalSpec
}

var putPlacementScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], 'attempt')
if cur and tonumber(cur) > tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'attempt', ARGV[1], 'tenant', ARGV[2], 'node', ARGV[3], 'spec', ARGV[4])
return 1`)

var forgetPlacementScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], 'attempt')
if cur and tonumber(cur) == tonumber(ARGV[1]) then redis.call('DEL', KEYS[1]) return 1 end
return 0`)

func (r records) putPlacement(ctx context.Context, rental string, p placement) error {
	spec, err := proto.Marshal(p.Spec)
	if err != nil {
		return fault.Invalid("encode spec of %s: %v", rental, err)
	}
	if err := putPlacementScript.Run(ctx, r.rdb, []string{r.rentalKey(rental)}, p.Attempt, p.Tenant, p.Node, spec).Err(); err != nil {
		return unavailable("store placement", err)
	}
	return nil
}

// forgetPlacement drops the record if it is still the given attempt.
func (r records) forgetPlacement(ctx context.Context, rental string, attempt int32) error {
	if err := forgetPlacementScript.Run(ctx, r.rdb, []string{r.rentalKey(rental)}, attempt).Err(); err != nil {
		return unavailable("forget placement", err)
	}
	return nil
}

// placementOf returns the rental's latest placement; ok is false when
// failover never saw it scheduled.
func (r records) placementOf(ctx context.Context, rental string) (placement, bool, error) {
	vals, err := r.rdb.HGetAll(ctx, r.rentalKey(rental)).Result()
	if err != nil {
		return placement{}, false, unavailable("read placement", err)
	}
	if len(vals) == 0 {
		return placement{}, false, nil
	}
	a, err := strconv.ParseInt(vals["attempt"], 10, 32)
	if err != nil {
		return placement{}, false, fmt.Errorf("failover records: placement of %s: bad attempt %q", rental, vals["attempt"])
	}
	spec := &shizuv1.RentalSpec{}
	if err := proto.Unmarshal([]byte(vals["spec"]), spec); err != nil {
		return placement{}, false, fmt.Errorf("failover records: placement of %s: %w", rental, err)
	}
	return placement{Attempt: int32(a), Tenant: vals["tenant"], Node: vals["node"], Spec: spec}, true, nil
}

// Migration modes.
const (
	// modeBreak: the old run is gone (or stopped first); the allocation is
	// released before the scheduler hears of the move.
	modeBreak = "break"
	// modeMakeBeforeBreak: the old run goes on until the replacement
	// started; the scheduler releases the old allocation as it places.
	modeMakeBeforeBreak = "make-before-break"
)

// migration is a move in flight, from the decision to RentalMigrated.
type migration struct {
	Rental      string    `json:"rental"`
	Tenant      string    `json:"tenant"`
	FromNode    string    `json:"from_node"`
	FromEpoch   uint64    `json:"from_epoch"`
	FromAttempt int32     `json:"from_attempt"`
	NextAttempt int32     `json:"next_attempt"`
	GPUs        []int     `json:"gpus,omitempty"`
	Reason      int32     `json:"reason"` // shizuv1.MigrationReason
	Mode        string    `json:"mode"`
	StopOld     bool      `json:"stop_old,omitempty"` // tell the old node's agent to stop the run
	LastAlive   time.Time `json:"last_alive,omitzero"`
	LastBeat    time.Time `json:"last_beat,omitzero"`
	DecidedAt   time.Time `json:"decided_at"`
	Cause       string    `json:"cause"` // event id that caused it
	Published   bool      `json:"published,omitempty"`
	Scheduled   bool      `json:"scheduled,omitempty"` // fence-to-scheduled measured
	Class       int       `json:"class"`
	Priority    int       `json:"priority"`
}

func (r records) putMigration(ctx context.Context, m migration) error {
	raw, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode migration %s: %w", m.Rental, err)
	}
	pipe := r.rdb.TxPipeline()
	pipe.Set(ctx, r.migrationKey(m.Rental), raw, 0)
	pipe.SAdd(ctx, r.migrationsKey(), m.Rental)
	if _, err := pipe.Exec(ctx); err != nil {
		return unavailable("store migration", err)
	}
	return nil
}

func (r records) migrationOf(ctx context.Context, rental string) (migration, bool, error) {
	raw, err := r.rdb.Get(ctx, r.migrationKey(rental)).Bytes()
	if errors.Is(err, redis.Nil) {
		return migration{}, false, nil
	}
	if err != nil {
		return migration{}, false, unavailable("read migration", err)
	}
	var m migration
	if err := json.Unmarshal(raw, &m); err != nil {
		return migration{}, false, fmt.Errorf("failover records: migration of %s: %w", rental, err)
	}
	return m, true, nil
}

func (r records) dropMigration(ctx context.Context, rental string) error {
	pipe := r.rdb.TxPipeline()
	pipe.Del(ctx, r.migrationKey(rental))
	pipe.SRem(ctx, r.migrationsKey(), rental)
	if _, err := pipe.Exec(ctx); err != nil {
		return unavailable("drop migration", err)
	}
	return nil
}

// migrations lists the rentals with a migration in flight.
func (r records) migrations(ctx context.Context) ([]string, error) {
	ids, err := r.rdb.SMembers(ctx, r.migrationsKey()).Result()
	if err != nil {
		return nil, unavailable("list migrations", err)
	}
	return ids, nil
}

// quarantine is a node failover took out of service for flapping.
type quarantine struct {
	Epoch uint64    `json:"epoch"`
	Until time.Time `json:"until"`
}

func (r records) putQuarantine(ctx context.Context, node string, q quarantine) error {
	raw, err := json.Marshal(q)
	if err != nil {
		return err
	}
	if err := r.rdb.HSet(ctx, r.quarantineKey(), node, raw).Err(); err != nil {
		return unavailable("store quarantine", err)
	}
	return nil
}

func (r records) quarantines(ctx context.Context) (map[string]quarantine, error) {
	all, err := r.rdb.HGetAll(ctx, r.quarantineKey()).Result()
	if err != nil {
		return nil, unavailable("read quarantines", err)
	}
	out := map[string]quarantine{}
	for node, raw := range all {
		var q quarantine
		if json.Unmarshal([]byte(raw), &q) == nil {
			out[node] = q
		}
	}
	return out, nil
}

func (r records) dropQuarantine(ctx context.Context, node string) error {
	if err := r.rdb.HDel(ctx, r.quarantineKey(), node).Err(); err != nil {
		return unavailable("drop quarantine", err)
	}
	return nil
}
