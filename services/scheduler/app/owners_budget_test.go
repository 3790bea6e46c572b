package app_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/budget"
)

// A tenant whose budget is spent, reusing another tenant's rental id, is
// told the id is taken, and its budget refusal records nothing under that
// id: globex's request waiting for capacity is placed once capacity frees.
func TestABudgetRefusalNeverDecidesAnotherTenantsRental(t *testing.T) {
	t.Parallel()
	e := newBudgetEnv(t, 1)
	e.run("busy", "globex")
	e.publish(requested("target", "globex", spec(4, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), e.clock.now()))
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) error {
		if len(o.pending["target"]) == 0 {
			return errors.New("globex's four-GPU request is not pending")
		}
		return nil
	})
	e.exhaust("acme", budget.RejectNew, 0)
	theirs := requested("target", "acme", spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), e.clock.now())
	theirs.Meta.EventId = "req:acme:target"
	e.publish(theirs)
	rej := e.rejectedFor("target")
	if rej.GetTenantId() != "acme" || !strings.Contains(rej.GetMessage(), "already used by another tenant") {
		t.Fatalf("acme was told %v", rej)
	}
	var busy *shizuv1.RentalScheduled
	e.seen.waitFor(t, time.Second, func(o *outcomes) (err error) { busy, err = scheduledOf(o, "busy"); return })
	e.publish(stopped(busy, shizuv1.ExitReason_EXIT_REASON_COMPLETED))
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) error {
		if len(o.scheduled["target"]) == 0 {
			return fmt.Errorf("globex's request not placed (rejected %d times)", len(o.rejected["target"]))
		}
		if s := o.scheduled["target"][0]; s.GetTenantId() != "globex" || len(o.rejected["target"]) != 1 {
			return fmt.Errorf("target scheduled for %s, rejected %d times", s.GetTenantId(), len(o.rejected["target"]))
		}
		return nil
	})
}
