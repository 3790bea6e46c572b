// Package billing is the money query API metering answers on the bus by
// request-reply (subjects metering.<tenant>.usage|invoices|budget in
// shared/subject): the requests and answers as JSON, their checks, and
// Ask, the requester's side. The tenant is the subject's token, never a
// field of a request, so a requester that may only ask for its own
// tenant cannot name another. Money is integer micro-units of Currency.
package billing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shizu-gpu/shizu/shared/subject"
)

// Groupings of a usage query.
const (
	ByRental = "rental"
	ByModel  = "model"
	ByDay    = "day"
	ByLabel  = "label"
)

// MaxDays is the longest period one usage query covers.
const MaxDays = 366

// UsageQuery asks for a tenant's usage over whole UTC days [From, To),
// grouped by GroupBy.
type UsageQuery struct {
	// From is the first day (YYYY-MM-DD), inclusive.
	From string `json:"from"`
	// To is the day after the last (YYYY-MM-DD), exclusive.
	To string `json:"to"`
	// GroupBy is rental, model, day or label.
	GroupBy string `json:"group_by"`
}

// Period checks q and returns its days; an error names the field.
func (q UsageQuery) Period() (from, to time.Time, err error) {
	var errs []error
	from, ferr := time.Parse(time.DateOnly, q.From)
	if ferr != nil {
		errs = append(errs, &FieldError{Field: "from", Reason: fmt.Sprintf("%q is not a date (YYYY-MM-DD)", q.From)})
	}
	to, terr := time.Parse(time.DateOnly, q.To)
	if terr != nil {
		errs = append(errs, &FieldError{Field: "to", Reason: fmt.Sprintf("%q is not a date (YYYY-MM-DD)", q.To)})
	}
	if ferr == nil && terr == nil {
		switch days := int(to.Sub(from) / (24 * time.Hour)); {
		case days < 1:
			errs = append(errs, &FieldError{Field: "to", Reason: "must be after from (to is exclusive)"})
		case days > MaxDays:
			errs = append(errs, &FieldError{Field: "to", Reason: fmt.Sprintf("the period is %d days; at most %d", days, MaxDays)})
		}
	}
	switch q.GroupBy {
	case ByRental, ByModel, ByDay, ByLabel:
	default:
		errs = append(errs, &FieldError{Field: "group_by", Reason: fmt.Sprintf("%q is none of rental, model, day, label", q.GroupBy)})
	}
	return from, to, errors.Join(errs...)
}

// UsageRow is the usage of one group.
type UsageRow struct {
	// Key is the group: a rental id, a model, a day (YYYY-MM-DD) or a
	// label key=value.
	Key string `json:"key"`
	// Plan is on-demand, reserved or spot (grouped by model only: one row
	// per model and plan).
	Plan string `json:"plan,omitempty"`
	// MilliGPUSeconds is the quantity: 1000 is one whole GPU for a second.
	MilliGPUSeconds int64 `json:"milli_gpu_seconds"`
	// Seconds is the time billed (grouped by rental only).
	Seconds int64 `json:"seconds,omitempty"`
	// AmountMicros is the sum of the usage records' amounts.
	AmountMicros int64 `json:"amount_micros"`
}

// UsageAnswer is the usage of a query, its rows ordered by key (and plan).
type UsageAnswer struct {
	Currency string     `json:"currency"`
	Rows     []UsageRow `json:"rows"`
	Error    *Error     `json:"error,omitempty"`
}

// MaxInvoices is the most invoices one answer holds.
const MaxInvoices = 100

// InvoicesQuery asks for a page of a tenant's closed invoices, oldest
// first.
type InvoicesQuery struct {
	// After is the stream position to continue after (Next of the last
	// page; 0 for the first).
	After uint64 `json:"after,omitempty"`
	// Limit is the page size, 1..MaxInvoices (0 means 20).
	Limit int `json:"limit,omitempty"`
}

// Check checks q; an error names the field.
func (q InvoicesQuery) Check() error {
	if q.Limit < 0 || q.Limit > MaxInvoices {
		return &FieldError{Field: "limit", Reason: fmt.Sprintf("%d is out of range 1..%d", q.Limit, MaxInvoices)}
	}
	return nil
}

// InvoiceLine is one plan-and-model line of an invoice.
type InvoiceLine struct {
	Plan            string `json:"plan"`
	Model           string `json:"model"`
	MilliGPUSeconds int64  `json:"milli_gpu_seconds"`
	AmountMicros    int64  `json:"amount_micros"`
}

// Invoice is one closed invoice (an InvoiceClosed of the BILLING stream).
type Invoice struct {
	ID          string        `json:"invoice_id"`
	PeriodStart time.Time     `json:"period_start"`
	PeriodEnd   time.Time     `json:"period_end"`
	ClosedAt    time.Time     `json:"closed_at"`
	Lines       []InvoiceLine `json:"lines"`
	TotalMicros int64         `json:"total_micros"`
	Currency    string        `json:"currency"`
}

// InvoicesAnswer is a page of invoices; Next, when not 0, is the After of
// the next page.
type InvoicesAnswer struct {
	Invoices []Invoice `json:"invoices"`
	Next     uint64    `json:"next,omitempty"`
	Error    *Error    `json:"error,omitempty"`
}

// BudgetQuery asks for a tenant's budget and its spend in the current
// month (UTC).
type BudgetQuery struct{}

// Threshold is one threshold of a budget.
type Threshold struct {
	Micros int64 `json:"micros"`
	// Percent is the threshold as a percentage of the budget's amount, or
	// 0 when set as an absolute spend.
	Percent int32 `json:"percent,omitempty"`
	// Reached says the month's spend is at or past it.
	Reached bool `json:"reached"`
	// Alerted says its BudgetThresholdCrossed was published this month.
	Alerted bool `json:"alerted"`
}

// Budget is a tenant's budget.
type Budget struct {
	ID string `json:"budget_id"`
	// AmountMicros is the budget's amount (0 when it has only absolute
	// thresholds).
	AmountMicros int64       `json:"amount_micros,omitempty"`
	Thresholds   []Threshold `json:"thresholds"`
	// Policy is what happens when the month's spend reaches AmountMicros:
	// alert, reject-new or stop-running (shared/budget).
	Policy string `json:"policy"`
	// GraceSeconds is, under stop-running, how long running rentals run
	// after their notice.
	GraceSeconds int64 `json:"grace_seconds,omitempty"`
}

// BudgetAnswer is the tenant's spend in Month and its budget (nil when it
// has none).
type BudgetAnswer struct {
	// Month is YYYY-MM (UTC).
	Month       string  `json:"month"`
	Currency    string  `json:"currency"`
	SpendMicros int64   `json:"spend_micros"`
	Budget      *Budget `json:"budget,omitempty"`
	Error       *Error  `json:"error,omitempty"`
}

// Error codes of an answer.
const (
	// CodeInvalid: the request is wrong (Field names what); asking again
	// the same way will not help.
	CodeInvalid = "invalid"
	// CodeUnavailable: metering cannot answer now (its store is being
	// rebuilt, Redis or the stream is unreachable); ask again later.
	CodeUnavailable = "unavailable"
)

// Error is why an answer has no data.
type Error struct {
	Code    string `json:"code"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
}

func (e *Error) Error() string {
	if e.Field != "" {
		return e.Field + ": " + e.Message
	}
	return e.Message
}

// FieldError is a request field that is wrong.
type FieldError struct {
	Field, Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

// Invalid is the answer's error for a request that failed its check.
func Invalid(err error) *Error {
	if fe, ok := errors.AsType[*FieldError](err); ok {
		return &Error{Code: CodeInvalid, Field: fe.Field, Message: fe.Reason}
	}
	return &Error{Code: CodeInvalid, Message: err.Error()}
}

// ErrUnavailable is what Ask returns when no metering answered in time, or
// metering said it cannot answer now.
var ErrUnavailable = errors.New("metering is unavailable")

// Ask sends req on form (a query subject of shared/subject) for tenant
// and decodes the answer into ans (reset first), within ctx's deadline. No responder,
// a timeout and an answer of CodeUnavailable are ErrUnavailable; an
// answer of CodeInvalid is its *Error.
func Ask[A Answer](ctx context.Context, nc *nats.Conn, form, tenant string, req any, ans A) error {
	subj, err := subject.Format(form, tenant)
	if err != nil {
		return &Error{Code: CodeInvalid, Field: "tenant", Message: err.Error()}
	}
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	msg, err := nc.RequestWithContext(ctx, subj, body)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%w: %s: %w", ErrUnavailable, subj, err)
		}
		return err
	}
	ans.reset()
	if err := json.Unmarshal(msg.Data, ans); err != nil {
		return fmt.Errorf("answer on %s: %w", subj, err)
	}
	if e := ans.answerError(); e != nil {
		if e.Code == CodeUnavailable {
			return fmt.Errorf("%w: %s", ErrUnavailable, e.Message)
		}
		return e
	}
	return nil
}

// Answer is what Ask decodes into: one of the answers.
type Answer interface {
	*UsageAnswer | *InvoicesAnswer | *BudgetAnswer
	answerError() *Error
	reset()
}

func (a *UsageAnswer) answerError() *Error    { return a.Error }
func (a *UsageAnswer) reset()                 { *a = UsageAnswer{} }
func (a *InvoicesAnswer) reset()              { *a = InvoicesAnswer{} }
func (a *BudgetAnswer) reset()                { *a = BudgetAnswer{} }
func (a *InvoicesAnswer) answerError() *Error { return a.Error }
func (a *BudgetAnswer) answerError() *Error   { return a.Error }
