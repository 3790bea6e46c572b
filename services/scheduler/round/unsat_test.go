package round_test

import (
	"strings"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/round"
)

// A request no node of the view and no offer could ever hold is rejected
// in its first round as unsatisfiable, naming the constraint; before
// JudgeFrom it waits with a note naming it; with no node and no offer it
// waits saying there is nothing to judge against.
func TestAnUnsatisfiableRequestIsRejectedOnceTheFleetIsJudged(t *testing.T) {
	t.Parallel()
	big := func(j *round.Job) { j.Request.GPUCount = 2 }
	for _, tc := range []struct {
		name      string
		nodes     int
		judgeFrom time.Time
		reject    bool
		want      string
	}{
		{"judged", 1, time.Time{}, true, "no node could ever hold this request: needs 2 GPUs on one node; the largest node has 1"},
		{"grace", 1, t0.Add(time.Minute), false, "needs 2 GPUs on one node; the largest node has 1; not rejected before 2026-12-01T12:01:00Z"},
		{"empty fleet", 0, time.Time{}, false, "no node has registered and the autoscaler offers no instance type"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config(t)
			cfg.Offers, cfg.JudgeFrom = nil, tc.judgeFrom
			v := viewOf()
			if tc.nodes > 0 {
				v = viewOf(node("n1", tc.nodes))
			}
			plan := round.Plan(v, []*round.Job{job(t, "big", big)}, t0, cfg, nil)
			if tc.reject {
				if len(plan.Reject) != 1 || plan.Reject[0].Reason != shizuv1.RejectReason_REJECT_REASON_UNSATISFIABLE ||
					plan.Reject[0].Message != tc.want {
					t.Fatalf("plan %+v; want rejected as unsatisfiable with %q", plan, tc.want)
				}
				return
			}
			if len(plan.Pending) != 1 || !strings.Contains(plan.Pending[0].Message(), tc.want) {
				t.Fatalf("plan %+v; want pending saying %q", plan, tc.want)
			}
			if !tc.judgeFrom.IsZero() && !plan.NextDeadline.Equal(tc.judgeFrom) {
				t.Fatalf("next deadline %s; want the end of the grace %s", plan.NextDeadline, tc.judgeFrom)
			}
		})
	}
}
