package app_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/capacity"
)

func TestAMovedRentalIsPlacedBeforeANewRequestWaitingForTheSameGPU(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register(gpuNode("n1", 1, capacity.MarketOnDemand))
	e.replica(testConfig(), time.Now)
	sp := spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND)
	e.publish(requested("filler", "acme", sp, time.Now()))
	var filler *shizuv1.RentalScheduled
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) (err error) { filler, err = scheduledOf(o, "filler"); return })

	// A new request made earlier and more urgent, and a rental failover
	// moved off a lost node: both wait for n1's one GPU.
	urgent := spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND)
	urgent.Priority = 900
	e.publish(requested("fresh", "globex", urgent, time.Now().Add(-time.Minute)))
	lost := &shizuv1.RentalScheduled{RentalId: "moved", TenantId: "acme", NodeId: "lost-node", NodeEpoch: 1, Attempt: 1}
	e.publish(migrating(lost, sp))
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) error {
		if len(o.pending["fresh"]) == 0 || len(o.pending["moved"]) == 0 {
			return fmt.Errorf("pending: fresh %d, moved %d", len(o.pending["fresh"]), len(o.pending["moved"]))
		}
		return nil
	})

	e.publish(stopped(filler, shizuv1.ExitReason_EXIT_REASON_COMPLETED))
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) error {
		if s := o.scheduled["fresh"]; len(s) > 0 {
			return errors.New("the new request took the GPU before the moved rental") // fails at the deadline
		}
		s, err := scheduledOf(o, "moved")
		if err == nil && s.GetAttempt() != 2 {
			return fmt.Errorf("moved placed as attempt %d, want 2", s.GetAttempt())
		}
		return err
	})
	e.seen.mu.Lock()
	defer e.seen.mu.Unlock()
	if len(e.seen.scheduled["fresh"]) != 0 {
		t.Fatal("the new request was placed too: the one GPU is booked twice")
	}
}
