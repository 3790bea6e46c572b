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
	// marker is the key whose absence makes every guarded write fail
	// (Guarded); empty for an unguarded store.
	marker string
}

// pipelineLanes is how many shared pipelines may be on the wire at once.
const pipelineLanes = 4

// New returns a store whose keys start with prefix (default "mt:"). The
// batch calls (MergeSegments, AdvanceAll, ApplyAll) are one script call
// each; single-record calls (Apply) of concurrent callers share pipelines.
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

func member(r ledger.SegmentRef) string { return r.RentalID + " " + strconv.Itoa(int(r.Attempt)) }

func parseMember(m string) (ledger.SegmentRef, error) {
	rental, attempt, ok := strings.Cut(m, " ")
	n, err := strconv.Atoi(attempt)
	if !ok || err != nil {
		return ledger.SegmentRef{}, fmt.Errorf("bad due member %q", m)
	}
	return ledger.SegmentRef{RentalID: rental, Attempt: int32(n)}, nil
}

func nanos(t time.Time) string { return strconv.FormatInt(t.UnixNano(), 10) }

// mergeScript applies the segment merge rule (ledger.Merge) to the events
// of one or more segments (in order) atomically, and returns, per segment,
// its hash and the last heartbeat of the node this placement was lost on,
// if it was: a batch of events is one script call. The rule itself is
// written and tested in Go (ledger.Merge); the script must do what it says,
// which TestTheMergeScriptAppliesTheGoMergeRule checks on the same inputs.
//
//	KEYS: due, then per segment: seg, lost, attempts
//	ARGV: per segment: due member, attempt, number of events, then per
//	      event: mode (sched|start|stop), due score, n, n field/value pairs
var mergeScript = guarded(`
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

// encode is an event's script arguments: mode, due score and the fields
// it sets (nil for ChangeNone).
func encode(ev ledger.SegmentEvent) (mode string, due int64, fields []any, err error) {
	switch ev.Change {
	case ledger.ChangeScheduled:
		st := ev.Facts
		labels, err := json.Marshal(st.Labels)
		if err != nil {
			return "", 0, nil, err
		}
		f := []any{"sched", 1, "tenant", st.TenantID, "node", st.NodeID, "plan", int32(st.Plan),
			"model", st.Model, "zone", st.Zone, "gpus", st.GPUCount, "milli", st.MilliGPU, "labels", labels}
		if st.MaxSpot != nil {
			f = append(f, "maxspot", st.MaxSpot.Micros, "maxspotcur", st.MaxSpot.Currency)
		}
		return "sched", 0, f, nil
	case ledger.ChangeStarted:
		return "start", ev.Due.Unix(), []any{"start", nanos(ev.StartedAt), "startnode", ev.Node}, nil
	case ledger.ChangeStopped:
		return "stop", ev.Due.Unix(), []any{"sstart", nanos(ev.StartedAt), "stop", nanos(ev.StoppedAt), "exit", int32(ev.Exit)}, nil
	}
	return "", 0, nil, nil
}

// MergeSegments merges events into their segments in one atomic script
// call for the whole batch, and returns the state of each
// segment after its events, in the order the segments first appear. A
// segment named by a SegmentEvent with no change (SegmentEvent{Ref: r}) is
// only loaded.
func (s *Store) MergeSegments(ctx context.Context, events []ledger.SegmentEvent) ([]ledger.SegmentState, error) {
	type group struct {
		ref    ledger.SegmentRef
		events []ledger.SegmentEvent
	}
	var groups []*group
	byRef := make(map[ledger.SegmentRef]*group, len(events))
	for _, ev := range events {
		g, ok := byRef[ev.Ref]
		if !ok {
			g = &group{ref: ev.Ref}
			byRef[ev.Ref] = g
			groups = append(groups, g)
		}
		if ev.Change != ledger.ChangeNone {
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
		args = append(args, member(g.ref), g.ref.Attempt, len(g.events))
		for _, ev := range g.events {
			mode, due, fields, err := encode(ev)
			if err != nil {
				return nil, fmt.Errorf("segment %s: %w", member(ev.Ref), err)
			}
			args = append(args, mode, due, len(fields)/2)
			args = append(args, fields...)
		}
	}
	reply, err := mergeScript.Run(ctx, s.rdb, keys, append(args, s.marker)...).Result()
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

func parseReply(ref ledger.SegmentRef, out any) (ledger.SegmentState, error) {
	res, ok := out.([]any)
	if !ok || len(res) != 2 {
		return ledger.SegmentState{}, fmt.Errorf("segment %s: unexpected reply %v", member(ref), out)
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

// Lost records the last heartbeat of the node that placement attempt of a
// rental was lost on in a failover. It is kept per attempt, so a later
// placement on the same node is not ended by it. The earliest report wins
// (ledger.EarliestLoss), so replays agree.
func (s *Store) Lost(ctx context.Context, rental string, attempt int32, lastHeartbeat time.Time) error {
	return minScript.Run(ctx, s.rdb, []string{s.lostKey(rental)}, strconv.Itoa(int(attempt)), nanos(lastHeartbeat), s.marker).Err()
}

var minScript = guarded(`
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if (not cur) or tonumber(ARGV[2]) < tonumber(cur) then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
return 1`)

func parseSegment(ref ledger.SegmentRef, h map[string]string, lost string) (ledger.SegmentState, error) {
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
			return st, fmt.Errorf("segment %s labels: %w", member(ref), err)
		}
		if cur, ok := h["maxspotcur"]; ok {
			st.MaxSpot = &pricing.Money{Micros: num("maxspot"), Currency: cur}
		}
	}
	st.StartNode = h["startnode"]
	if st.NodeID == "" {
		st.NodeID = st.StartNode
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

func (s *Store) advanceArgs(keys []string, args []any, a ledger.Advance) ([]string, []any) {
	fin := "0"
	if a.Finished {
		fin = "1"
	}
	return append(keys, s.segKey(a.Ref.RentalID, a.Ref.Attempt)),
		append(args, nanos(a.Cursor), strconv.FormatInt(a.Due.Unix(), 10), member(a.Ref), fin)
}

// AdvanceAll applies advances (ledger.Advance.Apply) in one script call.
func (s *Store) AdvanceAll(ctx context.Context, as []ledger.Advance) error {
	if len(as) == 0 {
		return nil
	}
	keys := make([]string, 0, 1+len(as))
	keys = append(keys, s.dueKey())
	args := make([]any, 0, 4*len(as))
	for _, a := range as {
		keys, args = s.advanceArgs(keys, args, a)
	}
	if err := advanceScript.Run(ctx, s.rdb, keys, append(args, s.marker)...).Err(); err != nil {
		return fmt.Errorf("advance %d segments: %w", len(as), err)
	}
	return nil
}

// advanceScript applies ledger.Advance.Apply atomically: it moves cursors
// forward (never back) and reschedules or finishes segments; a finished
// segment (done) is never due again.
//
//	KEYS: due, then one segment per advance
//	ARGV: per advance: cursor, due score, due member, finished (0|1)
var advanceScript = guarded(`
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
func (s *Store) Due(ctx context.Context, t time.Time, limit int64) ([]ledger.SegmentRef, error) {
	ms, err := s.rdb.ZRangeByScore(ctx, s.dueKey(), &redis.ZRangeBy{Min: "-inf", Max: strconv.FormatInt(t.Unix(), 10), Count: limit}).Result()
	if err != nil {
		return nil, err
	}
	out := make([]ledger.SegmentRef, 0, len(ms))
	for _, m := range ms {
		ref, err := parseMember(m)
		if err != nil {
			return nil, err
		}
		out = append(out, ref)
	}
	return out, nil
}

// DropParked removes a segment that is still unscheduled and takes it off
// the due list, atomically; false when it was scheduled meanwhile.
func (s *Store) DropParked(ctx context.Context, ref ledger.SegmentRef) (bool, error) {
	n, err := dropParkedScript.Run(ctx, s.rdb, []string{s.segKey(ref.RentalID, ref.Attempt), s.dueKey()}, member(ref), s.marker).Int()
	if err != nil {
		return false, fmt.Errorf("drop parked %s: %w", member(ref), err)
	}
	return n == 1, nil
}

var dropParkedScript = guarded(`
if redis.call('HGET', KEYS[1], 'sched') == '1' then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1`)

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
