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
// batch calls (MergeSegments, AdvanceAll, ApplyAll) are one script call
// each; the single-segment and single-record calls (Scheduled, Started,
// Stopped, Segment, Advance, Apply) of concurrent callers share pipelines.
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

// mergeScript merges the fields of the events of one or more segments (in
// order) and returns, per segment, its hash and the last heartbeat of the
// node this placement was lost on, if it was: a batch of events is one
// script call.
//
//	KEYS: due, then per segment: seg, lost, attempts
//	ARGV: per segment: due member, attempt, number of events, then per
//	      event: mode (sched|start|stop), due score, n, n field/value pairs
//
// A start sets only the fields not set yet (the first start reported
// wins); the other events overwrite theirs with the same values on a
// redelivery. A start or stop makes the segment due unless it is finished
// (done): a redelivered start or stop of a finished segment takes it off
// the due list instead, so it is not looked at on every tick forever.
var mergeScript = redis.NewScript(`
local out = {}
local i = 1
local k = 2
while i <= #ARGV do
  local seg, lost, att = KEYS[k], KEYS[k+1], KEYS[k+2]
  local member, attempt, events = ARGV[i], ARGV[i+1], tonumber(ARGV[i+2])
  i = i + 3
  for _ = 1, events do
    local mode, due, n = ARGV[i], ARGV[i+1], tonumber(ARGV[i+2])
    local first, last = i + 3, i + 2 + 2 * n
    if mode == 'start' then
      for j = first, last, 2 do redis.call('HSETNX', seg, ARGV[j], ARGV[j+1]) end
    elseif n > 0 then
      redis.call('HSET', seg, unpack(ARGV, first, last))
    end
    if mode == 'start' or mode == 'stop' then
      if redis.call('HGET', seg, 'done') == '1' then
        redis.call('ZREM', KEYS[1], member)
      else
        redis.call('ZADD', KEYS[1], 'NX', due, member)
      end
    end
    if mode == 'start' or mode == 'sched' then redis.call('SADD', att, attempt) end
    i = last + 1
  end
  out[#out+1] = redis.call('HGETALL', seg)
  out[#out+1] = redis.call('HGET', lost, attempt) or false
  k = k + 3
end
return out`)

// SegmentEvent is one event's change to a segment, for MergeSegments.
type SegmentEvent struct {
	Ref    SegmentRef
	mode   string
	due    int64
	fields []any
}

// ScheduledEvent is the change RentalScheduled makes: the placement's
// pricing facts.
func ScheduledEvent(st ledger.SegmentState) (SegmentEvent, error) {
	labels, err := json.Marshal(st.Labels)
	if err != nil {
		return SegmentEvent{}, err
	}
	f := []any{"sched", 1, "tenant", st.TenantID, "node", st.NodeID, "plan", int32(st.Plan),
		"model", st.Model, "zone", st.Zone, "gpus", st.GPUCount, "milli", st.MilliGPU, "labels", labels}
	if st.MaxSpot != nil {
		f = append(f, "maxspot", st.MaxSpot.Micros, "maxspotcur", st.MaxSpot.Currency)
	}
	return SegmentEvent{Ref: SegmentRef{RentalID: st.RentalID, Attempt: st.Attempt}, mode: "sched", fields: f}, nil
}

// StartedEvent is the change RentalStarted makes: it records the start
// (the first reported wins) and makes the segment due for closing at due
// unless it already is.
func StartedEvent(ref SegmentRef, node string, at, due time.Time) SegmentEvent {
	return SegmentEvent{Ref: ref, mode: "start", due: due.Unix(), fields: []any{"start", nanos(at), "startnode", node}}
}

// StoppedEvent is the change RentalStopped makes: it records the end.
func StoppedEvent(ref SegmentRef, startedAt, stoppedAt time.Time, reason shizuv1.ExitReason) SegmentEvent {
	return SegmentEvent{Ref: ref, mode: "stop", due: stoppedAt.Unix(),
		fields: []any{"sstart", nanos(startedAt), "stop", nanos(stoppedAt), "exit", int32(reason)}}
}

// MergeSegments merges events into their segments in one atomic script
// call for the whole batch, and returns the state of each
// segment after its events, in the order the segments first appear. A
// segment named by a SegmentEvent with no change (SegmentEvent{Ref: r}) is
// only loaded.
func (s *Store) MergeSegments(ctx context.Context, events []SegmentEvent) ([]ledger.SegmentState, error) {
	type group struct {
		ref    SegmentRef
		events []SegmentEvent
	}
	var groups []*group
	byRef := make(map[SegmentRef]*group, len(events))
	for _, ev := range events {
		g, ok := byRef[ev.Ref]
		if !ok {
			g = &group{ref: ev.Ref}
			byRef[ev.Ref] = g
			groups = append(groups, g)
		}
		if ev.mode != "" {
			g.events = append(g.events, ev)
		}
	}
	if len(groups) == 0 {
		return nil, nil
	}
	keys := make([]string, 0, 1+3*len(groups))
	keys = append(keys, s.dueKey())
	args := make([]any, 0, 3*len(groups)+3*len(events)+8*len(events))
	for _, g := range groups {
		keys = append(keys, s.segKey(g.ref.RentalID, g.ref.Attempt), s.lostKey(g.ref.RentalID), s.attKey(g.ref.RentalID))
		args = append(args, g.ref.member(), g.ref.Attempt, len(g.events))
		for _, ev := range g.events {
			args = append(args, ev.mode, ev.due, len(ev.fields)/2)
			args = append(args, ev.fields...)
		}
	}
	reply, err := mergeScript.Run(ctx, s.rdb, keys, args...).Result()
	if err != nil {
		return nil, fmt.Errorf("merge %d segments: %w", len(groups), err)
	}
	res, ok := reply.([]any)
	if !ok || len(res) != 2*len(groups) {
		return nil, fmt.Errorf("merge %d segments: unexpected reply of %d values", len(groups), len(res))
	}
	out := make([]ledger.SegmentState, len(groups))
	for i, g := range groups {
		st, err := parseReply(g.ref, res[2*i:2*i+2])
		if err != nil {
			return nil, err
		}
		out[i] = st
	}
	return out, nil
}

func (s *Store) merge(ctx context.Context, ev SegmentEvent) (ledger.SegmentState, error) {
	keys := []string{s.dueKey(), s.segKey(ev.Ref.RentalID, ev.Ref.Attempt), s.lostKey(ev.Ref.RentalID), s.attKey(ev.Ref.RentalID)}
	args := []any{ev.Ref.member(), ev.Ref.Attempt, 0}
	if ev.mode != "" {
		args[2] = 1
		args = append(args, ev.mode, ev.due, len(ev.fields)/2)
		args = append(args, ev.fields...)
	}
	out, err := s.pipe.run(ctx, mergeScript, keys, args...)
	if err != nil {
		return ledger.SegmentState{}, fmt.Errorf("segment %s: %w", ev.Ref.member(), err)
	}
	return parseReply(ev.Ref, out)
}

func parseReply(ref SegmentRef, out any) (ledger.SegmentState, error) {
	res, ok := out.([]any)
	if !ok || len(res) != 2 {
		return ledger.SegmentState{}, fmt.Errorf("segment %s: unexpected reply %v", ref.member(), out)
	}
	flat, _ := res[0].([]any)
	h := make(map[string]string, len(flat)/2)
	for i := 0; i+1 < len(flat); i += 2 {
		k, _ := flat[i].(string)
		v, _ := flat[i+1].(string)
		h[k] = v
	}
	lost, _ := res[1].(string)
	return parseSegment(ref, h, lost)
}

// Scheduled records the pricing facts of a placement and returns what is
// known of it.
func (s *Store) Scheduled(ctx context.Context, st ledger.SegmentState) (ledger.SegmentState, error) {
	ev, err := ScheduledEvent(st)
	if err != nil {
		return st, err
	}
	return s.merge(ctx, ev)
}

// Started records the start of a placement, makes it due for closing at
// due (unless it already is) and returns what is known of it. The first
// start reported wins.
func (s *Store) Started(ctx context.Context, ref SegmentRef, node string, at, due time.Time) (ledger.SegmentState, error) {
	return s.merge(ctx, StartedEvent(ref, node, at, due))
}

// Stopped records the end of a placement and returns what is known of it.
func (s *Store) Stopped(ctx context.Context, ref SegmentRef, startedAt, stoppedAt time.Time, reason shizuv1.ExitReason) (ledger.SegmentState, error) {
	return s.merge(ctx, StoppedEvent(ref, startedAt, stoppedAt, reason))
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
	return s.merge(ctx, SegmentEvent{Ref: ref})
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
// next closing at Due, or, when Finished, takes it off the due list.
type Advance struct {
	Ref      SegmentRef
	Cursor   time.Time
	Due      time.Time
	Finished bool
}

func (s *Store) advanceArgs(keys []string, args []any, a Advance) ([]string, []any) {
	fin := "0"
	if a.Finished {
		fin = "1"
	}
	return append(keys, s.segKey(a.Ref.RentalID, a.Ref.Attempt)),
		append(args, nanos(a.Cursor), strconv.FormatInt(a.Due.Unix(), 10), a.Ref.member(), fin)
}

// Advance applies one Advance.
func (s *Store) Advance(ctx context.Context, a Advance) error {
	keys, args := s.advanceArgs([]string{s.dueKey()}, nil, a)
	_, err := s.pipe.run(ctx, advanceScript, keys, args...)
	return err
}

// AdvanceAll applies advances in one script call.
func (s *Store) AdvanceAll(ctx context.Context, as []Advance) error {
	if len(as) == 0 {
		return nil
	}
	keys := make([]string, 0, 1+len(as))
	keys = append(keys, s.dueKey())
	args := make([]any, 0, 4*len(as))
	for _, a := range as {
		keys, args = s.advanceArgs(keys, args, a)
	}
	if err := advanceScript.Run(ctx, s.rdb, keys, args...).Err(); err != nil {
		return fmt.Errorf("advance %d segments: %w", len(as), err)
	}
	return nil
}

// advanceScript moves cursors forward (never back) and reschedules or
// finishes segments. A finished segment (done) is never due again: a
// running advance that lands after the finishing one (the closer racing
// the stop's handler) takes it off the due list instead.
//
//	KEYS: due, then one segment per advance
//	ARGV: per advance: cursor, due score, due member, finished (0|1)
var advanceScript = redis.NewScript(`
for n = 2, #KEYS do
  local seg, i = KEYS[n], 4 * (n - 2) + 1
  local cur = redis.call('HGET', seg, 'cursor')
  if (not cur) or tonumber(ARGV[i]) > tonumber(cur) then redis.call('HSET', seg, 'cursor', ARGV[i]) end
  if ARGV[i+3] == '1' or redis.call('HGET', seg, 'done') == '1' then
    redis.call('HSET', seg, 'done', 1)
    redis.call('ZREM', KEYS[1], ARGV[i+2])
  else
    redis.call('ZADD', KEYS[1], ARGV[i+1], ARGV[i+2])
  end
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
