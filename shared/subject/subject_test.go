package subject_test

import (
	"testing"

	"github.com/shizu-gpu/shizu/shared/subject"
)

func TestFormatRefusesKeysThatWouldWidenASubject(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"", "a.b", "*", ">", "te nant", "tab\t"} {
		if s, err := subject.Format(subject.RentalRequested, key); err == nil {
			t.Errorf("key %q gave subject %q; want an error", key, s)
		}
	}
	s, err := subject.Format(subject.SpotPriceChanged, "eu-west-1a", "H100-SXM5-80GB")
	if err != nil || s != "spot.eu-west-1a.H100-SXM5-80GB.price" {
		t.Fatalf("got %q, %v", s, err)
	}
	if _, err := subject.Format(subject.RentalRequested, "a", "b"); err == nil {
		t.Fatal("too many keys accepted")
	}
}

func TestMatchesFollowsNATSWildcards(t *testing.T) {
	t.Parallel()
	cases := []struct {
		pattern, subject string
		want             bool
	}{
		{"rental.*.requested", "rental.acme.requested", true},
		{"rental.*.requested", "rental.acme.started", false},
		{"rental.>", "rental.acme.requested", true},
		{"rental.>", "rental", false},
		{"rental.*", "rental.acme.requested", false},
		{"spot.*.*.price", "spot.z.m.price", true},
	}
	for _, c := range cases {
		if got := subject.Matches(c.pattern, c.subject); got != c.want {
			t.Errorf("Matches(%q, %q) = %v, want %v", c.pattern, c.subject, got, c.want)
		}
	}
}

// Every tenant subject, publish and subscribe form, names the tenant as its
// second token, so tenant permissions (rental.<tenant>.>) cover it.
func TestTenantIsTheSecondTokenOfEveryTenantSubject(t *testing.T) {
	t.Parallel()
	forms := []string{
		subject.RentalRequested, subject.RentalScheduled, subject.RentalPending, subject.RentalRejected,
		subject.RentalStarted, subject.RentalStopped, subject.RentalPreempted, subject.RentalMigrating,
		subject.RentalMigrated, subject.RentalCancelRequested, subject.UsageRecorded, subject.UsageBudgetCrossed,
		subject.InvoiceClosed, subject.RentalOfTenant, subject.UsageOfTenant, subject.InvoiceOfTenant,
	}
	for _, form := range forms {
		s, err := subject.Format(form, "acme")
		if err != nil {
			t.Fatalf("%s: %v", form, err)
		}
		if got, ok := subject.TenantOf(s); !ok || got != "acme" {
			t.Errorf("TenantOf(%s) = %q, %v; want acme", s, got, ok)
		}
	}
	for _, all := range []string{subject.RentalRequestedAll, subject.UsageRecordedAll, subject.InvoiceClosedAll} {
		if tok, _ := subject.TenantOf(all); tok != "*" {
			t.Errorf("subscribe form %s: tenant token %q, want *", all, tok)
		}
	}
	for _, s := range []string{"node.acme.registered", "agent.n1.cmd.stop", "scale.fleet.shortage", "rental", "rental.", "spot.z.m.price"} {
		if got, ok := subject.TenantOf(s); ok {
			t.Errorf("TenantOf(%s) = %q; want no tenant", s, got)
		}
	}
}
