package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/fault"
)

// Outcomes a rental request ends with. Exactly one is recorded per rental
// (SET NX): the replica that records it acts on it, any other replica that
// reserved capacity for the same rental gives it back.
const (
	outcomeScheduled = "scheduled"
	outcomeRejected  = "rejected"
	outcomeCancelled = "cancelled"
)

// records is the scheduler's own state in Redis, beside the capacity store:
//
//	<prefix>:sched:outcome:<rental>  string  the rental's outcome (TTL)
//	<prefix>:sched:class             hash    rental -> "<class>:<priority>" of placed rentals
//	<prefix>:sched:pending           hash    rental -> pending entry JSON
//
// Each operation is one Redis command or one pipeline of independent
// commands; the outcome claim is a single SET NX GET, so two replicas can
// never both win it.
type records struct {
	rdb    redis.UniversalClient
	prefix string
	ttl    time.Duration
}

func (r records) outcomeKey(id string) string { return r.prefix + ":sched:outcome:" + id }
func (r records) classKey() string            { return r.prefix + ":sched:class" }
func (r records) pendingKey() string          { return r.prefix + ":sched:pending" }

func unavailable(op string, err error) error {
	return fmt.Errorf("scheduler records: %s: %w: %v", op, fault.ErrUnavailable, err)
}

// claimed is the outcome recorded for a rental, whether this claim
// recorded it, and for a scheduled outcome the allocation it announced.
type claimed struct {
	Outcome string
	Won     bool
	Alloc   string // allocToken of the allocation announced; "" when none was named
}

// allocToken names one allocation of a rental: the node and the instant
// the store created it. Two replicas that announce the same allocation (one
// reserved it, the other got it back as Existing) hold the same token; a
// fresh reservation after the rental's earlier allocation was released has
// another.
func allocToken(a capacity.Allocation) string {
	return a.NodeID + "@" + strconv.FormatInt(a.CreatedAt.UnixNano(), 10)
}

// claim records outcome want for each rental that has none, and returns the
// outcome recorded for each. A scheduled claim names the allocation it
// announces (allocs[i], an allocToken; nil for other outcomes), stored as
// "scheduled <token>". Placed rentals get their class recorded in the
// same pipeline, and leave the pending set.
func (r records) claim(ctx context.Context, ids []string, want string, allocs []string, classes []classRecord) ([]claimed, error) {
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
			args = append(args, rentalOfKey(id), classes[i].String())
		}
		pipe.HSet(ctx, r.classKey(), args...)
	}
	rentals := make([]string, len(ids))
	for i, id := range ids {
		rentals[i] = rentalOfKey(id)
	}
	pipe.HDel(ctx, r.pendingKey(), rentals...)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, unavailable("claim outcomes", err)
	}
	out := make([]claimed, len(ids))
	for i, c := range cmds {
		v, err := c.Text()
		switch {
		case errors.Is(err, redis.Nil):
			out[i] = claimed{Outcome: want, Won: true}
			if allocs != nil {
				out[i].Alloc = allocs[i]
			}
		case err != nil:
			return nil, unavailable("claim outcome", err)
		default:
			outcome, alloc, _ := strings.Cut(v, " ")
			out[i] = claimed{Outcome: outcome, Alloc: alloc}
		}
	}
	return out, nil
}

// claimKey names the outcome record of one placement attempt of a rental:
// the rental id for the first, "<rental>.<attempt>" after a migration ('.'
// cannot occur in a rental id, which is a subject token).
func claimKey(rental string, attempt int32) string {
	if attempt <= 1 {
		return rental
	}
	return fmt.Sprintf("%s.%d", rental, attempt)
}

// rentalOfKey is the rental a claim key belongs to.
func rentalOfKey(key string) string {
	rental, _, _ := strings.Cut(key, ".")
	return rental
}

// maxAttempts bounds the search for a rental's current attempt.
const maxAttempts = 64

// placedAfter reports whether a placement later than attempt has an
// outcome recorded (the rental was moved and placed again).
func (r records) placedAfter(ctx context.Context, rental string, attempt int32) (bool, error) {
	n, err := r.rdb.Exists(ctx, r.outcomeKey(claimKey(rental, attempt+1))).Result()
	if err != nil {
		return false, unavailable("read later attempt", err)
	}
	return n > 0, nil
}

// currentAttempt is the latest placement attempt with a recorded outcome
// (1 when the rental never moved).
func (r records) currentAttempt(ctx context.Context, rental string) (int32, error) {
	attempt := int32(1)
	for attempt < maxAttempts {
		later, err := r.placedAfter(ctx, rental, attempt)
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

// outcome is a rental's recorded outcome, "" when none.
func (r records) outcome(ctx context.Context, id string) (string, error) {
	v, err := r.rdb.Get(ctx, r.outcomeKey(id)).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", unavailable("read outcome", err)
	}
	outcome, _, _ := strings.Cut(v, " ")
	return outcome, nil
}

// decided reports, for each claim key, whether an outcome is recorded.
func (r records) decided(ctx context.Context, ids []string) ([]bool, error) {
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

// classes reads the class records of rentals (missing ones are absent).
func (r records) classes(ctx context.Context, ids []string) (map[string]classRecord, error) {
	out := map[string]classRecord{}
	for start := 0; start < len(ids); start += 1000 {
		chunk := ids[start:min(len(ids), start+1000)]
		vals, err := r.rdb.HMGet(ctx, r.classKey(), chunk...).Result()
		if err != nil {
			return nil, unavailable("read classes", err)
		}
		for i, v := range vals {
			if s, ok := v.(string); ok {
				if rec, ok := parseClassRecord(s); ok {
					out[chunk[i]] = rec
				}
			}
		}
	}
	return out, nil
}

// forget drops a released rental's class record.
// placed reports whether a rental has a class record: it was placed and
// its stop has not been handled (a rental between two attempts keeps it).
func (r records) placed(ctx context.Context, id string) (bool, error) {
	ok, err := r.rdb.HExists(ctx, r.classKey(), id).Result()
	if err != nil {
		return false, unavailable("read class", err)
	}
	return ok, nil
}

func (r records) forget(ctx context.Context, id string) error {
	if err := r.rdb.HDel(ctx, r.classKey(), id).Err(); err != nil {
		return unavailable("forget class", err)
	}
	return nil
}

// pendingEntry is a request waiting for capacity.
type pendingEntry struct {
	Request []byte `json:"request"` // RentalRequested, protobuf
	Reason  int32  `json:"reason"`
	// PreemptUntil: a preemption was started for this request; no other
	// is started before then.
	PreemptUntil time.Time `json:"preempt_until,omitzero"`
	// Attempt is the placement number (0 or 1 for a new request).
	Attempt int32 `json:"attempt,omitempty"`
	ev      *shizuv1.RentalRequested
}

func (r records) putPending(ctx context.Context, entries []pendingEntry) error {
	if len(entries) == 0 {
		return nil
	}
	args := make([]any, 0, 2*len(entries))
	for _, e := range entries {
		raw, err := json.Marshal(e)
		if err != nil {
			return fmt.Errorf("encode pending %s: %w", e.ev.GetRentalId(), err)
		}
		args = append(args, e.ev.GetRentalId(), raw)
	}
	if err := r.rdb.HSet(ctx, r.pendingKey(), args...).Err(); err != nil {
		return unavailable("store pending", err)
	}
	return nil
}

func (r records) dropPending(ctx context.Context, ids ...string) error {
	if len(ids) == 0 {
		return nil
	}
	if err := r.rdb.HDel(ctx, r.pendingKey(), ids...).Err(); err != nil {
		return unavailable("drop pending", err)
	}
	return nil
}

// pending reads every waiting request; undecodable entries are returned by
// id so the caller can drop them.
func (r records) pending(ctx context.Context) ([]pendingEntry, []string, error) {
	all, err := r.rdb.HGetAll(ctx, r.pendingKey()).Result()
	if err != nil {
		return nil, nil, unavailable("read pending", err)
	}
	var out []pendingEntry
	var bad []string
	for id, raw := range all {
		var e pendingEntry
		e.ev = &shizuv1.RentalRequested{}
		if json.Unmarshal([]byte(raw), &e) != nil || proto.Unmarshal(e.Request, e.ev) != nil || e.ev.GetRentalId() != id {
			bad = append(bad, id)
			continue
		}
		out = append(out, e)
	}
	return out, bad, nil
}
