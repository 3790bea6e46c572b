// Package redisstore keeps metering's state in Redis: what it knows of each
// run segment, the spot price history, which segments are due for closing,
// and the aggregates of usage records (per tenant, rental, model, plan, day
// and label) in generations, so a rebuild can fill a fresh generation and
// switch to it atomically. Every write is idempotent: merging an event
// twice, or applying a usage record twice, changes nothing.
package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/services/metering/pricing"
)

// Store is metering's Redis state.
type Store struct {
	rdb    redis.UniversalClient
	prefix string
	pipe   *pipeliner
}

// pipelineLanes is how many shared pipelines may be on the wire at once.
const pipelineLanes = 4

// New returns a store whose keys start with prefix (default "mt:"). The
// hot-path scripts (merging events, applying usage records, advancing
// cursors) of concurrent callers share pipelines.
func New(rdb redis.UniversalClient, prefix string) *Store {
	if prefix == "" {
		prefix = "mt:"
	}
	return &Store{rdb: rdb, prefix: prefix, pipe: newPipeliner(rdb, pipelineLanes)}
}

func (s *Store) segKey(rental string, attempt int32) string {
	return fmt.Sprintf("%sseg:%s:%d", s.prefix, rental, attempt)
}
func (s *Store) lostKey(rental string) string { return s.prefix + "lost:" + rental }
func (s *Store) attKey(rental string) string  { return s.prefix + "att:" + rental }
func (s *Store) dueKey() string               { return s.prefix + "due" }
func (s *Store) spotKey(zone, model string) string {
	return s.prefix + "spot:" + zone + ":" + model
}

// SegmentRef names one placement of a rental.
type SegmentRef struct {
	RentalID string
	Attempt  int32
}

func (r SegmentRef) member() string { return r.RentalID + " " + strconv.Itoa(int(r.Attempt)) }

func parseMember(m string) (SegmentRef, error) {
	rental, attempt, ok := strings.Cut(m, " ")
	n, err := strconv.Atoi(attempt)
	if !ok || err != nil {
		return SegmentRef{}, fmt.Errorf("bad due member %q", m)
	}
	return SegmentRef{RentalID: rental, Attempt: int32(n)}, nil
}

func nanos(t time.Time) string { return strconv.FormatInt(t.UnixNano(), 10) }

// mergeScript merges one event's fields into a segment and returns the
// segment's hash and the last heartbeat of the node this placement was lost
// on, if it was, in one round trip.
//
//	KEYS: seg, lost, due, attempts
//	ARGV: mode (sched|start|stop|get), due member, due score, attempt, field, value, ...
var mergeScript = redis.NewScript(`
local mode = ARGV[1]
if mode == 'start' then
  for i = 5, #ARGV, 2 do redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i+1]) end
elseif mode ~= 'get' then
  for i = 5, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i+1]) end
end
if mode == 'start' or mode == 'stop' then redis.call('ZADD', KEYS[3], 'NX', ARGV[3], ARGV[2]) end
if mode == 'start' or mode == 'sched' then redis.call('SADD', KEYS[4], ARGV[4]) end
local h = redis.call('HGETALL', KEYS[1])
local lost = redis.call('HGET', KEYS[2], ARGV[4])
return {h, lost}`)

func (s *Store) merge(ctx context.Context, ref SegmentRef, mode string, due time.Time, fields ...any) (ledger.SegmentState, error) {
	args := append([]any{mode, ref.member(), due.Unix(), ref.Attempt}, fields...)
	out, err := s.pipe.run(ctx, mergeScript, []string{s.segKey(ref.RentalID, ref.Attempt), s.lostKey(ref.RentalID),
		s.dueKey(), s.attKey(ref.RentalID)}, args...)
	if err != nil {
		return ledger.SegmentState{}, fmt.Errorf("segment %s: %w", ref.member(), err)
	}
	res, ok := out.([]any)
	if !ok || len(res) != 2 {
		return ledger.SegmentState{}, fmt.Errorf("segment %s: unexpected reply %v", ref.member(), out)
	}
	flat, _ := res[0].([]any)
	h := make(map[string]string, len(flat)/2)
	for i := 0; i+1 < len(flat); i += 2 {
		h[fmt.Sprint(flat[i])] = fmt.Sprint(flat[i+1])
	}
	lost, _ := res[1].(string)
	return parseSegment(ref, h, lost)
}

// Scheduled records the pricing facts of a placement and returns what is
// known of it.
func (s *Store) Scheduled(ctx context.Context, st ledger.SegmentState) (ledger.SegmentState, error) {
	labels, err := json.Marshal(st.Labels)
	if err != nil {
		return st, err
	}
	f := []any{"sched", 1, "tenant", st.TenantID, "node", st.NodeID, "plan", int32(st.Plan),
		"model", st.Model, "zone", st.Zone, "gpus", st.GPUCount, "milli", st.MilliGPU, "labels", labels}
	if st.MaxSpot != nil {
		f = append(f, "maxspot", st.MaxSpot.Micros, "maxspotcur", st.MaxSpot.Currency)
	}
	return s.merge(ctx, SegmentRef{RentalID: st.RentalID, Attempt: st.Attempt}, "sched", time.Time{}, f...)
}

// Started records the start of a placement, makes it due for closing at
// due (unless it already is) and returns what is known of it. The first
// start reported wins.
func (s *Store) Started(ctx context.Context, ref SegmentRef, node string, at, due time.Time) (ledger.SegmentState, error) {
	return s.merge(ctx, ref, "start", due, "start", nanos(at), "startnode", node)
}

// Stopped records the end of a placement and returns what is known of it.
func (s *Store) Stopped(ctx context.Context, ref SegmentRef, startedAt, stoppedAt time.Time, reason shizuv1.ExitReason) (ledger.SegmentState, error) {
	return s.merge(ctx, ref, "stop", stoppedAt, "sstart", nanos(startedAt), "stop", nanos(stoppedAt), "exit", int32(reason))
}

// Lost records the last heartbeat of the node that placement attempt of a
// rental was lost on in a failover. It is kept per attempt, so a later
// placement on the same node is not ended by it. The earliest report wins,
// so replays agree.
func (s *Store) Lost(ctx context.Context, rental string, attempt int32, lastHeartbeat time.Time) error {
	return minScript.Run(ctx, s.rdb, []string{s.lostKey(rental)}, strconv.Itoa(int(attempt)), nanos(lastHeartbeat)).Err()
}

var minScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if (not cur) or tonumber(ARGV[2]) < tonumber(cur) then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
return 1`)

// Segment loads what is known of a placement.
func (s *Store) Segment(ctx context.Context, ref SegmentRef) (ledger.SegmentState, error) {
	return s.merge(ctx, ref, "get", time.Time{})
}

func parseSegment(ref SegmentRef, h map[string]string, lost string) (ledger.SegmentState, error) {
	st := ledger.SegmentState{RentalID: ref.RentalID, Attempt: ref.Attempt}
	tm := func(k string) time.Time {
		v, ok := h[k]
		if !ok {
			return time.Time{}
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		return time.Unix(0, n).UTC()
	}
	num := func(k string) int64 { n, _ := strconv.ParseInt(h[k], 10, 64); return n }
	if h["sched"] == "1" {
		st.Scheduled = true
		st.TenantID, st.NodeID, st.Model, st.Zone = h["tenant"], h["node"], h["model"], h["zone"]
		st.Plan = shizuv1.Plan(num("plan"))
		st.GPUCount, st.MilliGPU = int32(num("gpus")), int32(num("milli"))
		if err := json.Unmarshal([]byte(h["labels"]), &st.Labels); err != nil {
			return st, fmt.Errorf("segment %s labels: %w", ref.member(), err)
		}
		if cur, ok := h["maxspotcur"]; ok {
			st.MaxSpot = &pricing.Money{Micros: num("maxspot"), Currency: cur}
		}
	}
	if st.NodeID == "" {
		st.NodeID = h["startnode"]
	}
	st.StartedAt, st.StoppedStartedAt, st.StoppedAt = tm("start"), tm("sstart"), tm("stop")
	st.ExitReason = shizuv1.ExitReason(num("exit"))
	st.Cursor = tm("cursor")
	if lost != "" {
		n, _ := strconv.ParseInt(lost, 10, 64)
		st.LostAt = time.Unix(0, n).UTC()
	}
	st.Done = h["done"] == "1"
	return st, nil
}

// Advance moves a segment's cursor forward (never back) and schedules its
// next closing at due, or, when finished, takes it off the due list.
func (s *Store) Advance(ctx context.Context, ref SegmentRef, cursor time.Time, due time.Time, finished bool) error {
	fin := "0"
	if finished {
		fin = "1"
	}
	_, err := s.pipe.run(ctx, advanceScript, []string{s.segKey(ref.RentalID, ref.Attempt), s.dueKey()},
		nanos(cursor), strconv.FormatInt(due.Unix(), 10), ref.member(), fin)
	return err
}

var advanceScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], 'cursor')
if (not cur) or tonumber(ARGV[1]) > tonumber(cur) then redis.call('HSET', KEYS[1], 'cursor', ARGV[1]) end
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[1], 'done', 1)
  redis.call('ZREM', KEYS[2], ARGV[3])
else
  redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
end
return 1`)

// Due lists up to limit segments whose next closing is at or before t.
func (s *Store) Due(ctx context.Context, t time.Time, limit int64) ([]SegmentRef, error) {
	ms, err := s.rdb.ZRangeByScore(ctx, s.dueKey(), &redis.ZRangeBy{Min: "-inf", Max: strconv.FormatInt(t.Unix(), 10), Count: limit}).Result()
	if err != nil {
		return nil, err
	}
	out := make([]SegmentRef, 0, len(ms))
	for _, m := range ms {
		ref, err := parseMember(m)
		if err != nil {
			return nil, err
		}
		out = append(out, ref)
	}
	return out, nil
}

// SpotPrice records a spot price from an instant on.
func (s *Store) SpotPrice(ctx context.Context, zone, model string, p ledger.PricePoint) error {
	member := nanos(p.At) + " " + strconv.FormatInt(p.Price.Micros, 10) + " " + p.Price.Currency
	return s.rdb.ZAdd(ctx, s.spotKey(zone, model), redis.Z{Score: float64(p.At.UnixMilli()), Member: member}).Err()
}

// SpotPrices returns the spot history of a model and zone up to until (all
// of it when until is zero).
func (s *Store) SpotPrices(ctx context.Context, zone, model string, until time.Time) ([]ledger.PricePoint, error) {
	max := "+inf"
	if !until.IsZero() {
		max = strconv.FormatInt(until.UnixMilli()+1, 10)
	}
	ms, err := s.rdb.ZRangeByScore(ctx, s.spotKey(zone, model), &redis.ZRangeBy{Min: "-inf", Max: max}).Result()
	if err != nil {
		return nil, err
	}
	out := make([]ledger.PricePoint, 0, len(ms))
	for _, m := range ms {
		f := strings.Fields(m)
		if len(f) != 3 {
			return nil, fmt.Errorf("bad spot member %q", m)
		}
		at, err1 := strconv.ParseInt(f[0], 10, 64)
		micros, err2 := strconv.ParseInt(f[1], 10, 64)
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("bad spot member %q: %w", m, err)
		}
		out = append(out, ledger.PricePoint{At: time.Unix(0, at).UTC(), Price: pricing.Money{Micros: micros, Currency: f[2]}})
	}
	return out, nil
}

// Attempts lists the placements known of a rental.
func (s *Store) Attempts(ctx context.Context, rental string) ([]int32, error) {
	ms, err := s.rdb.SMembers(ctx, s.attKey(rental)).Result()
	if err != nil {
		return nil, err
	}
	out := make([]int32, 0, len(ms))
	for _, m := range ms {
		n, err := strconv.Atoi(m)
		if err != nil {
			return nil, fmt.Errorf("bad attempt %q of %s", m, rental)
		}
		out = append(out, int32(n))
	}
	return out, nil
}
