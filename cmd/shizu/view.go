package main

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
)

// The views below are pure: they fold stored events (in stream order) into
// what the verbs print, and are tested with plain values.

// Rental states as the CLI shows them.
const (
	stateRequested = "requested"
	statePending   = "pending"
	stateRejected  = "rejected"
	stateScheduled = "scheduled"
	stateRunning   = "running"
	stateStopping  = "stopping"
	statePreempted = "preempted"
	stateMigrating = "migrating"
	stateStopped   = "stopped"
)

// step is one line of a rental's timeline.
type step struct {
	At     time.Time `json:"at"`
	Event  string    `json:"event"`
	Detail string    `json:"detail,omitempty"`
}

// segment is one run of a rental on one node (one attempt).
type segment struct {
	Attempt   int32      `json:"attempt"`
	Node      string     `json:"node"`
	StartedAt time.Time  `json:"started_at"`
	StoppedAt *time.Time `json:"stopped_at,omitempty"`
	Reason    string     `json:"exit_reason,omitempty"`
}

// rentalView is a rental as its events tell it.
type rentalView struct {
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

// shape says what a spec asks for, briefly: "2x NVLink", "0.25 GPU 20480MiB", "1g.10gb".
func shape(s *shizuv1.RentalSpec) string {
	if s == nil {
		return ""
	}
	var b strings.Builder
	switch {
	case s.GetMigProfile() != "":
		b.WriteString("MIG " + s.GetMigProfile())
	case s.GetMilliGpu() < 1000:
		fmt.Fprintf(&b, "%s GPU", milliString(s.GetMilliGpu()))
	default:
		fmt.Fprintf(&b, "%dx GPU", s.GetGpuCount())
	}
	if s.GetInterconnect() == shizuv1.Interconnect_INTERCONNECT_NVLINK {
		b.WriteString(" NVLink")
	}
	if s.GetVramMib() > 0 {
		fmt.Fprintf(&b, " %dMiB", s.GetVramMib())
	}
	if s.GetTeeRequired() {
		b.WriteString(" TEE")
	}
	return b.String()
}

func milliString(m int32) string {
	s := fmt.Sprintf("%d.%03d", m/1000, m%1000)
	return strings.TrimRight(strings.TrimRight(s, "0"), ".")
}

func planName(p shizuv1.Plan) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(p.String(), "PLAN_")), "_", "-")
}

func enumWord(s, prefix string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(s, prefix)), "_", " ")
}

func ts(t *timestamppb.Timestamp) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.AsTime().UTC()
}

// rentals folds rental events into one view per rental, in order of first
// appearance.
func rentals(events []event) []*rentalView {
	byID := map[string]*rentalView{}
	var order []*rentalView
	for _, e := range events {
		m, ok := e.Msg.(interface {
			GetRentalId() string
			GetTenantId() string
		})
		if !ok {
			continue
		}
		r := byID[m.GetRentalId()]
		if r == nil {
			if !foldsRental(e.Msg) {
				continue
			}
			r = &rentalView{ID: m.GetRentalId(), Tenant: m.GetTenantId(), State: stateRequested}
			byID[r.ID] = r
			order = append(order, r)
		}
		r.apply(e.Msg, ts(metaOf(e.Msg).GetOccurredAt()))
	}
	return order
}

// foldsRental says whether m is a rental event the view folds.
func foldsRental(m any) bool {
	switch m.(type) {
	case *shizuv1.RentalRequested, *shizuv1.RentalPending, *shizuv1.RentalRejected, *shizuv1.RentalScheduled,
		*shizuv1.RentalStarted, *shizuv1.RentalCancelRequested, *shizuv1.RentalPreempted, *shizuv1.RentalMigrating,
		*shizuv1.RentalMigrated, *shizuv1.RentalStopped:
		return true
	}
	return false
}

// apply folds one event of the rental, which occurred at at.
func (r *rentalView) apply(msg any, at time.Time) {
	switch m := msg.(type) {
	case *shizuv1.RentalRequested:
		r.Plan, r.Shape, r.Since = planName(m.GetSpec().GetPlan()), shape(m.GetSpec()), at
		r.add(at, "requested", r.Shape+", "+r.Plan)
	case *shizuv1.RentalPending:
		why := withMessage(enumWord(m.GetReason().String(), "PENDING_REASON_"), m.GetMessage())
		if r.State == stateRequested || r.State == statePending || r.State == stateMigrating {
			r.setState(statePending, why, at)
		}
		r.add(at, "pending", why)
	case *shizuv1.RentalRejected:
		why := withMessage(enumWord(m.GetReason().String(), "REJECT_REASON_"), m.GetMessage())
		r.setState(stateRejected, why, at)
		r.add(at, "rejected", why)
	case *shizuv1.RentalScheduled:
		r.scheduled(m, at)
	case *shizuv1.RentalStarted:
		r.Segments = append(r.Segments, segment{Attempt: m.GetAttempt(), Node: m.GetNodeId(), StartedAt: ts(m.GetStartedAt())})
		if m.GetAttempt() == r.Attempt && r.State != stateStopped {
			r.setState(stateRunning, "", at)
		}
		r.add(ts(m.GetStartedAt()), "started", fmt.Sprintf("on %s, attempt %d", m.GetNodeId(), m.GetAttempt()))
	case *shizuv1.RentalCancelRequested:
		if r.State != stateStopped && r.State != stateRejected {
			r.setState(stateStopping, "cancel requested", at)
		}
		r.add(at, "cancel requested", "by "+m.GetRequestedBy())
	case *shizuv1.RentalPreempted:
		why := enumWord(m.GetReason().String(), "PREEMPT_REASON_")
		if r.State != stateStopped {
			r.setState(statePreempted, why, at)
		}
		r.add(at, "preempted", fmt.Sprintf("on %s: %s", m.GetNodeId(), why))
	case *shizuv1.RentalMigrating:
		why := enumWord(m.GetReason().String(), "MIGRATION_REASON_")
		if r.State != stateStopped {
			r.setState(stateMigrating, "from "+m.GetFromNodeId()+": "+why, at)
		}
		r.add(at, "migrating", fmt.Sprintf("from %s: %s", m.GetFromNodeId(), why))
	case *shizuv1.RentalMigrated:
		if r.State == stateMigrating || r.State == stateScheduled {
			r.setState(stateRunning, "", at)
		}
		r.add(at, "migrated", fmt.Sprintf("%s -> %s, down %s", m.GetFromNodeId(), m.GetToNodeId(), m.GetDowntime().AsDuration().Round(time.Millisecond)))
	case *shizuv1.RentalStopped:
		r.stopped(m, at)
	}
}

// withMessage appends ": msg" to why when msg is not empty.
func withMessage(why, msg string) string {
	if msg == "" {
		return why
	}
	return why + ": " + msg
}

// scheduled folds a placement; one of an earlier attempt is stale.
func (r *rentalView) scheduled(m *shizuv1.RentalScheduled, at time.Time) {
	if m.GetAttempt() < r.Attempt {
		return
	}
	prevModel := r.Model
	r.Attempt, r.Node, r.Model = m.GetAttempt(), m.GetNodeId(), m.GetGpuModel()
	r.GPUs = r.GPUs[:0]
	for _, g := range m.GetGpus() {
		r.GPUs = append(r.GPUs, g.GetGpuIndex())
	}
	if r.Plan == "" {
		r.Plan, r.Shape = planName(m.GetSpec().GetPlan()), shape(m.GetSpec())
	}
	r.setState(stateScheduled, "", at)
	detail := fmt.Sprintf("on %s GPU %s (%s), attempt %d", m.GetNodeId(), joinInts(r.GPUs), m.GetGpuModel(), m.GetAttempt())
	if prevModel != "" && prevModel != r.Model {
		detail += "; model changed from " + prevModel // a move onto another model
	}
	r.add(at, "scheduled", detail)
}

// stopped folds the end of a run: it closes the attempt's segment, and
// ends the rental unless an earlier placement ended or the run stopped to
// move.
func (r *rentalView) stopped(m *shizuv1.RentalStopped, at time.Time) {
	reason := enumWord(m.GetExitReason().String(), "EXIT_REASON_")
	stopped := ts(m.GetStoppedAt())
	for i := range r.Segments {
		if s := &r.Segments[i]; s.Attempt == m.GetAttempt() && s.StoppedAt == nil {
			s.StoppedAt, s.Reason = &stopped, reason
		}
	}
	detail := fmt.Sprintf("on %s, attempt %d: %s", m.GetNodeId(), m.GetAttempt(), reason)
	if m.GetMessage() != "" {
		detail += " (" + m.GetMessage() + ")"
	}
	r.add(stopped, "stopped", detail)
	if m.GetAttempt() < r.Attempt || r.State == stateMigrating {
		return // an earlier placement ended; the rental lives on
	}
	why := withMessage(reason, m.GetMessage())
	switch m.GetExitReason() {
	case shizuv1.ExitReason_EXIT_REASON_MIGRATED, shizuv1.ExitReason_EXIT_REASON_NODE_FAILED:
		r.setState(stateMigrating, why, at)
	default:
		r.setState(stateStopped, why, at)
	}
}

func (r *rentalView) setState(s, why string, at time.Time) {
	r.State, r.Why, r.Since = s, why, at
}

func (r *rentalView) add(at time.Time, ev, detail string) {
	r.Timeline = append(r.Timeline, step{At: at, Event: ev, Detail: detail})
}

func joinInts(xs []int32) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprint(x)
	}
	return strings.Join(parts, ",")
}

// metaOf returns an event's envelope.
func metaOf(m proto.Message) *shizuv1.EventMeta {
	if g, ok := m.(interface{ GetMeta() *shizuv1.EventMeta }); ok {
		return g.GetMeta()
	}
	return nil
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
