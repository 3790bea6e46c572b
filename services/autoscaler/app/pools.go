package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/autoscaler/policy"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// RuleWithdrawn names the decision that cancels a withdrawn pool's
// replicas.
const RuleWithdrawn = "pool-withdrawn"

// declaredPool is a pool declared through the bus, as kept in Redis (hash
// <prefix>:autoscaler:pools, pool id -> JSON): its policy as declared, or
// a tombstone once withdrawn. Seq is the SCALING stream sequence of the
// declaration, so an older one arriving late changes nothing.
type declaredPool struct {
	Seq       uint64          `json:"seq"`
	Tenant    string          `json:"tenant"`
	Policy    json.RawMessage `json:"policy,omitempty"`
	Withdrawn bool            `json:"withdrawn,omitempty"`
}

// poolStore keeps the pools declared through the bus in Redis, where every
// replica (and a restarted one) reads them.
type poolStore struct {
	rdb    *redis.Client
	prefix string
}

func (s poolStore) key() string { return s.prefix + ":autoscaler:pools" }

// putPoolScript writes ARGV[3] (a declaredPool) for pool ARGV[1] unless the
// stored one comes from a later stream sequence (returns 0: stale) or
// belongs, not withdrawn, to another tenant than ARGV[4] (returns -1 and
// the owner). Returns 1 when stored (or already stored by this sequence).
var putPoolScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then
  local c = cjson.decode(cur)
  if tonumber(c.seq) > tonumber(ARGV[2]) then return {0, ''} end
  if not c.withdrawn and c.tenant ~= ARGV[4] then return {-1, c.tenant} end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return {1, ''}
`)

// errPoolOwned: the pool belongs to another tenant.
var errPoolOwned = errors.New("pool belongs to another tenant")

// put stores a declaration or withdrawal; stale reports a later one is
// stored already.
func (s poolStore) put(ctx context.Context, id string, d declaredPool) (stale bool, err error) {
	data, err := json.Marshal(d)
	if err != nil {
		return false, err
	}
	res, err := putPoolScript.Run(ctx, s.rdb, []string{s.key()}, id, d.Seq, data, d.Tenant).Slice()
	if err != nil {
		return false, fault.Unavailable("store pool %s: %w", id, err)
	}
	code, _ := res[0].(int64)
	switch code {
	case 0:
		return true, nil
	case -1:
		return false, fmt.Errorf("%w: pool %s is %v's", errPoolOwned, id, res[1])
	}
	return false, nil
}

// get returns a declared pool's policy; ok is false when none is declared
// (or it was withdrawn).
func (s poolStore) get(ctx context.Context, id string) (policy.Pool, bool, error) {
	raw, err := s.rdb.HGet(ctx, s.key(), id).Bytes()
	if errors.Is(err, redis.Nil) {
		return policy.Pool{}, false, nil
	}
	if err != nil {
		return policy.Pool{}, false, fault.Unavailable("read pool %s: %w", id, err)
	}
	return decodeDeclared(id, raw)
}

// all returns the declared pools that are not withdrawn, sorted by id; a
// stored pool that cannot be read is left out and reported in the error.
func (s poolStore) all(ctx context.Context) ([]policy.Pool, error) {
	raw, err := s.rdb.HGetAll(ctx, s.key()).Result()
	if err != nil {
		return nil, fault.Unavailable("read declared pools: %w", err)
	}
	var out []policy.Pool
	var errs []error
	for id, data := range raw {
		p, ok, err := decodeDeclared(id, []byte(data))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if ok {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b policy.Pool) int { return strings.Compare(a.ID, b.ID) })
	return out, errors.Join(errs...)
}

func decodeDeclared(id string, raw []byte) (policy.Pool, bool, error) {
	var d declaredPool
	if err := json.Unmarshal(raw, &d); err != nil {
		return policy.Pool{}, false, fmt.Errorf("declared pool %s: %w", id, err)
	}
	if d.Withdrawn {
		return policy.Pool{}, false, nil
	}
	p, err := policy.ParsePool(d.Policy)
	if err != nil {
		// Validated before it was stored: the rules changed since.
		return policy.Pool{}, false, fmt.Errorf("declared pool %s no longer validates:\n%w", id, err)
	}
	return p, true, nil
}

// pool finds the policy of a pool: the policy file's, else one declared
// through the bus.
func (s *scaler) pool(ctx context.Context, id string) (policy.Pool, bool, error) {
	if p, ok := s.pools[id]; ok {
		return p, true, nil
	}
	return s.declared.get(ctx, id)
}

// allPools are the policy file's pools and those declared through the bus;
// with an error, those that could be read.
func (s *scaler) allPools(ctx context.Context) ([]policy.Pool, error) {
	declared, err := s.declared.all(ctx)
	out := slices.Clone(s.file.Pools)
	for _, p := range declared {
		if _, inFile := s.pools[p.ID]; !inFile {
			out = append(out, p)
		}
	}
	return out, err
}

// onPoolDeclared stores a pool declared (or replaced, or withdrawn)
// through the bus. A declaration that does not pass the policy file's
// rules, names a pool of the policy file, or takes another tenant's pool
// is dead-lettered with the reason and changes nothing.
func (s *scaler) onPoolDeclared(ctx context.Context, ev *shizuv1.PoolDeclared, d bus.Delivery) error {
	if !s.ready.Load() {
		return errStateLost
	}
	id, tenant := ev.GetPoolId(), ev.GetTenantId()
	rec, err := s.declaration(ev, d.Subject, d.StreamSeq)
	if err != nil {
		return err
	}
	stale, err := s.declared.put(ctx, id, rec)
	if errors.Is(err, errPoolOwned) {
		return fault.Invalid("%w; a pool keeps the tenant it was declared for until it is withdrawn", err)
	}
	if err != nil {
		return err
	}
	if stale {
		s.log.InfoContext(ctx, "pool declaration older than the one stored; ignored", "pool", id, "seq", d.StreamSeq)
		return nil
	}
	if !rec.Withdrawn {
		if err := s.redeclare(ctx, id, d.StreamSeq); err != nil {
			return err
		}
		s.log.InfoContext(ctx, "pool declared", "pool", id, "tenant", tenant)
		return nil
	}
	return s.withdraw(ctx, id, tenant, ev.GetMeta().GetEventId(), d.StreamSeq)
}

// declaration is the record a pool declaration stores, checked as
// onPoolDeclared checks it (invalid input when it is not a pool this
// autoscaler may scale); seq is its SCALING stream sequence.
func (s *scaler) declaration(ev *shizuv1.PoolDeclared, subj string, seq uint64) (declaredPool, error) {
	id, tenant := ev.GetPoolId(), ev.GetTenantId()
	if want, _ := subject.Format(subject.ScalePoolDeclared, id); subj != "" && subj != want {
		return declaredPool{}, fault.Invalid("pool %s declared on %s; want %s", id, subj, want)
	}
	if _, inFile := s.pools[id]; inFile {
		return declaredPool{}, fault.Invalid("pool %s is declared in the policy file, which wins; change it there", id)
	}
	rec := declaredPool{Seq: seq, Tenant: tenant, Withdrawn: ev.GetWithdrawn()}
	if rec.Withdrawn {
		return rec, nil
	}
	p, err := policy.ParsePool(ev.GetPolicyJson())
	if err != nil {
		return declaredPool{}, fault.Invalid("pool %s policy:\n%w", id, err)
	}
	var problems []string
	if p.ID != id {
		problems = append(problems, fmt.Sprintf("id: %q differs from the declaration's pool_id %q", p.ID, id))
	}
	if p.Tenant != tenant {
		problems = append(problems, fmt.Sprintf("tenant: %q differs from the declaration's tenant_id %q", p.Tenant, tenant))
	}
	if len(problems) > 0 {
		return declaredPool{}, fault.Invalid("pool %s policy:\n%s", id, strings.Join(problems, "\n"))
	}
	rec.Policy = json.RawMessage(ev.GetPolicyJson())
	return rec, nil
}

// redeclare clears the withdrawal of a pool declared again by the
// declaration at stream sequence seq, so samples and ticks scale it.
func (s *scaler) redeclare(ctx context.Context, id string, seq uint64) error {
	return s.states.update(ctx, id, func(rec *poolRecord) error {
		if !rec.Withdrawn || rec.DeclSeq > seq {
			return errNoChange
		}
		rec.Withdrawn, rec.DeclSeq = false, seq
		return nil
	})
}

// withdraw cancels every replica of a withdrawn pool, newest first, and
// marks the pool's record withdrawn, so a sample or tick that read the
// policy before changes nothing. The record keeps its rental sequence, so
// a pool declared again later never reuses a rental id. seq is the stream
// sequence of the withdrawal: a later declaration that already cleared the
// mark keeps it cleared.
func (s *scaler) withdraw(ctx context.Context, id, tenant, cause string, seq uint64) error {
	pool := policy.Pool{ID: id, Tenant: tenant}
	return s.change(ctx, id, func(rec *poolRecord) error {
		if rec.DeclSeq > seq || (rec.Withdrawn && len(rec.Rentals) == 0 && rec.State == (policy.State{})) {
			return errNoChange
		}
		d := policy.Decision{Pool: id, From: len(rec.Rentals), To: 0, Rule: RuleWithdrawn, Reason: "pool withdrawn",
			Market: policy.OnDemand, MarketRule: policy.RuleMarketDefault}
		if err := s.apply(ctx, pool, rec, d, "scale:"+id+":withdrawn:"+cause, cause); err != nil {
			return err
		}
		rec.State = policy.State{}
		rec.Withdrawn, rec.DeclSeq = true, seq
		return nil
	})
}
