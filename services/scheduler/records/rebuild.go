package records

import (
	"context"
	"strconv"
)

// The records live in Redis, which may come back empty (restarted without
// persistence). The marker <prefix>:sched:rebuilt says they are whole: it
// is written last by a rebuild from the RENTALS stream (the stream
// sequence it read up to), so a Redis without it holds records that were
// lost, or were never rebuilt, and the scheduler rebuilds them before it
// decides anything (services/scheduler/app/rebuild.go).

func (r *Redis) rebuiltKey() string { return r.prefix + ":sched:rebuilt" }

// Rebuilt reports whether the records are whole: the marker is there.
func (r *Redis) Rebuilt(ctx context.Context) (bool, error) {
	n, err := r.rdb.Exists(ctx, r.rebuiltKey()).Result()
	if err != nil {
		return false, unavailable("read rebuilt marker", err)
	}
	return n > 0, nil
}

// MarkRebuilt writes the marker: the records hold everything the RENTALS
// stream said up to sequence upTo.
func (r *Redis) MarkRebuilt(ctx context.Context, upTo uint64) error {
	if err := r.rdb.Set(ctx, r.rebuiltKey(), strconv.FormatUint(upTo, 10), 0).Err(); err != nil {
		return unavailable("write rebuilt marker", err)
	}
	return nil
}
