package redisstore

import (
	"context"
	"errors"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Reads of the aggregates that only tests make.

// Dump returns every aggregate hash of gen (seen sets as their sizes),
// keyed without the generation prefix, to compare generations.
func (s *Store) Dump(ctx context.Context, gen string) (map[string]map[string]string, error) {
	pre := s.prefix + "agg:" + gen + ":"
	out := map[string]map[string]string{}
	iter := s.rdb.Scan(ctx, 0, pre+"*", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		name := strings.TrimPrefix(k, pre)
		if strings.HasPrefix(name, "seen:") {
			n, err := s.rdb.SCard(ctx, k).Result()
			if err != nil {
				return nil, err
			}
			out[name] = map[string]string{"count": strconv.FormatInt(n, 10)}
			continue
		}
		h, err := s.rdb.HGetAll(ctx, k).Result()
		if err != nil {
			return nil, err
		}
		out[name] = h
	}
	return out, iter.Err()
}

// Rental returns a rental's billed micros and milli-GPU-seconds.
func (s *Store) Rental(ctx context.Context, rental string) (micros, mgs int64, err error) {
	gen, err := s.Generation(ctx)
	if err != nil {
		return 0, 0, err
	}
	h, err := s.rdb.HGetAll(ctx, s.prefix+"agg:"+gen+":rental:"+rental).Result()
	if err != nil {
		return 0, 0, err
	}
	micros, _ = strconv.ParseInt(h["micros"], 10, 64)
	mgs, _ = strconv.ParseInt(h["mgs"], 10, 64)
	return micros, mgs, nil
}

// TenantTotal returns a tenant's billed micros in currency.
func (s *Store) TenantTotal(ctx context.Context, tenant, currency string) (int64, error) {
	gen, err := s.Generation(ctx)
	if err != nil {
		return 0, err
	}
	v, err := s.rdb.HGet(ctx, s.prefix+"agg:"+gen+":tenant:"+tenant, currency).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return v, err
}
