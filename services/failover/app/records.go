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
	return decodePlacement(rental, vals)
}

func decodePlacement(rental string, vals map[string]string) (placement, bool, error) {
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

// placementsOf reads the latest placement of each rental in one pipelined
// round trip; rentals failover never saw scheduled are missing.
func (r records) placementsOf(ctx context.Context, rentals []string) (map[string]placement, error) {
	cmds := make([]*redis.MapStringStringCmd, len(rentals))
	if _, err := r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range rentals {
			cmds[i] = p.HGetAll(ctx, r.rentalKey(id))
		}
		return nil
	}); err != nil {
		return nil, unavailable("read placements", err)
	}
	out := make(map[string]placement, len(rentals))
	for i, id := range rentals {
		p, ok, err := decodePlacement(id, cmds[i].Val())
		if err != nil {
			return nil, err
		}
		if ok {
			out[id] = p
		}
	}
	return out, nil
}

// migrationsOf reads the migration in flight of each rental in one
// pipelined round trip; rentals without one are missing.
func (r records) migrationsOf(ctx context.Context, rentals []string) (map[string]migration, error) {
	cmds := make([]*redis.StringCmd, len(rentals))
	if _, err := r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range rentals {
			cmds[i] = p.Get(ctx, r.migrationKey(id))
		}
		return nil
	}); err != nil && !errors.Is(err, redis.Nil) {
		return nil, unavailable("read migrations", err)
	}
	out := make(map[string]migration, len(rentals))
	for i, id := range rentals {
		raw, err := cmds[i].Bytes()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			return nil, unavailable("read migration", err)
		}
		var m migration
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, fmt.Errorf("failover records: migration of %s: %w", id, err)
		}
		out[id] = m
	}
	return out, nil
}

// putMigrations stores moves in one MULTI/EXEC.
func (r records) putMigrations(ctx context.Context, ms []migration) error {
	if len(ms) == 0 {
		return nil
	}
	raws := make([][]byte, len(ms))
	for i, m := range ms {
		raw, err := json.Marshal(m)
		if err != nil {
			return fmt.Errorf("encode migration %s: %w", m.Rental, err)
		}
		raws[i] = raw
	}
	pipe := r.rdb.TxPipeline()
	ids := make([]any, len(ms))
	for i, m := range ms {
		pipe.Set(ctx, r.migrationKey(m.Rental), raws[i], 0)
		ids[i] = m.Rental
	}
	pipe.SAdd(ctx, r.migrationsKey(), ids...)
	if _, err := pipe.Exec(ctx); err != nil {
		return unavailable("store migrations", err)
	}
	return nil
}

// updateMigrations rewrites moves that are still recorded (SET XX), in one
// pipelined round trip: a RentalStarted of the new attempt may have
// completed a move (and dropped its record) meanwhile, and must not see
// it come back.
func (r records) updateMigrations(ctx context.Context, ms []migration) error {
	if len(ms) == 0 {
		return nil
	}
	raws := make([][]byte, len(ms))
	for i, m := range ms {
		raw, err := json.Marshal(m)
		if err != nil {
			return fmt.Errorf("encode migration %s: %w", m.Rental, err)
		}
		raws[i] = raw
	}
	if _, err := r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, m := range ms {
			p.SetXX(ctx, r.migrationKey(m.Rental), raws[i], 0)
		}
		return nil
	}); err != nil && !errors.Is(err, redis.Nil) {
		return unavailable("update migrations", err)
	}
	return nil
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
	// Failed says why the move can never be handed over (invalid input);
	// the sweep leaves it alone and the rental stays on its old node.
	Failed   string `json:"failed,omitempty"`
	Class    int    `json:"class"`
	Priority int    `json:"priority"`
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
