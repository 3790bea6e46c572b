package app

import (
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/shizu-gpu/shizu/shared/billing"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// Money: usage, invoices and budgets, asked of metering on the bus
// (shared/billing, subjects metering.<tenant>.*) for the key's tenant.
// The gateway keeps no money of its own and reads none of metering's
// keys; when no metering answers it says 503 with Retry-After.

func moneyRoutes(g *Gateway) []route {
	return []route{
		{method: http.MethodGet, path: "/v1/usage", access: tenantRead, handle: g.getUsage},
		{method: http.MethodGet, path: "/v1/invoices", access: tenantRead, handle: g.listInvoices},
		{method: http.MethodGet, path: "/v1/budgets", access: tenantRead, handle: g.getBudget},
	}
}

// meteringRetryAfter is the Retry-After of a 503 when metering does not
// answer.
const meteringRetryAfter = 5

// probUnavailable is a problem of a dependency that cannot answer now.
var probUnavailable = kind{"unavailable", "The platform cannot answer this now"}

// askTimeout bounds the wait for metering's answer.
const askTimeout = 5 * time.Second

// ask asks metering for the call's tenant; false when it answered with a
// problem (400 for a request metering refused, 503 when none answered).
func ask[A billing.Answer](g *Gateway, w http.ResponseWriter, r *http.Request, c *call, form string, req any, ans A) bool {
	ctx, cancel := context.WithTimeout(r.Context(), askTimeout)
	defer cancel()
	err := billing.Ask(ctx, g.bus.NATS(), form, c.tenant, req, ans)
	var be *billing.Error
	switch {
	case err == nil:
		return true
	case errors.As(err, &be) && be.Code == billing.CodeInvalid:
		field := "query " + be.Field
		if be.Field == "" || be.Field == "body" {
			field = "query"
		}
		writeProblem(w, r, http.StatusBadRequest, probInvalid, field+": "+be.Message, fieldError{Field: field, Reason: be.Message})
	case errors.Is(err, billing.ErrUnavailable):
		c.log.Warn("metering unavailable", "err", err)
		w.Header().Set("Retry-After", strconv.Itoa(meteringRetryAfter))
		writeProblem(w, r, http.StatusServiceUnavailable, probUnavailable,
			"metering, which keeps the money, did not answer; retry after "+strconv.Itoa(meteringRetryAfter)+" s")
	default:
		c.log.Error("ask metering", "err", err)
		writeProblem(w, r, http.StatusInternalServerError, probInternal, "the money could not be read; retry later")
	}
	return false
}

// usageReport is the API's UsageReport.
type usageReport struct {
	From     string             `json:"from"`
	To       string             `json:"to"`
	GroupBy  string             `json:"group_by"`
	Currency string             `json:"currency"`
	Rows     []billing.UsageRow `json:"rows"`
}

// getUsage answers the tenant's usage as JSON or, asked so, CSV.
func (g *Gateway) getUsage(w http.ResponseWriter, r *http.Request, c *call) {
	qs := r.URL.Query()
	now := g.now().UTC()
	q := billing.UsageQuery{From: qs.Get("from"), To: qs.Get("to"), GroupBy: qs.Get("group_by")}
	if q.From == "" {
		q.From = time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC).Format(time.DateOnly)
	}
	if q.To == "" {
		q.To = now.Truncate(24*time.Hour).AddDate(0, 0, 1).Format(time.DateOnly)
	}
	if q.GroupBy == "" {
		q.GroupBy = billing.ByDay
	}
	if _, _, err := q.Period(); err != nil {
		be := billing.Invalid(err)
		writeProblem(w, r, http.StatusBadRequest, probInvalid, "query "+be.Field+": "+be.Message,
			fieldError{Field: "query " + be.Field, Reason: be.Message})
		return
	}
	var ans billing.UsageAnswer
	if !ask(g, w, r, c, subject.UsageQuery, q, &ans) {
		return
	}
	rep := usageReport{From: q.From, To: q.To, GroupBy: q.GroupBy, Currency: ans.Currency, Rows: ans.Rows}
	if rep.Rows == nil {
		rep.Rows = []billing.UsageRow{}
	}
	if wantsCSV(r) {
		writeUsageCSV(w, rep)
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

// wantsCSV: ?format=csv, or an Accept that names text/csv (and format is
// not json).
func wantsCSV(r *http.Request) bool {
	switch r.URL.Query().Get("format") {
	case "csv":
		return true
	case "json":
		return false
	}
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		if mt, _, err := mime.ParseMediaType(strings.TrimSpace(part)); err == nil && mt == "text/csv" {
			return true
		}
	}
	return false
}

// writeUsageCSV writes the report as CSV: a header naming the grouping,
// then one line per row.
func writeUsageCSV(w http.ResponseWriter, rep usageReport) {
	var b bytes.Buffer
	cw := csv.NewWriter(&b)
	_ = cw.Write([]string{rep.GroupBy, "plan", "milli_gpu_seconds", "seconds", "amount_micros", "currency"})
	for _, row := range rep.Rows {
		_ = cw.Write([]string{row.Key, row.Plan, strconv.FormatInt(row.MilliGPUSeconds, 10), strconv.FormatInt(row.Seconds, 10),
			strconv.FormatInt(row.AmountMicros, 10), rep.Currency})
	}
	cw.Flush() // into memory: never fails
	w.Header().Set("Content-Type", "text/csv; charset=utf-8")
	w.Header().Set("Content-Disposition", `attachment; filename="usage-`+rep.From+`-`+rep.To+`-by-`+rep.GroupBy+`.csv"`)
	w.Header().Set("Content-Length", strconv.Itoa(b.Len()))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b.Bytes())
}

// invoiceList is the API's InvoiceList.
type invoiceList struct {
	Invoices   []billing.Invoice `json:"invoices"`
	NextCursor string            `json:"next_cursor,omitempty"`
}

// invoiceCursor prefixes the stream position in an invoice list's cursor.
const invoiceCursor = "inv-"

// listInvoices answers a page of the tenant's closed invoices.
func (g *Gateway) listInvoices(w http.ResponseWriter, r *http.Request, c *call) {
	qs := r.URL.Query()
	var q billing.InvoicesQuery
	if s := qs.Get("limit"); s != "" {
		q.Limit, _ = strconv.Atoi(s) // the document checked it: 1..100
	}
	if s := qs.Get("cursor"); s != "" {
		n, err := strconv.ParseUint(strings.TrimPrefix(s, invoiceCursor), 10, 64)
		if err != nil || !strings.HasPrefix(s, invoiceCursor) {
			writeProblem(w, r, http.StatusBadRequest, probInvalid, "the cursor is not one this API returned",
				fieldError{Field: "query cursor", Reason: "not a next_cursor of this list"})
			return
		}
		q.After = n
	}
	var ans billing.InvoicesAnswer
	if !ask(g, w, r, c, subject.InvoicesQuery, q, &ans) {
		return
	}
	out := invoiceList{Invoices: ans.Invoices}
	if out.Invoices == nil {
		out.Invoices = []billing.Invoice{}
	}
	if ans.Next != 0 {
		out.NextCursor = invoiceCursor + strconv.FormatUint(ans.Next, 10)
	}
	writeJSON(w, http.StatusOK, out)
}

// getBudget answers the tenant's spend this month and its budget.
func (g *Gateway) getBudget(w http.ResponseWriter, r *http.Request, c *call) {
	var ans billing.BudgetAnswer
	if !ask(g, w, r, c, subject.BudgetQuery, billing.BudgetQuery{}, &ans) {
		return
	}
	ans.Error = nil
	writeJSON(w, http.StatusOK, ans)
}
