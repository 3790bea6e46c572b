package identity

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// ErrUnauthenticated is Authenticate's only answer to a key that is not
// a live key: malformed, unknown, revoked, or of a wrong secret alike.
var ErrUnauthenticated = errors.New("the API key is not valid")

// Directory reads and writes the IDENTITY bucket; after Watch it also
// keeps every key in memory, current within milliseconds of a change.
type Directory struct {
	kv  jetstream.KeyValue
	now func() time.Time

	mu       sync.RWMutex
	keys     map[string]Key
	watching bool
}

// Open binds the IDENTITY bucket (provisioned by topology.Buckets).
func Open(ctx context.Context, js jetstream.JetStream) (*Directory, error) {
	kv, err := js.KeyValue(ctx, topology.IdentityBucket)
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", topology.IdentityBucket, err)
	}
	return &Directory{kv: kv, now: time.Now}, nil
}

func tenantKey(id string) string { return "tenant." + id }
func keyKey(id string) string    { return "key." + id }

// CreateTenant records a new tenant; an id already taken is a conflict.
func (d *Directory) CreateTenant(ctx context.Context, id, name string) (Tenant, error) {
	if err := CheckTenantID(id); err != nil {
		return Tenant{}, err
	}
	name = strings.TrimSpace(name)
	if name == "" {
		name = id
	}
	if len(name) > maxNameLen {
		return Tenant{}, fault.Invalid("tenant name: %d bytes; at most %d", len(name), maxNameLen)
	}
	t := Tenant{ID: id, Name: name, CreatedAt: d.now().UTC().Truncate(time.Millisecond)}
	b, err := json.Marshal(t)
	if err != nil {
		return Tenant{}, fmt.Errorf("encode tenant: %w", err)
	}
	if _, err := d.kv.Create(ctx, tenantKey(id), b); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return Tenant{}, fault.Conflict("tenant %s exists already", id)
		}
		return Tenant{}, fmt.Errorf("create tenant %s: %w", id, err)
	}
	return t, nil
}

// GetTenant returns the tenant id.
func (d *Directory) GetTenant(ctx context.Context, id string) (Tenant, error) {
	if err := CheckTenantID(id); err != nil {
		return Tenant{}, err
	}
	var t Tenant
	if err := d.get(ctx, tenantKey(id), &t); err != nil {
		return Tenant{}, err
	}
	return t, nil
}

// ListTenants returns every tenant, by id.
func (d *Directory) ListTenants(ctx context.Context) ([]Tenant, error) {
	var out []Tenant
	err := d.each(ctx, "tenant.*", func(b []byte) error {
		var t Tenant
		if err := json.Unmarshal(b, &t); err != nil {
			return err
		}
		out = append(out, t)
		return nil
	})
	return out, err
}

// CreateKey makes a key for tenant (which must exist) with scope
// read-only or read-write, or, with scope operator and no tenant, an
// operator key. It returns the key and the whole secret key, which is
// never stored and cannot be shown again.
func (d *Directory) CreateKey(ctx context.Context, tenant string, scope Scope, name string) (Key, string, error) {
	if _, err := ParseScope(string(scope)); err != nil {
		return Key{}, "", err
	}
	switch {
	case scope == Operator && tenant != "":
		return Key{}, "", fault.Invalid("an operator key belongs to no tenant: leave the tenant out")
	case scope != Operator:
		if _, err := d.GetTenant(ctx, tenant); err != nil {
			return Key{}, "", fmt.Errorf("key for tenant %s: %w", tenant, err)
		}
	}
	if len(name) > maxNameLen {
		return Key{}, "", fault.Invalid("key name: %d bytes; at most %d", len(name), maxNameLen)
	}
	id, whole := newSecret()
	k := Key{ID: id, Tenant: tenant, Scope: scope, Name: strings.TrimSpace(name),
		CreatedAt: d.now().UTC().Truncate(time.Millisecond), SHA256: hashKey(whole)}
	b, err := json.Marshal(k)
	if err != nil {
		return Key{}, "", fmt.Errorf("encode key: %w", err)
	}
	if _, err := d.kv.Create(ctx, keyKey(id), b); err != nil {
		return Key{}, "", fmt.Errorf("create key: %w", err)
	}
	d.store(k)
	return k, whole, nil
}

// ListKeys returns the keys of tenant ("" for every key, OperatorTenant
// for the operator keys), by id.
func (d *Directory) ListKeys(ctx context.Context, tenant string) ([]Key, error) {
	var out []Key
	err := d.each(ctx, "key.*", func(b []byte) error {
		var k Key
		if err := json.Unmarshal(b, &k); err != nil {
			return err
		}
		owner := k.Tenant
		if k.Scope == Operator {
			owner = OperatorTenant
		}
		if tenant == "" || owner == tenant {
			out = append(out, k)
		}
		return nil
	})
	return out, err
}

// RevokeKey marks the key revoked (again: unchanged) and returns it.
func (d *Directory) RevokeKey(ctx context.Context, id string) (Key, error) {
	if len(id) != keyIDLen || !isHex(id) {
		return Key{}, fault.Invalid("key id %q: want the %d hex characters after shz_", truncate(id), keyIDLen)
	}
	for {
		e, err := d.kv.Get(ctx, keyKey(id))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return Key{}, fault.NotFound("no key %s", id)
		}
		if err != nil {
			return Key{}, fmt.Errorf("read key %s: %w", id, err)
		}
		var k Key
		if err := json.Unmarshal(e.Value(), &k); err != nil {
			return Key{}, fmt.Errorf("decode key %s: %w", id, err)
		}
		if k.Revoked() {
			return k, nil
		}
		at := d.now().UTC().Truncate(time.Millisecond)
		k.RevokedAt = &at
		b, err := json.Marshal(k)
		if err != nil {
			return Key{}, fmt.Errorf("encode key: %w", err)
		}
		_, err = d.kv.Update(ctx, keyKey(id), b, e.Revision())
		if err == nil {
			d.store(k)
			return k, nil
		}
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
			return Key{}, fmt.Errorf("revoke key %s: %w", id, err)
		}
	}
}

// Authenticate returns the live key whole is; ErrUnauthenticated when it
// is none. After Watch it answers from memory.
func (d *Directory) Authenticate(ctx context.Context, whole string) (Key, error) {
	id, ok := splitKey(whole)
	if !ok {
		return Key{}, ErrUnauthenticated
	}
	d.mu.RLock()
	k, found := d.keys[id]
	watching := d.watching
	d.mu.RUnlock()
	if !watching {
		if err := d.get(ctx, keyKey(id), &k); err != nil {
			if fault.IsNotFound(err) {
				return Key{}, ErrUnauthenticated
			}
			return Key{}, err
		}
		found = true
	}
	if !found || k.Revoked() || !k.matches(whole) {
		return Key{}, ErrUnauthenticated
	}
	return k, nil
}

// Watch loads every key into memory and keeps it current until ctx ends
// (Authenticate reads the bucket again after that).
func (d *Directory) Watch(ctx context.Context) error {
	w, err := d.kv.Watch(ctx, "key.*")
	if err != nil {
		return fmt.Errorf("watch keys: %w", err)
	}
	initial := map[string]Key{}
	for e := range w.Updates() {
		if e == nil {
			break // the end of the initial values
		}
		if k, ok := decodeKey(e); ok {
			initial[k.ID] = k
		}
	}
	d.mu.Lock()
	d.keys, d.watching = initial, true
	d.mu.Unlock()
	go d.follow(ctx, w)
	return nil
}

func (d *Directory) follow(ctx context.Context, w jetstream.KeyWatcher) {
	defer func() {
		_ = w.Stop()
		d.mu.Lock()
		d.watching = false
		d.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil {
				continue
			}
			if e.Operation() != jetstream.KeyValuePut {
				d.mu.Lock()
				delete(d.keys, strings.TrimPrefix(e.Key(), "key."))
				d.mu.Unlock()
				continue
			}
			if k, ok := decodeKey(e); ok {
				d.store(k)
			}
		}
	}
}

// store puts k into the cache (when watching); a revocation is never
// undone by an older value arriving later.
func (d *Directory) store(k Key) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.watching {
		return
	}
	if old, ok := d.keys[k.ID]; ok && old.Revoked() && !k.Revoked() {
		return
	}
	d.keys[k.ID] = k
}

func decodeKey(e jetstream.KeyValueEntry) (Key, bool) {
	if e.Operation() != jetstream.KeyValuePut {
		return Key{}, false
	}
	var k Key
	if err := json.Unmarshal(e.Value(), &k); err != nil || k.ID == "" {
		return Key{}, false
	}
	return k, true
}

func (d *Directory) get(ctx context.Context, key string, v any) error {
	e, err := d.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return fault.NotFound("no %s %s", strings.Split(key, ".")[0], strings.TrimPrefix(key, strings.Split(key, ".")[0]+"."))
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", key, err)
	}
	if err := json.Unmarshal(e.Value(), v); err != nil {
		return fmt.Errorf("decode %s: %w", key, err)
	}
	return nil
}

// each calls f with the value of every key matching filter, in key order.
func (d *Directory) each(ctx context.Context, filter string, f func([]byte) error) error {
	kl, err := d.kv.ListKeysFiltered(ctx, filter)
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return nil
		}
		return fmt.Errorf("list %s: %w", filter, err)
	}
	defer func() { _ = kl.Stop() }()
	set := map[string]bool{}
	for k := range kl.Keys() {
		set[k] = true
	}
	for _, k := range slices.Sorted(maps.Keys(set)) {
		e, err := d.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", k, err)
		}
		if err := f(e.Value()); err != nil {
			return fmt.Errorf("decode %s: %w", k, err)
		}
	}
	return nil
}
