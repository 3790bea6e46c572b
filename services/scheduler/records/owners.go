package records

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"

	"github.com/shizu-gpu/shizu/services/scheduler/ports"
)

var _ ports.Owners = (*Redis)(nil)

// ownerKey is the hash rental -> owning tenant (ports.Owners); written
// with HSETNX, so the first claim stands whichever replica makes it.
func (r *Redis) ownerKey() string { return r.prefix + ":sched:owner" }

// ClaimOwners implements ports.Owners: one pipeline of HSETNX, then one
// HMGET of the owners they left.
func (r *Redis) ClaimOwners(ctx context.Context, rentals, tenants []string) ([]string, error) {
	if len(rentals) == 0 {
		return nil, nil
	}
	pipe := r.rdb.Pipeline()
	for i, id := range rentals {
		pipe.HSetNX(ctx, r.ownerKey(), id, tenants[i])
	}
	got := pipe.HMGet(ctx, r.ownerKey(), rentals...)
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, unavailable("claim owners", err)
	}
	out := make([]string, len(rentals))
	for i, v := range got.Val() {
		s, ok := v.(string)
		if !ok {
			return nil, unavailable("claim owners", errors.New("owner missing right after its claim"))
		}
		out[i] = s
	}
	return out, nil
}

// Owner implements ports.Owners.
func (r *Redis) Owner(ctx context.Context, rental string) (string, error) {
	v, err := r.rdb.HGet(ctx, r.ownerKey(), rental).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return "", nil
	case err != nil:
		return "", unavailable("read owner", err)
	}
	return v, nil
}
