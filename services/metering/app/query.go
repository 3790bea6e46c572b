package app

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/services/metering/redisstore"
	"github.com/shizu-gpu/shizu/shared/billing"
	"github.com/shizu-gpu/shizu/shared/budget"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Queries answers the money queries of shared/billing on the bus, in
// metering's queue group (each request reaches one replica): usage from
// the aggregates, invoices from the BILLING stream (direct reads by
// subject: nothing is left on the server), budgets from the accounts and
// the month's spend. The tenant is the subject's token. While the store
// is lost (waiting for its rebuild) it answers "unavailable".
type Queries struct {
	store    *redisstore.Store
	accounts ledger.Accounts
	currency string
	js       jetstream.JetStream
	log      *slog.Logger
	now      func() time.Time
	// base is the context answers run in (the caller's, not ended by it:
	// Stop ends the answers).
	base context.Context
	subs []*nats.Subscription
	// mu orders inflight.Add before Stop's Wait: once stopped is set no
	// answer starts.
	mu       sync.Mutex
	stopped  bool
	inflight sync.WaitGroup
	// slots bounds the queries answered at once.
	slots   chan struct{}
	answers metric.Int64Counter
}

// QueryDeps are what the money queries' answers run on.
type QueryDeps struct {
	// Conn is the metering user's bus connection.
	Conn *bus.Conn
	// Store is the aggregates (read only).
	Store *redisstore.Store
	// Log receives warnings (default: discarded).
	Log *slog.Logger
	// Now is the clock (default time.Now): the month of a budget query.
	Now func() time.Time
	// Meter receives the queries counter (default none).
	Meter metric.MeterProvider
}

// queryTimeout bounds the work of one answer.
const queryTimeout = 5 * time.Second

// ServeQueries subscribes to the money queries on d.Conn (the metering
// user) and answers them until the returned Queries is stopped.
func ServeQueries(ctx context.Context, cfg Config, d QueryDeps) (*Queries, error) {
	cat, accounts, err := cfg.load()
	if err != nil {
		return nil, err
	}
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	answers, err := newQueryCounter(d.Meter)
	if err != nil {
		return nil, err
	}
	conn := d.Conn
	q := &Queries{store: d.Store, accounts: accounts, currency: cat.Currency, js: conn.JetStream(), log: d.Log, now: d.Now,
		base: context.WithoutCancel(ctx), slots: make(chan struct{}, 16), answers: answers}
	handlers := map[string]func(context.Context, string, []byte) any{
		subject.UsageQueryAll: q.usage, subject.InvoicesQueryAll: q.invoices, subject.BudgetQueryAll: q.budget,
	}
	for subj, h := range handlers {
		name := subj[strings.LastIndexByte(subj, '.')+1:]
		sub, err := conn.NATS().QueueSubscribe(subj, topology.QueueGroup(topology.Metering), q.handler(name, h))
		if err != nil {
			_ = q.Stop(ctx)
			return nil, fmt.Errorf("metering queries: subscribe %s: %w", subj, err)
		}
		q.subs = append(q.subs, sub)
	}
	if err := conn.NATS().Flush(); err != nil {
		_ = q.Stop(ctx)
		return nil, fmt.Errorf("metering queries: %w", err)
	}
	return q, nil
}

// Stop stops taking queries and waits for those being answered.
func (q *Queries) Stop(ctx context.Context) error {
	q.mu.Lock()
	q.stopped = true
	q.mu.Unlock()
	var errs []error
	for _, s := range q.subs {
		if err := s.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			errs = append(errs, err)
		}
	}
	done := make(chan struct{})
	go func() { q.inflight.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		errs = append(errs, ctx.Err())
	}
	return errors.Join(errs...)
}

// handler answers each request in its own goroutine (at most cap(slots)
// at once).
func (q *Queries) handler(name string, h func(context.Context, string, []byte) any) nats.MsgHandler {
	return func(m *nats.Msg) {
		if m.Reply == "" {
			return
		}
		q.mu.Lock()
		if q.stopped {
			q.mu.Unlock()
			return
		}
		q.inflight.Add(1)
		q.mu.Unlock()
		q.slots <- struct{}{}
		go func() {
			defer q.inflight.Done()
			defer func() { <-q.slots }()
			ctx, cancel := context.WithTimeout(q.base, queryTimeout)
			defer cancel()
			var ans any
			tenant := strings.Split(m.Subject, ".")[1]
			if err := subject.Token(tenant); err != nil {
				ans = map[string]any{"error": billing.Invalid(err)}
			} else {
				ans = h(ctx, tenant, m.Data)
			}
			q.count(ctx, name, ans)
			b, _ := json.Marshal(ans) // plain values: never fails
			if err := m.Respond(b); err != nil {
				q.log.Warn("metering query: reply failed", "subject", m.Subject, "err", err)
			}
		}()
	}
}

// count counts an answer by query and outcome.
func (q *Queries) count(ctx context.Context, name string, ans any) {
	var e *billing.Error
	switch a := ans.(type) {
	case billing.UsageAnswer:
		e = a.Error
	case billing.InvoicesAnswer:
		e = a.Error
	case billing.BudgetAnswer:
		e = a.Error
	default:
		e = &billing.Error{Code: billing.CodeInvalid}
	}
	outcome := "answered"
	if e != nil {
		outcome = e.Code
	}
	q.answers.Add(ctx, 1, metric.WithAttributes(attrQuery.String(name), attrOutcome.String(outcome)))
}

// decodeQuery decodes a request body strictly; an empty body is {}.
func decodeQuery(data []byte, v any) *billing.Error {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return &billing.Error{Code: billing.CodeInvalid, Field: "body", Message: err.Error()}
	}
	return nil
}

// ready says whether the store may be read (nil), else why not.
func (q *Queries) ready(ctx context.Context) *billing.Error {
	ok, err := q.store.Ready(ctx)
	if err == nil && !ok {
		err = redisstore.ErrLost
	}
	if err != nil {
		return q.unavailable("store", err)
	}
	return nil
}

func (q *Queries) unavailable(what string, err error) *billing.Error {
	q.log.Warn("metering query cannot be answered", "what", what, "err", err)
	return &billing.Error{Code: billing.CodeUnavailable, Message: "metering cannot read its " + what + " now; retry later"}
}

func (q *Queries) usage(ctx context.Context, tenant string, data []byte) any {
	var req billing.UsageQuery
	if e := decodeQuery(data, &req); e != nil {
		return billing.UsageAnswer{Error: e}
	}
	from, to, err := req.Period()
	if err != nil {
		return billing.UsageAnswer{Error: billing.Invalid(err)}
	}
	if e := q.ready(ctx); e != nil {
		return billing.UsageAnswer{Error: e}
	}
	rows, err := q.store.UsageRows(ctx, tenant, from, to, req.GroupBy)
	if err != nil {
		return billing.UsageAnswer{Error: q.unavailable("aggregates", err)}
	}
	return billing.UsageAnswer{Currency: q.currency, Rows: rows}
}

func (q *Queries) budget(ctx context.Context, tenant string, data []byte) any {
	var req billing.BudgetQuery
	if e := decodeQuery(data, &req); e != nil {
		return billing.BudgetAnswer{Error: e}
	}
	if e := q.ready(ctx); e != nil {
		return billing.BudgetAnswer{Error: e}
	}
	month := ledger.Month(q.now())
	spend, err := q.store.MonthSpend(ctx, tenant, month, q.currency)
	if err != nil {
		return billing.BudgetAnswer{Error: q.unavailable("aggregates", err)}
	}
	ans := billing.BudgetAnswer{Month: month, Currency: q.currency, SpendMicros: spend}
	b, ok := q.accounts.Budget(tenant)
	if !ok {
		return ans
	}
	alerted, err := q.store.Alerts(ctx, tenant, month)
	if err != nil {
		return billing.BudgetAnswer{Error: q.unavailable("alerts", err)}
	}
	out := &billing.Budget{ID: b.Name(), AmountMicros: b.AmountMicros, Thresholds: []billing.Threshold{},
		Policy: string(b.Policy), GraceSeconds: int64(b.GraceOf() / time.Second)}
	if out.Policy == "" {
		out.Policy = string(budget.Alert)
	}
	for _, t := range b.Thresholds() {
		done := false
		for _, a := range alerted {
			done = done || a == t.Micros
		}
		out.Thresholds = append(out.Thresholds, billing.Threshold{Micros: t.Micros, Percent: t.Percent, Reached: spend >= t.Micros, Alerted: done})
	}
	ans.Budget = out
	return ans
}

// invoices reads a page of the tenant's InvoiceClosed events from BILLING
// by direct gets on the tenant's subject: no consumer is created.
func (q *Queries) invoices(ctx context.Context, tenant string, data []byte) any {
	var req billing.InvoicesQuery
	if e := decodeQuery(data, &req); e != nil {
		return billing.InvoicesAnswer{Error: e}
	}
	if err := req.Check(); err != nil {
		return billing.InvoicesAnswer{Error: billing.Invalid(err)}
	}
	limit := req.Limit
	if limit == 0 {
		limit = 20
	}
	subj, _ := subject.Format(subject.InvoiceClosed, tenant) // the tenant is a checked token
	st, err := q.js.Stream(ctx, topology.StreamBilling)
	if err != nil {
		return billing.InvoicesAnswer{Error: q.unavailable("invoices", err)}
	}
	ans := billing.InvoicesAnswer{Invoices: []billing.Invoice{}}
	seq := req.After + 1
	for {
		m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return ans
		}
		if err != nil {
			return billing.InvoicesAnswer{Error: q.unavailable("invoices", err)}
		}
		if len(ans.Invoices) == limit {
			ans.Next = seq - 1 // another one follows
			return ans
		}
		seq = m.Sequence + 1
		ev := &shizuv1.InvoiceClosed{}
		if err := proto.Unmarshal(m.Data, ev); err != nil || ev.Validate() != nil || ev.GetTenantId() != tenant {
			q.log.Error("metering query: an invoice on the stream is not valid; skipped", "subject", subj, "seq", m.Sequence, "err", err)
			continue
		}
		ans.Invoices = append(ans.Invoices, invoiceOf(ev))
	}
}

func invoiceOf(ev *shizuv1.InvoiceClosed) billing.Invoice {
	inv := billing.Invoice{ID: ev.GetInvoiceId(), PeriodStart: ev.GetPeriodStart().AsTime().UTC(), PeriodEnd: ev.GetPeriodEnd().AsTime().UTC(),
		ClosedAt: ev.GetMeta().GetOccurredAt().AsTime().UTC(), TotalMicros: ev.GetTotal().GetMicros(), Currency: ev.GetTotal().GetCurrency(),
		Lines: make([]billing.InvoiceLine, 0, len(ev.GetLineItems()))}
	for _, l := range ev.GetLineItems() {
		inv.Lines = append(inv.Lines, billing.InvoiceLine{Plan: redisstore.PlanName(l.GetPlan()), Model: l.GetModel(),
			MilliGPUSeconds: l.GetMilliGpuSeconds(), AmountMicros: l.GetAmount().GetMicros()})
	}
	return inv
}
