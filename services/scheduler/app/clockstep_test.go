package app_test

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/capacity"
)

// An agent whose wall clock stepped back during a short run stamps its stop
// before its start. The run did end: the scheduler gives the GPU back (and
// the next request gets it) instead of dead-lettering the stop and keeping
// the GPU allocated forever.
func TestAStopStampedBeforeItsStartStillGivesTheGPUBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register(gpuNode("n1", 1, capacity.MarketOnDemand))
	e.replica(testConfig(), time.Now)
	e.publish(requested("first", "acme", spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), time.Now()))
	var first *shizuv1.RentalScheduled
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) (err error) { first, err = scheduledOf(o, "first"); return })

	stop := stopped(first, shizuv1.ExitReason_EXIT_REASON_COMPLETED)
	stop.StartedAt = timestamppb.New(stop.GetStoppedAt().AsTime().Add(10 * time.Second))
	if stop.Validate() == nil {
		t.Fatal("the stop under test must be one that fails validation as stamped")
	}
	e.publish(requested("second", "acme", spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), time.Now()))
	e.publish(stop)
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) error {
		_, err := scheduledOf(o, "second")
		return err
	})
	if _, err := e.store.Allocation(t.Context(), "first"); !capacity.IsNotFound(err) {
		t.Fatalf("the stopped rental still holds its GPU: %v", err)
	}
}
