// Package quota keeps each tenant's quota: how many GPUs it may hold at
// once, in all and per GPU model. The quotas are data in a JetStream KV
// bucket (topology.QuotaBucket), one key per tenant, written by operators
// (`shizu quota set`) and read by every scheduler replica through a
// watching Cache. The scheduler hands the tenant's Limits to the capacity
// store with each reservation, and the store's reserve script checks them
// against the tenant's usage counters in the same atomic step that takes
// the GPUs (shared/capacity, quota.go), so replicas racing for one tenant
// can never take it past its quota.
package quota

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/gpumodel"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// Limits are one tenant's quota: at most MaxGPUs GPUs held at once, and of
// each model in MaxGPUsPerModel at most that many (whole GPUs; a fraction
// counts as its share: two half GPUs are one). A model the map does not
// name is bounded by MaxGPUs alone; 0 allows none. A tenant without
// Limits has no quota.
type Limits struct {
	MaxGPUs         int64            `json:"max_gpus"`
	MaxGPUsPerModel map[string]int64 `json:"max_gpus_per_model,omitempty"`
}

// Validate reports every problem with l, as an invalid-input error.
func (l Limits) Validate() error {
	var errs []error
	if l.MaxGPUs < 0 || l.MaxGPUs > capacity.MaxQuotaGPUs {
		errs = append(errs, fmt.Errorf("max_gpus: must be in 0..%d, got %d", int64(capacity.MaxQuotaGPUs), l.MaxGPUs))
	}
	for _, m := range slices.Sorted(maps.Keys(l.MaxGPUsPerModel)) {
		if _, ok := gpumodel.Lookup(m); !ok {
			errs = append(errs, fmt.Errorf("max_gpus_per_model: %q is not a GPU model Shizu knows (%s)", m, knownModels()))
			continue
		}
		if n := l.MaxGPUsPerModel[m]; n < 0 || n > capacity.MaxQuotaGPUs {
			errs = append(errs, fmt.Errorf("max_gpus_per_model: %s: must be in 0..%d, got %d", m, int64(capacity.MaxQuotaGPUs), n))
		} else if n > l.MaxGPUs {
			errs = append(errs, fmt.Errorf("max_gpus_per_model: %s: %d is more than max_gpus %d, which bounds every model", m, n, l.MaxGPUs))
		}
	}
	if len(errs) > 0 {
		// One line (errors.Join would print one per problem): every
		// problem, as the CLI prints it.
		msgs := make([]string, len(errs))
		for i, e := range errs {
			msgs[i] = e.Error()
		}
		return fault.Invalid("quota: %s", strings.Join(msgs, "; "))
	}
	return nil
}

func knownModels() string {
	var ts []string
	for _, m := range gpumodel.All() {
		ts = append(ts, m.Token)
	}
	return strings.Join(ts, ", ")
}

// Capacity is l as the capacity store checks it.
func (l Limits) Capacity() *capacity.Quota {
	return &capacity.Quota{MaxGPUs: l.MaxGPUs, PerModel: maps.Clone(l.MaxGPUsPerModel)}
}

// String is l in people's words, e.g. "at most 8 GPUs, of which at most 2
// H100-SXM5-80GB".
func (l Limits) String() string {
	s := fmt.Sprintf("at most %d GPUs", l.MaxGPUs)
	var per []string
	for _, m := range slices.Sorted(maps.Keys(l.MaxGPUsPerModel)) {
		per = append(per, fmt.Sprintf("%d %s", l.MaxGPUsPerModel[m], m))
	}
	if len(per) > 0 {
		s += ", of which at most " + strings.Join(per, ", ")
	}
	return s
}

// decode reads a stored quota, refusing fields it does not know.
func decode(data []byte) (Limits, error) {
	var l Limits
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		return Limits{}, fmt.Errorf("decode quota: %w", err)
	}
	return l, nil
}

// CheckTenant says what is wrong with a tenant id: it is a subject token
// (the second token of rental.<tenant>.…).
func CheckTenant(tenant string) error {
	if err := subject.Token(tenant); err != nil {
		return fault.Invalid("tenant %q: %w", tenant, err)
	}
	return nil
}

// key is the tenant's key in QUOTAS (subject.KeyToken: one to one, any
// tenant token a valid key); tenantOf reverses it.
func key(tenant string) string { return subject.KeyToken(tenant) }

func tenantOf(k string) (string, bool) { return subject.ParseKeyToken(k) }
