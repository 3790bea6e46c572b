package round_test

import (
	"strings"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/round"
)

const h100 = "H100-SXM5-80GB"

// acmeH100 is acme's year of 4 H100s from a month before t0.
var acmeH100 = round.Commitment{TenantID: "acme", Model: h100, GPUCount: 4, Term: round.TermYear, Start: t0.AddDate(0, -1, 0)}

// reservedRequest is acme's reserved request for one GPU of models, made
// at t0.
func reservedRequest(t *testing.T, models ...string) (*shizuv1.RentalRequested, placement.Request) {
	t.Helper()
	j := job(t, "r1", reserved)
	j.Event.TenantId, j.Request.Tenant = "acme", "acme"
	j.Event.Spec.Plan = shizuv1.Plan_PLAN_RESERVED
	j.Event.Spec.AllowedModels, j.Request.Models = models, models
	return j.Event, j.Request
}

func TestAReservedRequestIsAdmittedOnlyAgainstACommitmentForEveryModelItAllows(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name        string
		models      []string
		commitments round.Commitments
		wantReject  []string // all in the reason; none: admitted
	}{
		{"a reserved request of a committed model is admitted", []string{h100}, round.Commitments{acmeH100}, nil},
		{"a reserved request with no commitment at all is refused, naming what is missing",
			[]string{h100}, nil, []string{"acme", "no reserved commitment", h100, "on-demand"}},
		{"a reserved request that allows any model is refused: it must name its commitment's model",
			nil, round.Commitments{acmeH100}, []string{"reserved", "allowed_models", "commitment"}},
		{"a reserved request that also allows an uncommitted model is refused, naming it",
			[]string{h100, "A100-SXM4-80GB"}, round.Commitments{acmeH100}, []string{"A100-SXM4-80GB"}},
		{"another tenant's commitment does not count",
			[]string{h100}, round.Commitments{{TenantID: "globex", Model: h100, GPUCount: 4, Term: round.TermYear, Start: acmeH100.Start}},
			[]string{"no reserved commitment"}},
		{"a commitment that ended before the request does not count",
			[]string{h100}, round.Commitments{{TenantID: "acme", Model: h100, GPUCount: 4, Term: round.TermMonth, Start: t0.AddDate(0, -2, 0)}},
			[]string{"no reserved commitment"}},
		{"a commitment that starts after the request does not count",
			[]string{h100}, round.Commitments{{TenantID: "acme", Model: h100, GPUCount: 4, Term: round.TermMonth, Start: t0.Add(time.Hour)}},
			[]string{"no reserved commitment"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ev, r := reservedRequest(t, tc.models...)
			reject, err := round.Admit(ev, &r, placement.DefaultCatalogue(), round.Config{Commitments: tc.commitments})
			if err != nil {
				t.Fatalf("refused as unanswerable: %v", err)
			}
			if len(tc.wantReject) == 0 && reject != "" {
				t.Fatalf("rejected: %s", reject)
			}
			if len(tc.wantReject) > 0 && reject == "" {
				t.Fatal("admitted: a reserved rental without a commitment would be billed at the list price")
			}
			for _, w := range tc.wantReject {
				if !strings.Contains(reject, w) {
					t.Fatalf("reject %q does not name %q", reject, w)
				}
			}
		})
	}
}

func TestCommitmentsAreNotNeededForOtherPlans(t *testing.T) {
	t.Parallel()
	for _, j := range []*round.Job{job(t, "od"), job(t, "sp", spot, func(j *round.Job) { j.Event.Spec.Plan = shizuv1.Plan_PLAN_SPOT })} {
		if reject, err := round.Admit(j.Event, &j.Request, placement.DefaultCatalogue(), round.Config{}); reject != "" || err != nil {
			t.Fatalf("%s (%v): %q %v", j.Request.ID, j.Request.Class, reject, err)
		}
	}
}

func TestTheAccountsFileGivesTheCommitmentsAndNamesEveryProblem(t *testing.T) {
	t.Parallel()
	cs, err := round.ParseAccounts([]byte(`{"commitments":[{"tenant_id":"acme","model":"H100-SXM5-80GB","gpu_count":4,"term":"year",
		"start":"2026-11-01T00:00:00Z","discount_percent":70}],"budgets":[{"id":"monthly","tenant_id":"acme"}]}`))
	if err != nil || len(cs) != 1 || !cs.InForce("acme", h100, t0) || cs.InForce("acme", h100, t0.AddDate(1, 0, 0)) {
		t.Fatalf("commitments %+v, %v", cs, err)
	}
	_, err = round.ParseAccounts([]byte(`{"commitments":[{"model":"H100-SXM5-80GB","gpu_count":0,"term":"week"}]}`))
	for _, w := range []string{"commitments[0]: needs a tenant_id", "gpu_count", `term: "week"`, "start: missing"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Fatalf("error %v does not name %q", err, w)
		}
	}
}
