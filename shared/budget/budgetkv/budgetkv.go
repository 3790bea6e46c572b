// Package budgetkv keeps the budget states (budget.State) in the BUDGETS
// JetStream KV bucket, one key per tenant: metering writes them (Ensure,
// Put, Delete), every scheduler replica watches them (Open, Watch). The
// bucket is JetStream's, so a state survives restarts of either service
// and the loss of Redis, and every replica sees the same one.
package budgetkv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shizu-gpu/shizu/shared/budget"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Store is the BUDGETS bucket.
type Store struct {
	kv jetstream.KeyValue
}

// Ensure creates the bucket (or updates it to this declaration) with
// replicas copies: metering's, the bucket's only writer.
func Ensure(ctx context.Context, js jetstream.JetStream, replicas int) (*Store, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      topology.BudgetsBucket,
		Description: "budgets exhausted this month under a policy that stops (reject-new, stop-running), by tenant; written by metering",
		History:     1, Storage: jetstream.FileStorage, Replicas: max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("ensure bucket %s: %w", topology.BudgetsBucket, err)
	}
	return &Store{kv: kv}, nil
}

// ErrNoBucket is Open's answer while nobody created the bucket yet.
var ErrNoBucket = errors.New("the " + topology.BudgetsBucket + " bucket does not exist yet (metering creates it)")

// Open binds the existing bucket (for readers).
func Open(ctx context.Context, js jetstream.JetStream) (*Store, error) {
	kv, err := js.KeyValue(ctx, topology.BudgetsBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, ErrNoBucket
	}
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", topology.BudgetsBucket, err)
	}
	return &Store{kv: kv}, nil
}

// Key is the tenant's key (subject.KeyToken: its bytes outside
// [A-Za-z0-9_-] escaped as =XX, so every valid tenant token is a valid key
// and two tenants never share one).
func Key(tenant string) string { return subject.KeyToken(tenant) }

// Get is the tenant's state; false when it has none.
func (s *Store) Get(ctx context.Context, tenant string) (budget.State, bool, error) {
	st, _, ok, err := s.get(ctx, tenant)
	return st, ok, err
}

func (s *Store) get(ctx context.Context, tenant string) (budget.State, uint64, bool, error) {
	e, err := s.kv.Get(ctx, Key(tenant))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return budget.State{}, 0, false, nil
	}
	if err != nil {
		return budget.State{}, 0, false, fmt.Errorf("read budget state of %s: %w", tenant, err)
	}
	st, err := decode(e.Value())
	if err != nil {
		// Overwritten by the next Put.
		return budget.State{}, e.Revision(), false, nil
	}
	return st, e.Revision(), true, nil
}

// Put writes st. A state already there for the same month, budget and
// limit keeps its ExhaustedAt (the first time the spend was seen there),
// so a redelivered crossing or a second replica does not move the stop.
// It returns the state stored.
func (s *Store) Put(ctx context.Context, st budget.State) (budget.State, error) {
	if err := st.Validate(); err != nil {
		return budget.State{}, err
	}
	st.ExhaustedAt = st.ExhaustedAt.UTC().Round(0)
	for range 5 {
		old, rev, ok, err := s.get(ctx, st.Tenant)
		if err != nil {
			return budget.State{}, err
		}
		if ok && old.Month == st.Month && old.Budget == st.Budget && old.LimitMicros == st.LimitMicros && old.ExhaustedAt.Before(st.ExhaustedAt) {
			st.ExhaustedAt = old.ExhaustedAt
			st.SpentMicros = max(st.SpentMicros, old.SpentMicros)
		}
		if ok && old == st {
			return st, nil
		}
		raw, err := json.Marshal(st)
		if err != nil {
			return budget.State{}, fmt.Errorf("encode budget state of %s: %w", st.Tenant, err)
		}
		if rev == 0 {
			_, err = s.kv.Create(ctx, Key(st.Tenant), raw)
		} else {
			_, err = s.kv.Update(ctx, Key(st.Tenant), raw, rev)
		}
		if errors.Is(err, jetstream.ErrKeyExists) || isWrongSequence(err) {
			continue // written meanwhile: merge with that one
		}
		if err != nil {
			return budget.State{}, fmt.Errorf("write budget state of %s: %w", st.Tenant, err)
		}
		return st, nil
	}
	return budget.State{}, fmt.Errorf("write budget state of %s: the key kept changing", st.Tenant)
}

func isWrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// Delete lifts the tenant's state (a raised or removed budget).
func (s *Store) Delete(ctx context.Context, tenant string) error {
	if err := s.kv.Delete(ctx, Key(tenant)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("delete budget state of %s: %w", tenant, err)
	}
	return nil
}

// All lists every state in the bucket (those that do not decode left out).
func (s *Store) All(ctx context.Context) ([]budget.State, error) {
	lister, err := s.kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("list budget states: %w", err)
	}
	defer func() { _ = lister.Stop() }()
	var out []budget.State
	for k := range lister.Keys() {
		e, err := s.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read budget state %s: %w", k, err)
		}
		if st, err := decode(e.Value()); err == nil {
			out = append(out, st)
		}
	}
	return out, nil
}

// Change is one update of the bucket: a state written, or a tenant's
// state lifted (Lifted, with only Tenant's key known: Key).
type Change struct {
	Key    string
	State  budget.State
	Lifted bool
}

// Watch sends every state in the bucket, then nil once they are all sent,
// then each change, until ctx ends (the channel is closed then, or when
// the watch fails). A value that does not decode is sent as lifted: it
// blocks nobody.
func (s *Store) Watch(ctx context.Context) (<-chan *Change, error) {
	w, err := s.kv.WatchAll(ctx)
	if err != nil {
		return nil, fmt.Errorf("watch budget states: %w", err)
	}
	out := make(chan *Change, 16)
	go func() {
		defer close(out)
		defer func() { _ = w.Stop() }()
		for {
			var e jetstream.KeyValueEntry
			select {
			case <-ctx.Done():
				return
			case got, ok := <-w.Updates():
				if !ok {
					return
				}
				e = got
			}
			var c *Change
			if e != nil {
				c = &Change{Key: e.Key(), Lifted: true}
				if e.Operation() == jetstream.KeyValuePut {
					if st, err := decode(e.Value()); err == nil && Key(st.Tenant) == e.Key() {
						c.State, c.Lifted = st, false
					}
				}
			}
			select {
			case out <- c:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

func decode(raw []byte) (budget.State, error) {
	var st budget.State
	if err := json.Unmarshal(raw, &st); err != nil {
		return budget.State{}, fmt.Errorf("decode budget state: %w", err)
	}
	return st, st.Validate()
}
