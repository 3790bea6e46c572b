package billing_test

import (
	"errors"
	"testing"

	"github.com/shizu-gpu/shizu/shared/billing"
)

func TestAUsageQueryNamesTheFieldThatIsWrong(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		q     billing.UsageQuery
		field string
	}{
		{"a from that is not a date is refused", billing.UsageQuery{From: "2026-13-01", To: "2026-12-02", GroupBy: "day"}, "from"},
		{"a to before from is refused", billing.UsageQuery{From: "2026-12-02", To: "2026-12-02", GroupBy: "day"}, "to"},
		{"a period over a year is refused", billing.UsageQuery{From: "2025-01-01", To: "2026-12-02", GroupBy: "day"}, "to"},
		{"an unknown grouping is refused", billing.UsageQuery{From: "2026-12-01", To: "2026-12-02", GroupBy: "week"}, "group_by"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := c.q.Period()
			if e := billing.Invalid(err); err == nil || e.Field != c.field || e.Code != billing.CodeInvalid {
				t.Fatalf("%+v: err %v, want one naming %s", c.q, err, c.field)
			}
		})
	}
	from, to, err := billing.UsageQuery{From: "2026-12-01", To: "2026-12-03", GroupBy: "label"}.Period()
	if err != nil || to.Sub(from).Hours() != 48 {
		t.Fatalf("a good query: %v %v %v", from, to, err)
	}
	if err := (billing.InvoicesQuery{Limit: billing.MaxInvoices + 1}).Check(); !errors.As(err, new(*billing.FieldError)) {
		t.Fatalf("limit over the maximum: %v", err)
	}
}
