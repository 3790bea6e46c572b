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
	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/services/metering/pricing"
)

// Aggregates live under <prefix>agg:<generation>:...:
//
//	seen:<day>                 set of applied record ids (day of interval start),
//	                           expiring SeenRetention after its last write
//	tenant:<tenant>            <currency> -> micros, mgs -> milli-GPU-seconds
//	month:<tenant>             <YYYY-MM>|<currency> -> micros (budgets)
//	rental:<rental>            micros, mgs, seconds
//	day:<tenant>:<YYYY-MM-DD>  <plan>|<model>|micros, <plan>|<model>|mgs
//	label:<tenant>:<YYYY-MM>   <key>=<value>|<currency> -> micros
//	rentals:<tenant>:<YYYY-MM-DD>  <rental>|micros, <rental>|mgs, <rental>|seconds
//	labels:<tenant>:<YYYY-MM-DD>   <key>=<value>|micros, <key>=<value>|mgs
//
// (the last two answer usage queries by rental and by label over whole
// days: query.go).
//
// <prefix>agg:gen holds the current generation ("0" when absent).

// Applied says what applying one record did.
type Applied struct {
	// New is false when the record had been applied before.
	New bool
	// MonthBefore and MonthAfter are the tenant's spend in the record's
	// month and currency around this record (both the spend now when the
	// record had been applied before).
	MonthBefore, MonthAfter int64
}

// SeenRetention is how long a day's set of applied record ids is kept
// after its last write; a record applied again later is counted again
// (docs/design/publish-then-fold.md, docs/metering.md Known limits).
const SeenRetention = 8 * 24 * time.Hour

// applyScript folds usage records into the aggregates, each once per
// record id, and returns per record: 1 when new (0 when applied before),
// and the tenant's month spend before and after it. Each day's set of
// applied ids it touched expires SeenRetention after this call.
//
//	ARGV: prefix, generation ('' for the current), seen retention in
//	      seconds, then per record: id, day,
//	      month, tenant, rental, plan|model, currency, micros,
//	      milli-GPU-seconds, seconds, number of labels, key=value labels
var applyScript = guarded(`
local p = ARGV[1]
local gen = ARGV[2]
if gen == '' then gen = redis.call('GET', p .. 'agg:gen') or '0' end
p = p .. 'agg:' .. gen .. ':'
local ttl = ARGV[3]
local out = {}
local days = {}
local i = 4
while i <= #ARGV do
  local id, day, month, tenant, rental, pm, cur = ARGV[i], ARGV[i+1], ARGV[i+2], ARGV[i+3], ARGV[i+4], ARGV[i+5], ARGV[i+6]
  local micros, mgs, secs, nlabels = ARGV[i+7], ARGV[i+8], ARGV[i+9], tonumber(ARGV[i+10])
  local mkey, mfield = p .. 'month:' .. tenant, month .. '|' .. cur
  days[day] = true
  if redis.call('SADD', p .. 'seen:' .. day, id) == 0 then
    local spent = redis.call('HGET', mkey, mfield) or '0'
    out[#out+1] = 0
    out[#out+1] = spent
    out[#out+1] = spent
  else
    local before = redis.call('HGET', mkey, mfield) or '0'
    local after = redis.call('HINCRBY', mkey, mfield, micros)
    local tkey, rkey, dkey = p .. 'tenant:' .. tenant, p .. 'rental:' .. rental, p .. 'day:' .. tenant .. ':' .. day
    redis.call('HINCRBY', tkey, cur, micros)
    redis.call('HINCRBY', tkey, 'mgs', mgs)
    redis.call('HINCRBY', rkey, 'micros', micros)
    redis.call('HINCRBY', rkey, 'mgs', mgs)
    redis.call('HINCRBY', rkey, 'seconds', secs)
    redis.call('HINCRBY', dkey, pm .. '|micros', micros)
    redis.call('HINCRBY', dkey, pm .. '|mgs', mgs)
    local rdkey, ldkey = p .. 'rentals:' .. tenant .. ':' .. day, p .. 'labels:' .. tenant .. ':' .. day
    redis.call('HINCRBY', rdkey, rental .. '|micros', micros)
    redis.call('HINCRBY', rdkey, rental .. '|mgs', mgs)
    redis.call('HINCRBY', rdkey, rental .. '|seconds', secs)
    for j = i + 11, i + 10 + nlabels do
      redis.call('HINCRBY', p .. 'label:' .. tenant .. ':' .. month, ARGV[j] .. '|' .. cur, micros)
      redis.call('HINCRBY', ldkey, ARGV[j] .. '|micros', micros)
      redis.call('HINCRBY', ldkey, ARGV[j] .. '|mgs', mgs)
    end
    out[#out+1] = 1
    out[#out+1] = before
    out[#out+1] = tostring(after)
  end
  i = i + 11 + nlabels
end
for day in pairs(days) do redis.call('EXPIRE', p .. 'seen:' .. day, ttl) end
return out`)

// Apply folds one usage record into the aggregates of generation gen (""
// for the current one), once per record id.
func (s *Store) Apply(ctx context.Context, gen string, r *shizuv1.UsageRecorded) (Applied, error) {
	reply, err := s.pipe.run(ctx, applyScript, nil, append(s.appendRecord([]any{s.prefix, gen, seenTTL}, r), s.marker)...)
	if err != nil {
		return Applied{}, fmt.Errorf("apply usage %s: %w", r.GetMeta().GetEventId(), err)
	}
	out, err := appliedReplies([]*shizuv1.UsageRecorded{r}, reply)
	if err != nil {
		return Applied{}, err
	}
	return out[0], nil
}

// ApplyAll is Apply for many records in one script call; each record is
// still applied once per record id.
func (s *Store) ApplyAll(ctx context.Context, gen string, rs []*shizuv1.UsageRecorded) ([]Applied, error) {
	if len(rs) == 0 {
		return nil, nil
	}
	args := make([]any, 0, 3+12*len(rs))
	args = append(args, s.prefix, gen, seenTTL)
	for _, r := range rs {
		args = s.appendRecord(args, r)
	}
	reply, err := applyScript.Run(ctx, s.rdb, nil, append(args, s.marker)...).Result()
	if err != nil {
		return nil, fmt.Errorf("apply %d usage records: %w", len(rs), err)
	}
	return appliedReplies(rs, reply)
}

var seenTTL = strconv.FormatInt(int64(SeenRetention/time.Second), 10)

func (s *Store) appendRecord(args []any, r *shizuv1.UsageRecorded) []any {
	start := r.GetIntervalStart().AsTime().UTC()
	pm := strconv.Itoa(int(r.GetPlan())) + "|" + r.GetModel()
	mgs := int64(r.GetGpuCount()) * int64(r.GetMilliGpu()) * r.GetSeconds()
	args = append(args, r.GetMeta().GetEventId(), start.Format(time.DateOnly), start.Format("2006-01"),
		r.GetTenantId(), r.GetRentalId(), pm, r.GetAmount().GetCurrency(),
		strconv.FormatInt(r.GetAmount().GetMicros(), 10), strconv.FormatInt(mgs, 10), strconv.FormatInt(r.GetSeconds(), 10),
		len(r.GetLabels()))
	if len(r.GetLabels()) == 0 {
		return args
	}
	keys := make([]string, 0, len(r.GetLabels()))
	for k, v := range r.GetLabels() {
		keys = append(keys, k+"="+v)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, k)
	}
	return args
}

func appliedReplies(rs []*shizuv1.UsageRecorded, reply any) ([]Applied, error) {
	res, ok := reply.([]any)
	if !ok || len(res) != 3*len(rs) {
		return nil, fmt.Errorf("apply %d usage records: unexpected reply %v", len(rs), reply)
	}
	out := make([]Applied, len(rs))
	for i := range rs {
		n, _ := res[3*i].(int64)
		before, _ := res[3*i+1].(string)
		after, _ := res[3*i+2].(string)
		out[i].New = n == 1
		out[i].MonthBefore, _ = strconv.ParseInt(before, 10, 64)
		out[i].MonthAfter, _ = strconv.ParseInt(after, 10, 64)
	}
	return out, nil
}

// Generation returns the current aggregate generation.
func (s *Store) Generation(ctx context.Context) (string, error) {
	g, err := s.rdb.Get(ctx, s.prefix+"agg:gen").Result()
	if errors.Is(err, redis.Nil) {
		return "0", nil
	}
	return g, err
}

// NewGeneration reserves a fresh, empty generation number.
func (s *Store) NewGeneration(ctx context.Context) (string, error) {
	cur, err := s.Generation(ctx)
	if err != nil {
		return "", err
	}
	n, err := s.rdb.Incr(ctx, s.prefix+"agg:gennext").Result()
	if err != nil {
		return "", err
	}
	c, _ := strconv.ParseInt(cur, 10, 64)
	for n <= c {
		if n, err = s.rdb.Incr(ctx, s.prefix+"agg:gennext").Result(); err != nil {
			return "", err
		}
	}
	gen := strconv.FormatInt(n, 10)
	return gen, s.DropGeneration(ctx, gen)
}

// SwitchGeneration makes gen the current generation.
func (s *Store) SwitchGeneration(ctx context.Context, gen string) error {
	return s.rdb.Set(ctx, s.prefix+"agg:gen", gen, 0).Err()
}

// DropGeneration deletes every aggregate key of gen.
func (s *Store) DropGeneration(ctx context.Context, gen string) error {
	iter := s.rdb.Scan(ctx, 0, s.prefix+"agg:"+gen+":*", 1000).Iterator()
	var batch []string
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 1000 {
			if err := s.rdb.Unlink(ctx, batch...).Err(); err != nil {
				return err
			}
			batch = batch[:0]
		}
	}
	if err := iter.Err(); err != nil {
		return err
	}
	if len(batch) > 0 {
		return s.rdb.Unlink(ctx, batch...).Err()
	}
	return nil
}

// Usage sums a tenant's day aggregates over [from, to) (whole UTC days) per
// plan and model, for an invoice.
func (s *Store) Usage(ctx context.Context, tenant, currency string, from, to time.Time) ([]ledger.Usage, error) {
	gen, err := s.Generation(ctx)
	if err != nil {
		return nil, err
	}
	type key struct {
		plan  shizuv1.Plan
		model string
	}
	sums := map[key]*ledger.Usage{}
	for d := from.UTC(); d.Before(to); d = d.AddDate(0, 0, 1) {
		h, err := s.rdb.HGetAll(ctx, s.prefix+"agg:"+gen+":day:"+tenant+":"+d.Format(time.DateOnly)).Result()
		if err != nil {
			return nil, err
		}
		for f, v := range h {
			parts := strings.Split(f, "|")
			if len(parts) != 3 {
				return nil, fmt.Errorf("bad day aggregate field %q", f)
			}
			plan, _ := strconv.Atoi(parts[0])
			k := key{shizuv1.Plan(plan), parts[1]}
			u, ok := sums[k]
			if !ok {
				u = &ledger.Usage{Plan: k.plan, Model: k.model, Amount: pricing.Money{Currency: currency}}
				sums[k] = u
			}
			n, _ := strconv.ParseInt(v, 10, 64)
			if parts[2] == "micros" {
				u.Amount.Micros += n
			} else {
				u.MilliGPUSeconds += n
			}
		}
	}
	out := make([]ledger.Usage, 0, len(sums))
	for _, u := range sums {
		out = append(out, *u)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Plan != out[j].Plan {
			return out[i].Plan < out[j].Plan
		}
		return out[i].Model < out[j].Model
	})
	return out, nil
}

// LabelReport returns a tenant's spend in a month by label key=value.
func (s *Store) LabelReport(ctx context.Context, tenant string, month time.Time) (map[string]int64, error) {
	gen, err := s.Generation(ctx)
	if err != nil {
		return nil, err
	}
	h, err := s.rdb.HGetAll(ctx, s.prefix+"agg:"+gen+":label:"+tenant+":"+month.UTC().Format("2006-01")).Result()
	if err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(h))
	for f, v := range h {
		n, _ := strconv.ParseInt(v, 10, 64)
		out[f] = n
	}
	return out, nil
}

// Alert records that a tenant crossed a budget threshold in a month; it
// returns true the first time only.
func (s *Store) Alert(ctx context.Context, tenant, month string, threshold int64) (bool, error) {
	n, err := s.rdb.SAdd(ctx, s.prefix+"alerts:"+tenant+":"+month, threshold).Result()
	return n == 1, err
}

// Alerts lists the thresholds a tenant crossed in a month.
func (s *Store) Alerts(ctx context.Context, tenant, month string) ([]int64, error) {
	ms, err := s.rdb.SMembers(ctx, s.prefix+"alerts:"+tenant+":"+month).Result()
	if err != nil {
		return nil, err
	}
	out := make([]int64, 0, len(ms))
	for _, m := range ms {
		n, _ := strconv.ParseInt(m, 10, 64)
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out, nil
}
