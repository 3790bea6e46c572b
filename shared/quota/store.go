package quota

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Store reads and writes the quotas bucket.
type Store struct {
	kv jetstream.KeyValue
}

// Ensure creates the bucket (or opens it, unchanged), as provisioning does.
func Ensure(ctx context.Context, js jetstream.JetStream, replicas int) (*Store, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: topology.QuotaBucket, Description: "per-tenant quotas: GPUs a tenant may hold, in all and per model",
		History: 5, Storage: jetstream.FileStorage, Replicas: max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("ensure bucket %s: %w", topology.QuotaBucket, err)
	}
	return &Store{kv: kv}, nil
}

// Open binds the existing bucket (for users that may read it but not
// create it).
func Open(ctx context.Context, js jetstream.JetStream) (*Store, error) {
	kv, err := js.KeyValue(ctx, topology.QuotaBucket)
	if err != nil {
		return nil, fmt.Errorf("open bucket %s (run shizu provision): %w", topology.QuotaBucket, err)
	}
	return &Store{kv: kv}, nil
}

// Get returns the tenant's quota; ok is false when it has none.
func (s *Store) Get(ctx context.Context, tenant string) (l Limits, ok bool, err error) {
	if err := CheckTenant(tenant); err != nil {
		return Limits{}, false, err
	}
	e, err := s.kv.Get(ctx, key(tenant))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Limits{}, false, nil
	}
	if err != nil {
		return Limits{}, false, fault.Unavailable("read the quota of %s: %w", tenant, err)
	}
	l, err = decode(e.Value())
	if err != nil {
		return Limits{}, false, fmt.Errorf("read the quota of %s: %w", tenant, err)
	}
	return l, true, nil
}

// Put sets the tenant's quota; invalid limits change nothing.
func (s *Store) Put(ctx context.Context, tenant string, l Limits) error {
	if err := CheckTenant(tenant); err != nil {
		return err
	}
	if err := l.Validate(); err != nil {
		return err
	}
	data, err := json.Marshal(l)
	if err != nil {
		return err
	}
	if _, err := s.kv.Put(ctx, key(tenant), data); err != nil {
		return fault.Unavailable("write the quota of %s: %w", tenant, err)
	}
	return nil
}

// Delete removes the tenant's quota (it then has none); deleting one that
// is not there is no error.
func (s *Store) Delete(ctx context.Context, tenant string) error {
	if err := CheckTenant(tenant); err != nil {
		return err
	}
	if err := s.kv.Delete(ctx, key(tenant)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fault.Unavailable("delete the quota of %s: %w", tenant, err)
	}
	return nil
}

// Cache is every tenant's quota, kept current by a watch of the bucket:
// what each scheduler replica reads before it reserves. A change is seen
// within the watch's delivery time (milliseconds); a reservation made
// before it was seen was checked against the quota then in force.
type Cache struct {
	mu     sync.RWMutex
	limits map[string]Limits
	ready  chan struct{}
	done   chan struct{}
	w      jetstream.KeyWatcher
	cancel func()
}

// Watch starts a Cache and returns once it holds every quota stored now.
// A stored value that does not decode is logged and left out (the
// tenant has no quota until a valid one is written). Stop ends the watch.
func (s *Store) Watch(ctx context.Context, log *slog.Logger) (*Cache, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w, err := s.kv.WatchAll(wctx)
	if err != nil {
		cancel()
		return nil, fault.Unavailable("watch bucket %s: %w", topology.QuotaBucket, err)
	}
	c := &Cache{limits: map[string]Limits{}, ready: make(chan struct{}), done: make(chan struct{}), w: w, cancel: cancel}
	go c.follow(log)
	select {
	case <-c.ready:
		return c, nil
	case <-ctx.Done():
		c.Stop()
		return nil, ctx.Err()
	}
}

func (c *Cache) follow(log *slog.Logger) {
	defer close(c.done)
	initial := true
	for e := range c.w.Updates() {
		if e == nil {
			if initial {
				initial = false
				close(c.ready)
			}
			continue
		}
		tenant, ok := tenantOf(e.Key())
		if !ok {
			log.Warn("quota key is not a tenant's", "key", e.Key())
			continue
		}
		var l Limits
		var err error
		put := e.Operation() == jetstream.KeyValuePut
		if put {
			if l, err = decode(e.Value()); err == nil {
				err = l.Validate()
			}
			if err != nil {
				log.Error("quota does not decode; the tenant has none until it is written again", "tenant", tenant, "err", err)
				put = false
			}
		}
		c.mu.Lock()
		if put {
			c.limits[tenant] = l
		} else {
			delete(c.limits, tenant)
		}
		c.mu.Unlock()
	}
}

// Limits returns the tenant's quota; ok is false when it has none.
func (c *Cache) Limits(tenant string) (Limits, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	l, ok := c.limits[tenant]
	return l, ok
}

// Quota is the tenant's quota as the capacity store checks it; nil when
// the tenant has none. A nil Cache has none for anyone.
func (c *Cache) Quota(tenant string) *capacity.Quota {
	if c == nil {
		return nil
	}
	l, ok := c.Limits(tenant)
	if !ok {
		return nil
	}
	return l.Capacity()
}

// Stop ends the watch and waits for it.
func (c *Cache) Stop() {
	_ = c.w.Stop() // closes the updates
	c.cancel()
	<-c.done
}
