package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/rentalview"
)

// The views below are pure: they fold stored events (in stream order) into
// what the verbs print, and are tested with plain values.

// Rental states as the CLI shows them (the read model's).
const (
	stateRequested = rentalview.StateRequested
	statePending   = rentalview.StatePending
	stateRejected  = rentalview.StateRejected
	stateScheduled = rentalview.StateScheduled
	stateRunning   = rentalview.StateRunning
	stateStopping  = rentalview.StateStopping
	statePreempted = rentalview.StatePreempted
	stateMigrating = rentalview.StateMigrating
	stateStopped   = rentalview.StateStopped
)

// step is one line of a rental's timeline; segment one run on one node.
type (
	step    = rentalview.Step
	segment = rentalview.Segment
)

// rentalView is a rental as its events tell it: the read model's record,
// folded by rentalview.Apply, printed as the CLI always has.
type rentalView rentalview.Rental

// cliRental is what the CLI's JSON output shows of a rental.
type cliRental struct {
	ID       string    `json:"rental_id"`
	Tenant   string    `json:"tenant_id"`
	State    string    `json:"state"`
	Why      string    `json:"why,omitempty"`
	Node     string    `json:"node,omitempty"`
	GPUs     []int32   `json:"gpus,omitempty"`
	Model    string    `json:"model,omitempty"`
	Plan     string    `json:"plan,omitempty"`
	Shape    string    `json:"shape,omitempty"`
	Attempt  int32     `json:"attempt,omitempty"`
	Since    time.Time `json:"since"`
	Segments []segment `json:"segments,omitempty"`
	Timeline []step    `json:"timeline"`
}

// MarshalJSON keeps the CLI's JSON as it was before the read model added
// fields.
func (r rentalView) MarshalJSON() ([]byte, error) {
	return json.Marshal(cliRental{ID: r.ID, Tenant: r.Tenant, State: r.State, Why: r.Why, Node: r.Node, GPUs: r.GPUs,
		Model: r.Model, Plan: r.Plan, Shape: r.Shape, Attempt: r.Attempt, Since: r.Since, Segments: r.Segments, Timeline: r.Timeline})
}

func milliString(m int32) string {
	s := fmt.Sprintf("%d.%03d", m/1000, m%1000)
	return strings.TrimRight(strings.TrimRight(s, "0"), ".")
}

func planName(p shizuv1.Plan) string { return rentalview.PlanName(p) }

func ts(t *timestamppb.Timestamp) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.AsTime().UTC()
}

func joinInts(xs []int32) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprint(x)
	}
	return strings.Join(parts, ",")
}

// charge is what one rental has been billed so far.
type charge struct {
	Rental string `json:"rental_id"`
	Plan   string `json:"plan"`
	Model  string `json:"model"`
	// Models are every model billed, in order, when there was more than
	// one (a migration that changed the model).
	Models   []string `json:"models,omitempty"`
	Seconds  int64    `json:"seconds"`
	Records  int      `json:"records"`
	Micros   int64    `json:"amount_micros"`
	Currency string   `json:"currency"`
	Through  string   `json:"billed_through"`
}

// billedOn notes a record's model; a second model lists them all.
func (c *charge) billedOn(model string) {
	if model == "" || model == c.Model && len(c.Models) == 0 || slices.Contains(c.Models, model) {
		return
	}
	if len(c.Models) == 0 {
		c.Models = []string{c.Model}
	}
	c.Models = append(c.Models, model)
}

// modelColumn is the model, or the models in order when it changed.
func (c charge) modelColumn() string {
	if len(c.Models) > 1 {
		return strings.Join(c.Models, "→")
	}
	return c.Model
}

// invoiceView is a closed invoice.
type invoiceView struct {
	ID       string    `json:"invoice_id"`
	From     time.Time `json:"period_start"`
	To       time.Time `json:"period_end"`
	Micros   int64     `json:"total_micros"`
	Currency string    `json:"currency"`
}

// billView is a tenant's current charges and invoices.
type billView struct {
	Tenant   string        `json:"tenant_id"`
	Charges  []charge      `json:"charges"`
	Total    int64         `json:"total_micros"`
	Currency string        `json:"currency"`
	Invoices []invoiceView `json:"invoices"`
}

// bill sums usage records (one amount per record id, first wins, as the
// stream and the aggregates keep them) per rental, and lists invoices.
func bill(tenant string, events []event) billView {
	v := billView{Tenant: tenant, Charges: []charge{}, Invoices: []invoiceView{}}
	byRental := map[string]*charge{}
	var order []string
	seen := map[string]bool{}
	for _, e := range events {
		switch m := e.Msg.(type) {
		case *shizuv1.UsageRecorded:
			if m.GetTenantId() != tenant || seen[m.GetMeta().GetEventId()] {
				continue
			}
			seen[m.GetMeta().GetEventId()] = true
			c := byRental[m.GetRentalId()]
			if c == nil {
				c = &charge{Rental: m.GetRentalId(), Plan: planName(m.GetPlan()), Model: m.GetModel(), Currency: m.GetAmount().GetCurrency()}
				byRental[m.GetRentalId()] = c
				order = append(order, m.GetRentalId())
			}
			c.billedOn(m.GetModel())
			c.Seconds += m.GetSeconds()
			c.Records++
			c.Micros += m.GetAmount().GetMicros()
			if end := ts(m.GetIntervalEnd()).Format(time.RFC3339); end > c.Through {
				c.Through = end
			}
			v.Total += m.GetAmount().GetMicros()
			v.Currency = m.GetAmount().GetCurrency()
		case *shizuv1.InvoiceClosed:
			if m.GetTenantId() != tenant {
				continue
			}
			v.Invoices = append(v.Invoices, invoiceView{ID: m.GetInvoiceId(), From: ts(m.GetPeriodStart()), To: ts(m.GetPeriodEnd()),
				Micros: m.GetTotal().GetMicros(), Currency: m.GetTotal().GetCurrency()})
		}
	}
	sort.Strings(order)
	for _, id := range order {
		v.Charges = append(v.Charges, *byRental[id])
	}
	return v
}

// money prints micros as a decimal amount: 1234567 USD -> "1.234567 USD".
func money(micros int64, currency string) string {
	sign := ""
	if micros < 0 {
		sign, micros = "-", -micros
	}
	return fmt.Sprintf("%s%d.%06d %s", sign, micros/1_000_000, micros%1_000_000, currency)
}
