package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shizu-gpu/shizu/services/metering/ledger"
)

// Losing the store. Redis as shipped keeps nothing on disk: a restart
// comes back empty. Metering then rebuilds its state from the streams
// (app.Recover). So that nothing acts on a half-empty store meanwhile, a
// marker key (<prefix>store) is written last by each rebuild, and every
// write that could bill from what the store holds (merges, advances, losses,
// drops of parked placements, folds of usage records) runs in a script that
// first checks it: without the marker it fails with ErrLost and changes
// nothing, so its delivery is redelivered once the rebuild is done. Writes
// that are harmless on an empty store (a spot price, an alerted threshold:
// both rebuilt as well) are not guarded.

// ErrLost is the error of a guarded write while the marker is missing.
var ErrLost = errors.New("metering store lost: waiting for its rebuild")

// lostReply is the prefix of the guard's error reply.
const lostReply = "METERING_STORE_LOST"

// IsLost says whether err is a guarded write refused for a missing marker.
func IsLost(err error) bool {
	return err != nil && (errors.Is(err, ErrLost) || strings.Contains(err.Error(), lostReply))
}

// guardHead takes the marker key (the last argument of every guarded
// script call; empty when unguarded) off ARGV and refuses the call when
// the marker is missing.
const guardHead = `local marker = table.remove(ARGV)
if marker ~= '' and redis.call('EXISTS', marker) == 0 then
  return redis.error_reply('` + lostReply + ` the marker ' .. marker .. ' is missing')
end
`

// guarded is a script whose calls pass the marker key last.
func guarded(body string) *redis.Script { return redis.NewScript(guardHead + body) }

// Guarded is the same store with every guarded write refused (ErrLost)
// while the marker is missing. The service meters through a guarded
// store; the rebuild writes through the unguarded one.
func (s *Store) Guarded() *Store {
	g := *s
	g.marker = s.markerKey()
	return &g
}

func (s *Store) markerKey() string { return s.prefix + "store" }
func (s *Store) lockKey() string   { return s.prefix + "rebuilding" }

// Ready says whether the marker is there: the store holds what the streams
// say (or was never lost since it was last rebuilt).
func (s *Store) Ready(ctx context.Context) (bool, error) {
	n, err := s.rdb.Exists(ctx, s.markerKey()).Result()
	if err != nil {
		return false, fmt.Errorf("metering store marker: %w", err)
	}
	return n == 1, nil
}

// MarkReady writes the marker: the last step of a rebuild.
func (s *Store) MarkReady(ctx context.Context, rebuiltAt time.Time) error {
	return s.rdb.Set(ctx, s.markerKey(), rebuiltAt.UTC().Format(time.RFC3339Nano), 0).Err()
}

// LockRebuild takes the rebuild lock for owner for at most ttl; false when
// another owner holds it (that replica rebuilds; this one waits for the
// marker).
func (s *Store) LockRebuild(ctx context.Context, owner string, ttl time.Duration) (bool, error) {
	ok, err := s.rdb.SetNX(ctx, s.lockKey(), owner, ttl).Result()
	if err != nil {
		return false, fmt.Errorf("metering rebuild lock: %w", err)
	}
	return ok, nil
}

// UnlockRebuild releases the rebuild lock if owner still holds it.
func (s *Store) UnlockRebuild(ctx context.Context, owner string) error {
	return unlockScript.Run(ctx, s.rdb, []string{s.lockKey()}, owner).Err()
}

var unlockScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1`)

// restoreChunk bounds the segments of one restore script call.
const restoreChunk = 500

// Restore writes rebuilt segments (ledger.Replay.Segments) and losses
// back, merging with whatever the store holds (as the merge and advance
// scripts do: facts set, the first start kept, cursors only forward, a
// finished segment kept finished, the earlier due time kept), so a restore
// over a store that was not empty after all changes nothing it should not.
func (s *Store) Restore(ctx context.Context, segs []ledger.Restored, losses []ledger.LossMark) error {
	for chunk := range slices.Chunk(segs, restoreChunk) {
		keys := make([]string, 0, 1+2*len(chunk))
		keys = append(keys, s.dueKey())
		var args []any
		for _, r := range chunk {
			a, err := restoreArgs(r)
			if err != nil {
				return err
			}
			keys = append(keys, s.segKey(r.State.RentalID, r.State.Attempt), s.attKey(r.State.RentalID))
			args = append(args, a...)
		}
		if err := restoreScript.Run(ctx, s.rdb, keys, args...).Err(); err != nil {
			return fmt.Errorf("restore %d segments: %w", len(chunk), err)
		}
	}
	for _, l := range losses {
		if err := minScript.Run(ctx, s.rdb, []string{s.lostKey(l.RentalID)}, strconv.Itoa(int(l.Attempt)), nanos(l.LastHeartbeat), "").Err(); err != nil {
			return fmt.Errorf("restore loss of %s attempt %d: %w", l.RentalID, l.Attempt, err)
		}
	}
	return nil
}

// restoreArgs are one segment's arguments of restoreScript: the fields the
// merge script would have set for the events the state was merged from.
func restoreArgs(r ledger.Restored) ([]any, error) {
	st := r.State
	ref := ledger.SegmentRef{RentalID: st.RentalID, Attempt: st.Attempt}
	flag := func(b bool) string {
		if b {
			return "1"
		}
		return "0"
	}
	due, cursor := "", ""
	if r.Due.Listed {
		due = strconv.FormatInt(r.Due.At.Unix(), 10)
	}
	if !st.Cursor.IsZero() {
		cursor = nanos(st.Cursor)
	}
	args := []any{member(ref), st.Attempt, flag(r.Known), due, flag(st.Done), cursor}
	var sched, start, stop []any
	var err error
	if st.Scheduled {
		if _, _, sched, err = encode(ledger.ScheduledEvent(st)); err != nil {
			return nil, fmt.Errorf("segment %s: %w", member(ref), err)
		}
	}
	if !st.StartedAt.IsZero() {
		_, _, start, _ = encode(ledger.StartedEvent(ref, st.StartNode, st.StartedAt, time.Time{}))
	}
	if !st.StoppedAt.IsZero() {
		_, _, stop, _ = encode(ledger.StoppedEvent(ref, st.StoppedStartedAt, st.StoppedAt, st.ExitReason))
	}
	for _, f := range [][]any{sched, start, stop} {
		args = append(args, len(f)/2)
		args = append(args, f...)
	}
	return args, nil
}

// restoreScript writes rebuilt segments.
//
//	KEYS: due, then per segment: seg, attempts
//	ARGV: per segment: due member, attempt, known (0|1), due score ('' for
//	      none), done (0|1), cursor ('' for none), then three field lists
//	      (schedule: set; start: set unless set; stop: set), each its
//	      number of pairs and the pairs
var restoreScript = redis.NewScript(`
local i, k = 1, 2
local function fields(seg, setnx)
  local n = tonumber(ARGV[i])
  if setnx then
    for j = i + 1, i + 2 * n, 2 do redis.call('HSETNX', seg, ARGV[j], ARGV[j+1]) end
  elseif n > 0 then
    redis.call('HSET', seg, unpack(ARGV, i + 1, i + 2 * n))
  end
  i = i + 1 + 2 * n
end
while i <= #ARGV do
  local seg, att = KEYS[k], KEYS[k+1]
  local member, attempt, known, due, done, cursor = ARGV[i], ARGV[i+1], ARGV[i+2], ARGV[i+3], ARGV[i+4], ARGV[i+5]
  i = i + 6
  fields(seg, false)
  fields(seg, true)
  fields(seg, false)
  if cursor ~= '' then
    local cur = redis.call('HGET', seg, 'cursor')
    if (not cur) or tonumber(cursor) > tonumber(cur) then redis.call('HSET', seg, 'cursor', cursor) end
  end
  if done == '1' then redis.call('HSET', seg, 'done', 1) end
  if redis.call('HGET', seg, 'done') == '1' then
    redis.call('ZREM', KEYS[1], member)
  elseif due ~= '' then
    redis.call('ZADD', KEYS[1], 'LT', due, member)
  end
  if known == '1' then redis.call('SADD', att, attempt) end
  k = k + 2
end
return 1`)
