package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/billing"
)

// UsageRows sums a tenant's day aggregates over the whole UTC days [from,
// to) by groupBy (billing.ByRental, ByModel, ByDay, ByLabel): one HGETALL
// per day, pipelined. Rows are ordered by key, then plan. A record with
// two labels counts in both labels' rows.
func (s *Store) UsageRows(ctx context.Context, tenant string, from, to time.Time, groupBy string) ([]billing.UsageRow, error) {
	gen, err := s.Generation(ctx)
	if err != nil {
		return nil, err
	}
	kind := map[string]string{billing.ByRental: "rentals", billing.ByLabel: "labels", billing.ByModel: "day", billing.ByDay: "day"}[groupBy]
	if kind == "" {
		return nil, fmt.Errorf("usage rows: unknown grouping %q", groupBy)
	}
	var days []string
	for d := from.UTC(); d.Before(to); d = d.AddDate(0, 0, 1) {
		days = append(days, d.Format(time.DateOnly))
	}
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, len(days))
	for i, d := range days {
		cmds[i] = pipe.HGetAll(ctx, s.prefix+"agg:"+gen+":"+kind+":"+tenant+":"+d)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("usage rows of %s: %w", tenant, err)
	}
	rows := map[[2]string]*billing.UsageRow{}
	for i, cmd := range cmds {
		for f, v := range cmd.Val() {
			key, plan, measure, err := parseField(kind, days[i], f, groupBy)
			if err != nil {
				return nil, err
			}
			n, _ := strconv.ParseInt(v, 10, 64)
			row := rows[[2]string{key, plan}]
			if row == nil {
				row = &billing.UsageRow{Key: key, Plan: plan}
				rows[[2]string{key, plan}] = row
			}
			switch measure {
			case "micros":
				row.AmountMicros += n
			case "mgs":
				row.MilliGPUSeconds += n
			case "seconds":
				row.Seconds += n
			}
		}
	}
	out := make([]billing.UsageRow, 0, len(rows))
	for _, r := range rows {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Key != out[j].Key {
			return out[i].Key < out[j].Key
		}
		return out[i].Plan < out[j].Plan
	})
	return out, nil
}

// parseField reads one field of a day, rentals or labels aggregate: the
// row's key and plan and the measure the value is.
func parseField(kind, day, f, groupBy string) (key, plan, measure string, err error) {
	if kind != "day" {
		// <rental>|measure or <key>=<value>|measure: the measure is last.
		i := strings.LastIndexByte(f, '|')
		if i < 0 {
			return "", "", "", fmt.Errorf("bad %s aggregate field %q", kind, f)
		}
		return f[:i], "", f[i+1:], nil
	}
	parts := strings.Split(f, "|")
	if len(parts) != 3 {
		return "", "", "", fmt.Errorf("bad day aggregate field %q", f)
	}
	if groupBy == billing.ByDay {
		return day, "", parts[2], nil
	}
	p, _ := strconv.Atoi(parts[0])
	return parts[1], PlanName(shizuv1.Plan(p)), parts[2], nil
}

// PlanName is a plan in people's words: on-demand, reserved, spot.
func PlanName(p shizuv1.Plan) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(p.String(), "PLAN_")), "_", "-")
}

// MonthSpend is a tenant's spend in month (YYYY-MM) and currency, as the
// budgets count it.
func (s *Store) MonthSpend(ctx context.Context, tenant, month, currency string) (int64, error) {
	gen, err := s.Generation(ctx)
	if err != nil {
		return 0, err
	}
	v, err := s.rdb.HGet(ctx, s.prefix+"agg:"+gen+":month:"+tenant, month+"|"+currency).Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("month spend of %s: %w", tenant, err)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("month spend of %s: %q: %w", tenant, v, err)
	}
	return n, nil
}
