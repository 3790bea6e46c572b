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

// mergeScript merges the fields of one or more events of a segment (in
// order) and returns the segment's hash and the last heartbeat of the node
// this placement was lost on, if it was, in one round trip.
//
//	KEYS: seg, lost, due, attempts
//	ARGV: due member, attempt, then per event: mode (sched|start|stop),
//	      due score, n, n field/value pairs
//
// A start sets only the fields not set yet (the first start reported
// wins); the other events overwrite theirs with the same values on a
// redelivery.
var mergeScript = redis.NewScript(`
local i = 3
while i <= #ARGV do
  local mode, due, n = ARGV[i], ARGV[i+1], tonumber(ARGV[i+2])
  local first, last = i + 3, i + 2 + 2 * n
  if mode == 'start' then
    for j = first, last, 2 do redis.call('HSETNX', KEYS[1], ARGV[j], ARGV[j+1]) end
  elseif n > 0 then
    redis.call('HSET', KEYS[1], unpack(ARGV, first, last))
  end
  if mode == 'start' or mode == 'stop' then redis.call('ZADD', KEYS[3], 'NX', due, ARGV[1]) end
  if mode == 'start' or mode == 'sched' then redis.call('SADD', KEYS[4], ARGV[2]) end
  i = last + 1
end
local h = redis.call('HGETALL', KEYS[1])
local lost = redis.call('HGET', KEYS[2], ARGV[2])
return {h, lost}`)

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

// MergeSegments merges events into their segments, one atomic script per
// segment and all of them in one pipeline, and returns the state of each
// segment after its events, in the order the segments first appear. A
// segment named by a SegmentEvent with no change (SegmentEvent{Ref: r}) is
// only loaded.
func (s *Store) MergeSegments(ctx context.Context, events []SegmentEvent) ([]ledger.SegmentState, error) {
	type group struct {
		ref  SegmentRef
		args []any
	}
	var groups []*group
	byRef := make(map[SegmentRef]*group, len(events))
	for _, ev := range events {
		g, ok := byRef[ev.Ref]
		if !ok {
			g = &group{ref: ev.Ref, args: []any{ev.Ref.member(), ev.Ref.Attempt}}
			byRef[ev.Ref] = g
			groups = append(groups, g)
		}
		if ev.mode == "" {
			continue
		}
		g.args = append(g.args, ev.mode, ev.due, len(ev.fields)/2)
		g.args = append(g.args, ev.fields...)
	}
	if len(groups) == 0 {
		return nil, nil
	}
	calls := make([]scriptCall, len(groups))
	for i, g := range groups {
		calls[i] = scriptCall{keys: s.segmentKeys(g.ref), args: g.args}
	}
	cmds, err := s.pipelined(ctx, mergeScript, calls)
	if err != nil {
		return nil, err
	}
	out := make([]ledger.SegmentState, len(groups))
	for i, g := range groups {
		st, err := segmentReply(g.ref, cmds[i])
		if err != nil {
			return nil, err
		}
		out[i] = st
	}
	return out, nil
}

func (s *Store) segmentKeys(ref SegmentRef) []string {
	return []string{s.segKey(ref.RentalID, ref.Attempt), s.lostKey(ref.RentalID), s.dueKey(), s.attKey(ref.RentalID)}
}

func isNoScript(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") }

type scriptCall struct {
	keys []string
	args []any
}

// pipelined runs script once per call, all in one pipeline (one round
// trip), and returns each call's reply; it loads the script first when
// Redis lost its cache. Only a failure of the connection is returned as
// an error; a script's own error is in its reply.
func (s *Store) pipelined(ctx context.Context, script *redis.Script, calls []scriptCall) ([]*redis.Cmd, error) {
	run := func() ([]*redis.Cmd, error) {
		pipe := s.rdb.Pipeline()
		cmds := make([]*redis.Cmd, len(calls))
		for i, c := range calls {
			cmds[i] = script.EvalSha(ctx, pipe, c.keys, c.args...)
		}
		_, err := pipe.Exec(ctx)
		return cmds, err
	}
	cmds, err := run()
	if isNoScript(err) {
		if err := script.Load(ctx, s.rdb).Err(); err != nil {
			return nil, err
		}
		cmds, err = run()
	}
	if err != nil && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	for _, c := range cmds {
		if err := c.Err(); err != nil && err != redis.Nil && !isScriptError(err) {
			return nil, err
		}
	}
	return cmds, nil
}

// isScriptError is an error a script raised, as opposed to a connection's.
func isScriptError(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr)
}

func (s *Store) merge(ctx context.Context, ev SegmentEvent) (ledger.SegmentState, error) {
	args := []any{ev.Ref.member(), ev.Ref.Attempt}
	if ev.mode != "" {
		args = append(args, ev.mode, ev.due, len(ev.fields)/2)
		args = append(args, ev.fields...)
	}
	out, err := s.pipe.run(ctx, mergeScript, s.segmentKeys(ev.Ref), args...)
	if err != nil {
		return ledger.SegmentState{}, fmt.Errorf("segment %s: %w", ev.Ref.member(), err)
	}
	return parseReply(ev.Ref, out)
}

func segmentReply(ref SegmentRef, cmd *redis.Cmd) (ledger.SegmentState, error) {
	out, err := cmd.Result()
	if err != nil {
		return ledger.SegmentState{}, fmt.Errorf("segment %s: %w", ref.member(), err)
	}
	return parseReply(ref, out)
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

func (s *Store) advanceCall(a Advance) scriptCall {
	fin := "0"
	if a.Finished {
		fin = "1"
	}
	return scriptCall{keys: []string{s.segKey(a.Ref.RentalID, a.Ref.Attempt), s.dueKey()},
		args: []any{nanos(a.Cursor), strconv.FormatInt(a.Due.Unix(), 10), a.Ref.member(), fin}}
}

// Advance applies one Advance.
func (s *Store) Advance(ctx context.Context, a Advance) error {
	c := s.advanceCall(a)
	_, err := s.pipe.run(ctx, advanceScript, c.keys, c.args...)
	return err
}

// AdvanceAll applies advances in one pipeline.
func (s *Store) AdvanceAll(ctx context.Context, as []Advance) error {
	if len(as) == 0 {
		return nil
	}
	calls := make([]scriptCall, len(as))
	for i, a := range as {
		calls[i] = s.advanceCall(a)
	}
	cmds, err := s.pipelined(ctx, advanceScript, calls)
	if err != nil {
		return err
	}
	for i, c := range cmds {
		if err := c.Err(); err != nil {
			return fmt.Errorf("advance %s: %w", as[i].Ref.member(), err)
		}
	}
	return nil
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
