package app_test

import (
	"fmt"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/failover/app"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// An agent whose wall clock stepped back during a short run stamps a stop
// before its start. The run did end: failover handles it as the stop it is
// (the handed-over allocation is freed, the rental forgotten), flags it in
// a metric and a log, and dead-letters nothing.
func TestAStopStampedBeforeItsStartIsHandledAsAStopAndFlagged(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Second)
	epoch := e.node(t, "n1", 8)
	e.rent(t, "r1", "n1", epoch, shizuv1.Plan_PLAN_ON_DEMAND, 0)
	reader := sdkmetric.NewManualReader()
	m, err := app.NewMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	e.startReplica(t, testConfig(), "failover-a", m)
	waitIndexed(t, e, "r1")
	// A make-before-break move handed the old run's allocation over; the
	// old run's stop must free it.
	if _, err := e.store.HandOver(t.Context(), "r1", "n1"); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	e.publish(t, subject.RentalStopped, "acme", &shizuv1.RentalStopped{
		Meta: meta("rental:r1:stopped:1", "r1"), RentalId: "r1", TenantId: "acme", NodeId: "n1", NodeEpoch: int64(epoch),
		Attempt: 1, StartedAt: timestamppb.New(started), StoppedAt: timestamppb.New(started.Add(-5 * time.Second)),
		ExitReason: shizuv1.ExitReason_EXIT_REASON_MIGRATED,
	})
	rdb := e.Redis.Client(t)
	eventually(t, func() error {
		st, err := e.store.Node(t.Context(), "n1")
		if err != nil {
			return err
		}
		if len(st.Allocations) != 0 {
			return fmt.Errorf("n1 still holds %d allocations", len(st.Allocations))
		}
		if n, err := rdb.Exists(t.Context(), "shizu:failover:rental:r1").Result(); err != nil || n != 0 {
			return fmt.Errorf("r1 still indexed (%d): %w", n, err)
		}
		return nil
	})
	if n := sumCounter(t, reader, "shizu.failover.clamped_stops"); n != 1 {
		t.Fatalf("%d clamped stops counted, want 1", n)
	}
	dlq, err := e.js.Stream(t.Context(), topology.StreamDeadLetter)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := dlq.Info(t.Context()); err != nil || info.State.Msgs != 0 {
		t.Fatalf("dead letters: %+v, %v; want none", info.State, err)
	}
}
