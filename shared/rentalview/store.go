package rentalview

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Bucket is the KV bucket that holds one record per (tenant, rental),
// under the key "<tenant>.<rental>" (each escaped, see escape).
const Bucket = topology.RentalViewBucket

// ErrNotFound is Get's answer for a rental the tenant does not have.
var ErrNotFound = errors.New("rental not found")

// List's page sizes.
const (
	DefaultLimit = 100
	MaxLimit     = 1000
)

// Store reads (and the projector writes) the rental records.
type Store struct {
	kv jetstream.KeyValue
}

// Open binds the bucket, creating it when it does not exist.
func Open(ctx context.Context, js jetstream.JetStream) (*Store, error) {
	kv, err := js.KeyValue(ctx, Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: Bucket, Description: "rental read model, projected from RENTALS", History: 1, Storage: jetstream.FileStorage,
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, Bucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", Bucket, err)
	}
	return &Store{kv: kv}, nil
}

// Get returns the tenant's rental; ErrNotFound when the tenant has none
// by that id (another tenant's rental included).
func (s *Store) Get(ctx context.Context, tenant, rentalID string) (*Rental, error) {
	if err := checkTokens(tenant, rentalID); err != nil {
		return nil, fault.Invalid("get rental: %w", err)
	}
	r, _, err := s.load(ctx, key(tenant, rentalID))
	if err != nil {
		return nil, err
	}
	if r == nil || r.Tenant != tenant || r.ID != rentalID {
		return nil, ErrNotFound
	}
	return r, nil
}

// load reads the record under k and its revision; nil and 0 when absent.
func (s *Store) load(ctx context.Context, k string) (*Rental, uint64, error) {
	e, err := s.kv.Get(ctx, k)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read rental %s: %w", k, err)
	}
	r, err := decodeRecord(e.Value())
	if err != nil {
		return nil, 0, fmt.Errorf("read rental %s: %w", k, err)
	}
	return r, e.Revision(), nil
}

func decodeRecord(b []byte) (*Rental, error) {
	var r Rental
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("decode record: %w", err)
	}
	return &r, nil
}

// Filter narrows List: each non-empty field must match exactly, and every
// label given must be on the rental with that value.
type Filter struct {
	State, Plan, Model string
	Labels             map[string]string
}

func (f Filter) matches(r *Rental) bool {
	if f.State != "" && r.State != f.State || f.Plan != "" && r.Plan != f.Plan || f.Model != "" && r.Model != f.Model {
		return false
	}
	for k, v := range f.Labels {
		if got, ok := r.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// List returns up to limit (0: DefaultLimit; at most MaxLimit) of the
// tenant's rentals that match f, in rental id order (of the escaped ids),
// after cursor ("" for the first page), and the cursor of the next page,
// "" when there is none. A cursor List did not return is an error.
func (s *Store) List(ctx context.Context, tenant string, f Filter, cursor string, limit int) ([]*Rental, string, error) {
	if err := checkTokens(tenant, "x"); err != nil {
		return nil, "", fault.Invalid("list rentals: %w", err)
	}
	switch {
	case limit < 0 || limit > MaxLimit:
		return nil, "", fault.Invalid("list rentals: limit %d: want 0..%d", limit, MaxLimit)
	case limit == 0:
		limit = DefaultLimit
	}
	if cursor != "" {
		id, ok := unescape(cursor)
		if !ok || checkTokens(tenant, id) != nil {
			return nil, "", fault.Invalid("list rentals: bad cursor %q", cursor)
		}
	}
	keys, err := s.keys(ctx, escape(tenant)+".*")
	if err != nil {
		return nil, "", err
	}
	prefix := escape(tenant) + "."
	var out []*Rental
	for _, k := range keys {
		if strings.TrimPrefix(k, prefix) <= cursor {
			continue
		}
		r, _, err := s.load(ctx, k)
		if err != nil {
			return nil, "", err
		}
		if r == nil || r.Tenant != tenant || !f.matches(r) {
			continue
		}
		if len(out) == limit {
			return out, escape(out[len(out)-1].ID), nil
		}
		out = append(out, r)
	}
	return out, "", nil
}

// keys lists the bucket's keys matching filter, sorted.
func (s *Store) keys(ctx context.Context, filter string) ([]string, error) {
	kl, err := s.kv.ListKeysFiltered(ctx, filter)
	if err != nil {
		return nil, fmt.Errorf("list rentals: %w", err)
	}
	defer func() { _ = kl.Stop() }()
	set := map[string]bool{}
	for k := range kl.Keys() {
		set[k] = true
	}
	return slices.Sorted(maps.Keys(set)), nil
}

// Watch sends the tenant's rental as it is now (once it has been
// projected: a rental not yet in the bucket comes when it appears), then
// after each change, until ctx ends, when the channel is closed. A
// receiver that falls behind misses intermediate versions, never the
// latest.
func (s *Store) Watch(ctx context.Context, tenant, rentalID string) (<-chan *Rental, error) {
	if err := checkTokens(tenant, rentalID); err != nil {
		return nil, fault.Invalid("watch rental: %w", err)
	}
	w, err := s.kv.Watch(ctx, key(tenant, rentalID))
	if err != nil {
		return nil, fmt.Errorf("watch rental: %w", err)
	}
	out := make(chan *Rental, 1)
	go func() {
		defer close(out)
		defer func() { _ = w.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil || e.Operation() != jetstream.KeyValuePut {
					continue // the end of the initial values, or a purge
				}
				r, err := decodeRecord(e.Value())
				if err != nil || r.Tenant != tenant || r.ID != rentalID {
					continue
				}
				select {
				case out <- r:
				case <-out: // drop the stale one the receiver has not taken
					out <- r
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, nil
}

// Seed stores r, the record of a request the caller has just published
// at stream sequence r.Seq, unless the projector (or another caller) has
// written the rental already. The projector then skips that request (its
// sequence is not newer) and folds what follows, so a record seeded from
// the same event with Apply is what the projector would have written: a
// client that created a rental can read it at once (read-your-writes).
func (s *Store) Seed(ctx context.Context, r *Rental) error {
	if err := checkTokens(r.Tenant, r.ID); err != nil {
		return fault.Invalid("seed rental: %w", err)
	}
	if r.Seq == 0 {
		return fault.Invalid("seed rental %s: no stream sequence", r.ID)
	}
	return s.putNewer(ctx, key(r.Tenant, r.ID), r)
}
