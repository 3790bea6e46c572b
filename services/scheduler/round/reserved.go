package round

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Commitment is a tenant's reserved commitment as the accounts file
// (metering's -accounts, the same file) writes it: GPUCount GPUs of Model
// for a month or a year from Start. Metering bills a reserved second at
// the rate of the commitment in force for the tenant and the model it ran
// on, and at the list price when there is none; the scheduler admits a
// reserved request only when every model it allows has one.
type Commitment struct {
	TenantID string    `json:"tenant_id"`
	Model    string    `json:"model"`
	GPUCount int32     `json:"gpu_count"`
	Term     string    `json:"term"`
	Start    time.Time `json:"start"`
}

// Commitment terms.
const (
	TermMonth = "month"
	TermYear  = "year"
)

// End is when the commitment's term ends (exclusive).
func (c Commitment) End() time.Time {
	if c.Term == TermYear {
		return c.Start.AddDate(1, 0, 0)
	}
	return c.Start.AddDate(0, 1, 0)
}

// Commitments are every tenant's reserved commitments.
type Commitments []Commitment

// InForce reports whether tenant holds a commitment for model at t.
func (cs Commitments) InForce(tenant, model string, t time.Time) bool {
	return slices.ContainsFunc(cs, func(c Commitment) bool {
		return c.TenantID == tenant && c.Model == model && !t.Before(c.Start) && t.Before(c.End())
	})
}

// ParseAccounts reads the commitments of an accounts file
// ({"commitments": [...], "budgets": [...]}; the budgets are metering's).
// Every problem is named with its path.
func ParseAccounts(data []byte) (Commitments, error) {
	var acc struct {
		Commitments Commitments `json:"commitments"`
	}
	if err := json.Unmarshal(data, &acc); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	var errs []error
	for i, c := range acc.Commitments {
		add := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("commitments[%d]: "+format, append([]any{i}, args...)...))
		}
		if c.TenantID == "" || c.Model == "" {
			add("needs a tenant_id and a model")
		}
		if c.GPUCount < 1 {
			add("gpu_count: %d must be at least 1", c.GPUCount)
		}
		if c.Term != TermMonth && c.Term != TermYear {
			add("term: %q is not %s or %s", c.Term, TermMonth, TermYear)
		}
		if c.Start.IsZero() {
			add("start: missing")
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return acc.Commitments, nil
}
