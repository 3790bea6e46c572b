package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/shizu-gpu/shizu/services/autoscaler/policy"
	"github.com/shizu-gpu/shizu/shared/fault"
)

// poolRecord is what the autoscaler keeps per pool in Redis: the policy
// state and the pool's rentals, oldest first. Scale-in cancels the newest.
// Withdrawn is set by the withdrawal of a pool declared through the bus and
// cleared when it is declared again; DeclSeq is the SCALING stream sequence
// of the declaration or withdrawal that last set or cleared it. A sample or
// tick that read the pool's policy before the withdrawal finds the flag
// here (the record is WATCHed) and changes nothing.
type poolRecord struct {
	State     policy.State `json:"state"`
	Seq       int          `json:"seq"`
	Rentals   []poolRental `json:"rentals"`
	Withdrawn bool         `json:"withdrawn,omitempty"`
	DeclSeq   uint64       `json:"decl_seq,omitempty"`
	// Outbox holds the events of committed changes not yet known to be
	// published (outbox.go): a decision is committed with its events, then
	// they are published, then cleared.
	Outbox []outboxEvent `json:"outbox,omitempty"`
}

type poolRental struct {
	ID     string        `json:"id"`
	Seq    int           `json:"seq"`
	Market policy.Market `json:"market"`
}

// stateStore keeps pool records in Redis and updates them with optimistic
// concurrency (WATCH/MULTI), so replicas of the autoscaler sharing the
// traffic consumer never lose each other's updates.
type stateStore struct {
	rdb    *redis.Client
	prefix string
	// marker, when set, is the key whose absence makes update refuse
	// (errStateLost): Redis lost the state and it is being rebuilt
	// (rebuild.go). Looked for after the record is read, so a record read
	// from a Redis that came back empty is never written back.
	marker string
	// beforeCommit, when set (tests only), runs between an update's read
	// and its commit: a failpoint for a racing writer.
	beforeCommit func()
}

func (s stateStore) key(pool string) string { return s.prefix + ":autoscaler:pool:{" + pool + "}" }

// errNoChange tells update that fn changed nothing worth writing.
var errNoChange = errors.New("no change")

// update runs fn on the pool's record and writes the result if no one else
// wrote it in between; on a conflict it runs fn again on the new record.
func (s stateStore) update(ctx context.Context, pool string, fn func(*poolRecord) error) error {
	key := s.key(pool)
	for range 20 {
		err := s.rdb.Watch(ctx, func(tx *redis.Tx) error {
			rec, err := s.read(ctx, tx, key)
			if err != nil {
				return err
			}
			if err := intact(ctx, s.rdb, s.marker); err != nil {
				return err
			}
			if err := fn(&rec); err != nil {
				return err
			}
			data, err := json.Marshal(rec)
			if err != nil {
				return err
			}
			if s.beforeCommit != nil {
				s.beforeCommit()
			}
			_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Set(ctx, key, data, 0)
				return nil
			})
			return err
		}, key)
		switch {
		case errors.Is(err, errNoChange):
			return nil
		case errors.Is(err, redis.TxFailedErr):
			continue
		case err != nil:
			return err
		}
		return nil
	}
	return fault.Unavailable("pool %s: state kept changing under 20 attempts", pool)
}

func (s stateStore) read(ctx context.Context, c redis.Cmdable, key string) (poolRecord, error) {
	var rec poolRecord
	raw, err := c.Get(ctx, key).Bytes()
	if errors.Is(err, redis.Nil) {
		return rec, nil
	}
	if err != nil {
		return rec, fault.Unavailable("read %s: %w", key, err)
	}
	if err := json.Unmarshal(raw, &rec); err != nil {
		return rec, fmt.Errorf("decode %s: %w", key, err)
	}
	return rec, nil
}

// intact returns errStateLost when marker is set and missing.
func intact(ctx context.Context, rdb *redis.Client, marker string) error {
	if marker == "" {
		return nil
	}
	n, err := rdb.Exists(ctx, marker).Result()
	if err != nil {
		return fault.Unavailable("read the state marker: %w", err)
	}
	if n == 0 {
		return errStateLost
	}
	return nil
}
