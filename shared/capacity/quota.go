package capacity

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Per-tenant quotas. The store counts what every tenant holds, in
// milli-GPU, in one hash beside the rentals index (see the package
// documentation, "Key layout"): the tenant's total, and its total per GPU
// model. The counters change in the same script that adds or removes a
// rental's index entry, so they always equal the sum over the tenant's
// live (indexed) allocations: Reserve adds, Release / ReleaseOn of a live
// allocation and HandOver take away (a handed-over previous run no longer
// counts, its next attempt does), Restore adds what it indexes and takes
// away what it overtakes. A Reserve with a Quota checks the counters in
// the same script, so replicas racing for one tenant can never take it
// past its quota.
//
// A share counts its milli-GPU (a whole GPU is 1000, half a GPU 500)
// towards its tenant's total and towards the model of the GPU it is on.
// The model is the node's, as registered (g<i>.model); the reserve script
// writes it into the allocation's record (gpu_models), so a release takes
// away exactly what was added even if the node registers other facts
// since.

// ErrQuota: the placement would take its tenant past its quota; the error
// is a *QuotaError that names the limit.
var ErrQuota = errors.New("over quota")

// IsQuota reports whether err wraps ErrQuota.
func IsQuota(err error) bool { return errors.Is(err, ErrQuota) }

// Quota is a tenant's limits as Reserve checks them: at most MaxGPUs GPUs
// in all and, for each model in PerModel, at most that many GPUs of that
// model (whole GPUs; fractions count as their share). A model PerModel
// does not name is limited by MaxGPUs alone. 0 allows none.
type Quota struct {
	MaxGPUs  int64
	PerModel map[string]int64
}

// MaxQuotaGPUs bounds a Quota's limits (so milli-GPU stay exact in Lua).
const MaxQuotaGPUs = MaxQuantity / MilliPerGPU

func (q Quota) check(p *problems, field string) {
	if q.MaxGPUs < 0 || q.MaxGPUs > MaxQuotaGPUs {
		p.addf(field+".MaxGPUs", "must be in 0..%d, got %d", int64(MaxQuotaGPUs), q.MaxGPUs)
	}
	for _, m := range slices.Sorted(maps.Keys(q.PerModel)) {
		p.text(field+".PerModel", m)
		if n := q.PerModel[m]; n < 0 || n > MaxQuotaGPUs {
			p.addf(field+".PerModel["+m+"]", "must be in 0..%d, got %d", int64(MaxQuotaGPUs), n)
		}
	}
}

// QuotaError says which limit of which tenant a placement would pass. It
// wraps ErrQuota.
type QuotaError struct {
	Tenant string
	// Model is the GPU model whose limit it is; "" for the tenant's total.
	Model string
	// Limit is the limit in GPUs; Used and Want are milli-GPU: what the
	// tenant holds now and what the placement asks for.
	Limit int64
	Used  int64
	Want  int64
}

func (e *QuotaError) Error() string {
	return fmt.Sprintf("%v: %s", ErrQuota, e.Reason())
}

// Reason is the limit in people's words, e.g. "tenant acme holds 3 of
// the 4 GPUs its quota allows and asks for 2 more".
func (e *QuotaError) Reason() string {
	what := "GPUs"
	if e.Model != "" {
		what = e.Model + " GPUs"
	}
	return fmt.Sprintf("tenant %s holds %s of the %d %s its quota allows and asks for %s more",
		e.Tenant, FormatGPUs(e.Used), e.Limit, what, FormatGPUs(e.Want))
}

// Unwrap returns ErrQuota.
func (e *QuotaError) Unwrap() error { return ErrQuota }

// FormatGPUs writes milli-GPU as GPUs: 2000 is "2", 1500 "1.5", 250 "0.25".
func FormatGPUs(milli int64) string {
	s := strconv.FormatInt(milli/MilliPerGPU, 10)
	if r := milli % MilliPerGPU; r != 0 {
		if r < 0 {
			r = -r
		}
		s += strings.TrimRight(fmt.Sprintf(".%03d", r), "0")
	}
	return s
}

// Usage is what a tenant holds: milli-GPU in all and per GPU model.
type Usage struct {
	MilliGPU int64
	PerModel map[string]int64 // absent models hold none
}

// Usage reads what tenant holds now.
func (s *Store) Usage(ctx context.Context, tenant string) (Usage, error) {
	op := "read usage of tenant " + tenant
	var p problems
	p.text("tenant", tenant)
	if err := invalid(p...); err != nil {
		return Usage{}, fmt.Errorf("capacity: %s: %w", op, err)
	}
	out := Usage{PerModel: map[string]int64{}}
	it := s.rdb.HScan(ctx, s.keys.usage(), 0, globEscape(tenant)+"*", 256).Iterator()
	for it.Next(ctx) {
		field := it.Val()
		if !it.Next(ctx) {
			break
		}
		n, err := strconv.ParseInt(it.Val(), 10, 64)
		if err != nil {
			return Usage{}, fmt.Errorf("capacity: %s: field %q: %w", op, field, err)
		}
		if field == tenant {
			out.MilliGPU = n
		} else if model, ok := strings.CutPrefix(field, tenant+" "); ok {
			out.PerModel[model] = n
		}
	}
	if err := it.Err(); err != nil {
		return Usage{}, unavailable(op, err)
	}
	return out, nil
}

// globEscape quotes the characters a Redis MATCH pattern treats specially.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// quotaArgs are the reserve script's quota arguments: the tenant, "1" and
// the limits when q is set (else "0"), in milli-GPU, models in order.
func quotaArgs(tenant string, q *Quota) []any {
	if q == nil {
		return []any{tenant, "0", 0, 0}
	}
	models := slices.Sorted(maps.Keys(q.PerModel))
	out := make([]any, 0, 4+2*len(models))
	out = append(out, tenant, "1", q.MaxGPUs*MilliPerGPU, len(models))
	for _, m := range models {
		out = append(out, m, q.PerModel[m]*MilliPerGPU)
	}
	return out
}

// luaUsage adds (sign 1) or takes away (sign -1) a decoded allocation's
// GPUs to or from its tenant's counters in the usage hash h; a counter
// that reaches 0 is deleted. Needs luaHelpers.
const luaUsage = `
local function usage(h, a, sign)
  local by, total = {}, 0
  local models = a.gpu_models or {}
  for k, g in ipairs(a.gpus) do
    total = total + g.milli
    local m = models[k]
    if type(m) == 'string' and m ~= '' then by[m] = (by[m] or 0) + g.milli end
  end
  local function add(f, d)
    if redis.call('HINCRBY', h, f, fmt(sign * d)) <= 0 then redis.call('HDEL', h, f) end
  end
  add(a.tenant, total)
  for m, d in pairs(by) do add(a.tenant .. ' ' .. m, d) end
end
`

// quotaOutcome is the QuotaError of a quota reply: the model (empty for
// the total), the limit, what is used and what is wanted, in milli-GPU.
func quotaOutcome(op string, p Placement, res []any) error {
	return fmt.Errorf("capacity: %s: %w", op, &QuotaError{Tenant: p.Tenant, Model: str(res[1]),
		Limit: num(res[2]) / MilliPerGPU, Used: num(res[3]), Want: num(res[4])})
}
