package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/failover/detect"
	"github.com/shizu-gpu/shizu/services/failover/migrate"
	"github.com/shizu-gpu/shizu/shared/fault"
)

// What failover needs of its records, one interface per kind (each has a
// contract suite in failovertest that the Redis records below and the
// fakes there pass).
type (
	// placementRecords hold each rental's latest placement.
	placementRecords interface {
		// Put stores p unless a newer attempt is stored already.
		Put(ctx context.Context, rental string, p migrate.Placement) error
		// Forget drops the record if it is still the given attempt.
		Forget(ctx context.Context, rental string, attempt int32) error
		// Get returns the latest placement; ok is false when failover never
		// saw the rental scheduled.
		Get(ctx context.Context, rental string) (p migrate.Placement, ok bool, err error)
		// GetMany reads many at once; rentals never seen scheduled are missing.
		GetMany(ctx context.Context, rentals []string) (map[string]migrate.Placement, error)
	}
	// moveRecords hold the moves in flight.
	moveRecords interface {
		Put(ctx context.Context, m migrate.Record) error
		// PutMany stores moves atomically.
		PutMany(ctx context.Context, ms []migrate.Record) error
		// UpdateMany rewrites the moves that are still recorded: a move
		// completed (dropped) meanwhile must not come back.
		UpdateMany(ctx context.Context, ms []migrate.Record) error
		Get(ctx context.Context, rental string) (m migrate.Record, ok bool, err error)
		// GetMany reads many at once; rentals without a move are missing.
		GetMany(ctx context.Context, rentals []string) (map[string]migrate.Record, error)
		// List lists the rentals with a move recorded.
		List(ctx context.Context) ([]string, error)
		Drop(ctx context.Context, rental string) error
	}
	// quarantineRecords hold the nodes failover took out of service for
	// flapping (Node, Epoch and Until are kept).
	quarantineRecords interface {
		Put(ctx context.Context, q detect.Quarantine) error
		// List returns every quarantine, by node.
		List(ctx context.Context) ([]detect.Quarantine, error)
		Drop(ctx context.Context, node string) error
	}
)

// records is failover's own state in Redis, beside the capacity store:
//
//	<prefix>:failover:rental:<rental>     hash    attempt, tenant, node, spec (protobuf) of
//	                                              the rental's latest placement (from RentalScheduled)
//	<prefix>:failover:migration:<rental>  string  JSON migrate.Record in flight (until RentalMigrated)
//	<prefix>:failover:migrations          set     rentals with a migration in flight
//	<prefix>:failover:quarantine          hash    node -> JSON {epoch, until}
//
// Placements are written by a script that keeps the highest attempt, so a
// redelivered old RentalScheduled never overwrites a newer one.
type records struct {
	rdb    redis.UniversalClient
	prefix string
}

// The Redis records of each kind.
type (
	redisPlacements  struct{ records }
	redisMoves       struct{ records }
	redisQuarantines struct{ records }
)

func (r records) rentalKey(id string) string    { return r.prefix + ":failover:rental:" + id }
func (r records) migrationKey(id string) string { return r.prefix + ":failover:migration:" + id }
func (r records) migrationsKey() string         { return r.prefix + ":failover:migrations" }
func (r records) quarantineKey() string         { return r.prefix + ":failover:quarantine" }

func unavailable(op string, err error) error {
	return fmt.Errorf("failover records: %s: %w: %w", op, fault.ErrUnavailable, err)
}

var putPlacementScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], 'attempt')
if cur and tonumber(cur) > tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'attempt', ARGV[1], 'tenant', ARGV[2], 'node', ARGV[3], 'spec', ARGV[4], 'model', ARGV[5], 'vram_mib', ARGV[6])
return 1`)

var forgetPlacementScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], 'attempt')
if cur and tonumber(cur) == tonumber(ARGV[1]) then redis.call('DEL', KEYS[1]) return 1 end
return 0`)

func (r redisPlacements) Put(ctx context.Context, rental string, p migrate.Placement) error {
	spec, err := proto.Marshal(p.Spec)
	if err != nil {
		return fault.Invalid("encode spec of %s: %w", rental, err)
	}
	if err := putPlacementScript.Run(ctx, r.rdb, []string{r.rentalKey(rental)}, p.Attempt, p.Tenant, p.Node, spec,
		p.Model, p.VRAMMiB).Err(); err != nil {
		return unavailable("store placement", err)
	}
	return nil
}

func (r redisPlacements) Forget(ctx context.Context, rental string, attempt int32) error {
	if err := forgetPlacementScript.Run(ctx, r.rdb, []string{r.rentalKey(rental)}, attempt).Err(); err != nil {
		return unavailable("forget placement", err)
	}
	return nil
}

func (r redisPlacements) Get(ctx context.Context, rental string) (migrate.Placement, bool, error) {
	vals, err := r.rdb.HGetAll(ctx, r.rentalKey(rental)).Result()
	if err != nil {
		return migrate.Placement{}, false, unavailable("read placement", err)
	}
	return decodePlacement(rental, vals)
}

func decodePlacement(rental string, vals map[string]string) (migrate.Placement, bool, error) {
	if len(vals) == 0 {
		return migrate.Placement{}, false, nil
	}
	a, err := strconv.ParseInt(vals["attempt"], 10, 32)
	if err != nil {
		return migrate.Placement{}, false, fmt.Errorf("failover records: placement of %s: bad attempt %q", rental, vals["attempt"])
	}
	spec := &shizuv1.RentalSpec{}
	if err := proto.Unmarshal([]byte(vals["spec"]), spec); err != nil {
		return migrate.Placement{}, false, fmt.Errorf("failover records: placement of %s: %w", rental, err)
	}
	// model and vram_mib are absent from records written before they were
	// kept: no memory floor then.
	vram, _ := strconv.ParseInt(vals["vram_mib"], 10, 64)
	return migrate.Placement{Attempt: int32(a), Tenant: vals["tenant"], Node: vals["node"], Spec: spec,
		Model: vals["model"], VRAMMiB: vram}, true, nil
}

// GetMany takes one pipelined round trip.
func (r redisPlacements) GetMany(ctx context.Context, rentals []string) (map[string]migrate.Placement, error) {
	cmds := make([]*redis.MapStringStringCmd, len(rentals))
	if _, err := r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range rentals {
			cmds[i] = p.HGetAll(ctx, r.rentalKey(id))
		}
		return nil
	}); err != nil {
		return nil, unavailable("read placements", err)
	}
	out := make(map[string]migrate.Placement, len(rentals))
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

// GetMany takes one pipelined round trip.
func (r redisMoves) GetMany(ctx context.Context, rentals []string) (map[string]migrate.Record, error) {
	cmds := make([]*redis.StringCmd, len(rentals))
	if _, err := r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range rentals {
			cmds[i] = p.Get(ctx, r.migrationKey(id))
		}
		return nil
	}); err != nil && !errors.Is(err, redis.Nil) {
		return nil, unavailable("read migrations", err)
	}
	out := make(map[string]migrate.Record, len(rentals))
	for i, id := range rentals {
		raw, err := cmds[i].Bytes()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			return nil, unavailable("read migration", err)
		}
		var m migrate.Record
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, fmt.Errorf("failover records: migration of %s: %w", id, err)
		}
		out[id] = m
	}
	return out, nil
}

func encodeMoves(ms []migrate.Record) ([][]byte, error) {
	raws := make([][]byte, len(ms))
	for i, m := range ms {
		raw, err := json.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("encode migration %s: %w", m.Rental, err)
		}
		raws[i] = raw
	}
	return raws, nil
}

// PutMany takes one MULTI/EXEC.
func (r redisMoves) PutMany(ctx context.Context, ms []migrate.Record) error {
	if len(ms) == 0 {
		return nil
	}
	raws, err := encodeMoves(ms)
	if err != nil {
		return err
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

// UpdateMany rewrites with SET XX, in one pipelined round trip: a
// RentalStarted of the new attempt may have completed a move (and dropped
// its record) meanwhile.
func (r redisMoves) UpdateMany(ctx context.Context, ms []migrate.Record) error {
	if len(ms) == 0 {
		return nil
	}
	raws, err := encodeMoves(ms)
	if err != nil {
		return err
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

func (r redisMoves) Put(ctx context.Context, m migrate.Record) error {
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

func (r redisMoves) Get(ctx context.Context, rental string) (migrate.Record, bool, error) {
	raw, err := r.rdb.Get(ctx, r.migrationKey(rental)).Bytes()
	if errors.Is(err, redis.Nil) {
		return migrate.Record{}, false, nil
	}
	if err != nil {
		return migrate.Record{}, false, unavailable("read migration", err)
	}
	var m migrate.Record
	if err := json.Unmarshal(raw, &m); err != nil {
		return migrate.Record{}, false, fmt.Errorf("failover records: migration of %s: %w", rental, err)
	}
	return m, true, nil
}

func (r redisMoves) Drop(ctx context.Context, rental string) error {
	pipe := r.rdb.TxPipeline()
	pipe.Del(ctx, r.migrationKey(rental))
	pipe.SRem(ctx, r.migrationsKey(), rental)
	if _, err := pipe.Exec(ctx); err != nil {
		return unavailable("drop migration", err)
	}
	return nil
}

func (r redisMoves) List(ctx context.Context) ([]string, error) {
	ids, err := r.rdb.SMembers(ctx, r.migrationsKey()).Result()
	if err != nil {
		return nil, unavailable("list migrations", err)
	}
	return ids, nil
}

// storedQuarantine is a quarantine as stored.
type storedQuarantine struct {
	Epoch uint64    `json:"epoch"`
	Until time.Time `json:"until"`
}

func (r redisQuarantines) Put(ctx context.Context, q detect.Quarantine) error {
	raw, err := json.Marshal(storedQuarantine{Epoch: q.Epoch, Until: q.Until})
	if err != nil {
		return err
	}
	if err := r.rdb.HSet(ctx, r.quarantineKey(), q.Node, raw).Err(); err != nil {
		return unavailable("store quarantine", err)
	}
	return nil
}

// List skips a record that does not decode.
func (r redisQuarantines) List(ctx context.Context) ([]detect.Quarantine, error) {
	all, err := r.rdb.HGetAll(ctx, r.quarantineKey()).Result()
	if err != nil {
		return nil, unavailable("read quarantines", err)
	}
	var out []detect.Quarantine
	for node, raw := range all {
		var q storedQuarantine
		if json.Unmarshal([]byte(raw), &q) == nil {
			out = append(out, detect.Quarantine{Node: node, Epoch: q.Epoch, Until: q.Until})
		}
	}
	slices.SortFunc(out, func(a, b detect.Quarantine) int { return strings.Compare(a.Node, b.Node) })
	return out, nil
}

func (r redisQuarantines) Drop(ctx context.Context, node string) error {
	if err := r.rdb.HDel(ctx, r.quarantineKey(), node).Err(); err != nil {
		return unavailable("drop quarantine", err)
	}
	return nil
}
