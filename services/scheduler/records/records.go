// Package records keeps the scheduler's own state in Redis, beside the
// capacity store: the [ports.OutcomeRecords] of the real service.
package records

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/ports"
	"github.com/shizu-gpu/shizu/services/scheduler/round"
	"github.com/shizu-gpu/shizu/shared/fault"
)

// Redis holds the records in these keys:
//
//	<prefix>:sched:outcome:<attempt key>  string  the attempt's outcome (TTL)
//	<prefix>:sched:class                  hash    rental -> "<class>:<priority>" of placed rentals
//	<prefix>:sched:pending                hash    rental -> pending entry JSON
//	<prefix>:sched:preempt                hash    victim -> preemption JSON (until its stop is handled)
//	<prefix>:sched:owner                  hash    rental -> the tenant that owns it (owners.go; never dropped)
//	<prefix>:sched:rebuilt                string  the RENTALS sequence the records were rebuilt up to;
//	                                              written last (rebuild.go): without it the records
//	                                              were lost and are rebuilt before anything is decided
//
// Each operation is one Redis command or one pipeline of independent
// commands; the outcome claim is a single SET NX GET, so two replicas can
// never both win it.
type Redis struct {
	rdb    redis.UniversalClient
	prefix string
	ttl    time.Duration
}

var _ ports.OutcomeRecords = (*Redis)(nil)

// New is the records under prefix; an outcome is kept for ttl (whole
// seconds).
func New(rdb redis.UniversalClient, prefix string, ttl time.Duration) *Redis {
	return &Redis{rdb: rdb, prefix: prefix, ttl: ttl}
}

func (r *Redis) outcomeKey(id string) string { return r.prefix + ":sched:outcome:" + id }
func (r *Redis) classKey() string            { return r.prefix + ":sched:class" }
func (r *Redis) pendingKey() string          { return r.prefix + ":sched:pending" }
func (r *Redis) preemptKey() string          { return r.prefix + ":sched:preempt" }

func unavailable(op string, err error) error {
	return fmt.Errorf("scheduler records: %s: %w: %w", op, fault.ErrUnavailable, err)
}

// Claim stores a scheduled outcome as "scheduled <allocation token>".
func (r *Redis) Claim(ctx context.Context, ids []string, want string, allocs []string, classes []ports.Class) ([]round.Claim, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	pipe := r.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(ids))
	for i, id := range ids {
		v := want
		if allocs != nil && allocs[i] != "" {
			v += " " + allocs[i]
		}
		cmds[i] = pipe.Do(ctx, "SET", r.outcomeKey(id), v, "NX", "GET", "EX", int64(r.ttl/time.Second))
	}
	if classes != nil {
		args := make([]any, 0, 2*len(ids))
		for i, id := range ids {
			args = append(args, ports.RentalOfKey(id), classes[i].String())
		}
		pipe.HSet(ctx, r.classKey(), args...)
	}
	rentals := make([]string, len(ids))
	for i, id := range ids {
		rentals[i] = ports.RentalOfKey(id)
	}
	pipe.HDel(ctx, r.pendingKey(), rentals...)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, unavailable("claim outcomes", err)
	}
	out := make([]round.Claim, len(ids))
	for i, c := range cmds {
		v, err := c.Text()
		switch {
		case errors.Is(err, redis.Nil):
			out[i] = round.Claim{Outcome: want, Won: true}
			if allocs != nil {
				out[i].Alloc = allocs[i]
			}
		case err != nil:
			return nil, unavailable("claim outcome", err)
		default:
			outcome, alloc, _ := strings.Cut(v, " ")
			out[i] = round.Claim{Outcome: outcome, Alloc: alloc}
		}
	}
	return out, nil
}

// maxAttempts bounds the search for a rental's current attempt.
const maxAttempts = 64

// PlacedAfter implements ports.OutcomeRecords.
func (r *Redis) PlacedAfter(ctx context.Context, rental string, attempt int32) (bool, error) {
	n, err := r.rdb.Exists(ctx, r.outcomeKey(ports.AttemptKey(rental, attempt+1))).Result()
	if err != nil {
		return false, unavailable("read later attempt", err)
	}
	return n > 0, nil
}

// CurrentAttempt implements ports.OutcomeRecords.
func (r *Redis) CurrentAttempt(ctx context.Context, rental string) (int32, error) {
	attempt := int32(1)
	for attempt < maxAttempts {
		later, err := r.PlacedAfter(ctx, rental, attempt)
		if err != nil {
			return 0, err
		}
		if !later {
			break
		}
		attempt++
	}
	return attempt, nil
}

// Decided implements ports.OutcomeRecords.
func (r *Redis) Decided(ctx context.Context, ids []string) ([]bool, error) {
	out := make([]bool, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = r.outcomeKey(id)
	}
	vals, err := r.rdb.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, unavailable("read outcomes", err)
	}
	for i, v := range vals {
		out[i] = v != nil
	}
	return out, nil
}

// Classes implements ports.OutcomeRecords.
func (r *Redis) Classes(ctx context.Context, ids []string) (map[string]ports.Class, error) {
	out := map[string]ports.Class{}
	for start := 0; start < len(ids); start += 1000 {
		chunk := ids[start:min(len(ids), start+1000)]
		vals, err := r.rdb.HMGet(ctx, r.classKey(), chunk...).Result()
		if err != nil {
			return nil, unavailable("read classes", err)
		}
		for i, v := range vals {
			if s, ok := v.(string); ok {
				if rec, ok := ports.ParseClass(s); ok {
					out[chunk[i]] = rec
				}
			}
		}
	}
	return out, nil
}

// Placed implements ports.OutcomeRecords.
func (r *Redis) Placed(ctx context.Context, id string) (bool, error) {
	ok, err := r.rdb.HExists(ctx, r.classKey(), id).Result()
	if err != nil {
		return false, unavailable("read class", err)
	}
	return ok, nil
}

// Forget implements ports.OutcomeRecords.
func (r *Redis) Forget(ctx context.Context, id string) error {
	pipe := r.rdb.Pipeline()
	pipe.HDel(ctx, r.classKey(), id)
	pipe.HDel(ctx, r.preemptKey(), id)
	if _, err := pipe.Exec(ctx); err != nil {
		return unavailable("forget class", err)
	}
	return nil
}

// pendingJSON is a pending entry as stored.
type pendingJSON struct {
	Request      []byte    `json:"request"` // RentalRequested, protobuf
	Reason       int32     `json:"reason"`
	PreemptUntil time.Time `json:"preempt_until,omitzero"`
	Attempt      int32     `json:"attempt,omitempty"`
	Preferred    []string  `json:"preferred_models,omitempty"`
}

// PutPending implements ports.OutcomeRecords.
func (r *Redis) PutPending(ctx context.Context, entries []ports.PendingEntry) error {
	if len(entries) == 0 {
		return nil
	}
	args := make([]any, 0, 2*len(entries))
	for _, e := range entries {
		req, err := proto.Marshal(e.Event)
		if err != nil {
			return fault.Invalid("encode pending %s: %w", e.Event.GetRentalId(), err)
		}
		raw, err := json.Marshal(pendingJSON{Request: req, Reason: int32(e.Reason), PreemptUntil: e.PreemptUntil, Attempt: e.Attempt,
			Preferred: e.PreferredModels})
		if err != nil {
			return fmt.Errorf("encode pending %s: %w", e.Event.GetRentalId(), err)
		}
		args = append(args, e.Event.GetRentalId(), raw)
	}
	if err := r.rdb.HSet(ctx, r.pendingKey(), args...).Err(); err != nil {
		return unavailable("store pending", err)
	}
	return nil
}

// DropPending implements ports.OutcomeRecords.
func (r *Redis) DropPending(ctx context.Context, ids ...string) error {
	if len(ids) == 0 {
		return nil
	}
	if err := r.rdb.HDel(ctx, r.pendingKey(), ids...).Err(); err != nil {
		return unavailable("drop pending", err)
	}
	return nil
}

// Pending implements ports.OutcomeRecords.
func (r *Redis) Pending(ctx context.Context) ([]ports.PendingEntry, []string, error) {
	all, err := r.rdb.HGetAll(ctx, r.pendingKey()).Result()
	if err != nil {
		return nil, nil, unavailable("read pending", err)
	}
	var out []ports.PendingEntry
	var bad []string
	for id, raw := range all {
		var e pendingJSON
		ev := &shizuv1.RentalRequested{}
		if json.Unmarshal([]byte(raw), &e) != nil || proto.Unmarshal(e.Request, ev) != nil || ev.GetRentalId() != id {
			bad = append(bad, id)
			continue
		}
		out = append(out, ports.PendingEntry{Event: ev, Reason: shizuv1.PendingReason(e.Reason), PreemptUntil: e.PreemptUntil, Attempt: e.Attempt,
			PreferredModels: e.Preferred})
	}
	return out, bad, nil
}
