package app_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/failover/app"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// waitIndexed waits until failover consumed the rentals' scheduled events
// (a RentalMigrating then carries their spec).
func waitIndexed(t testing.TB, e *env, rentals ...string) {
	t.Helper()
	rdb := e.Redis.Client(t)
	eventually(t, func() error {
		for _, r := range rentals {
			n, err := rdb.Exists(t.Context(), "shizu:failover:rental:"+r).Result()
			if err != nil {
				return err
			}
			if n == 0 {
				return fmt.Errorf("%s not indexed yet", r)
			}
		}
		return nil
	})
}

func migratingByRental(t testing.TB, e *env) map[string]*shizuv1.RentalMigrating {
	out := map[string]*shizuv1.RentalMigrating{}
	for _, ev := range events[*shizuv1.RentalMigrating](t, e, topology.StreamRentals, subject.RentalMigratingAll) {
		if _, dup := out[ev.GetRentalId()]; dup {
			t.Fatalf("two RentalMigrating for %s", ev.GetRentalId())
		}
		out[ev.GetRentalId()] = ev
	}
	return out
}

func TestAnExpiredHeartbeatFencesTheNodeAndMovesEveryRental(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Second)
	epoch := e.node(t, "n1", 8)
	e.node(t, "n2", 8)
	e.rent(t, "r-res", "n1", epoch, shizuv1.Plan_PLAN_RESERVED, 0, 1)
	e.rent(t, "r-od", "n1", epoch, shizuv1.Plan_PLAN_ON_DEMAND, 2)
	e.rent(t, "r-spot", "n1", epoch, shizuv1.Plan_PLAN_SPOT, 3)
	e.startReplica(t, testConfig(), "failover-a", nil)
	waitIndexed(t, e, "r-res", "r-od", "r-spot")
	stop := e.beat(t, "n1", epoch)
	e.beat(t, "n2", 1)
	stop() // the agent dies

	eventually(t, func() error {
		if got := migratingByRental(t, e); len(got) != 3 {
			return fmt.Errorf("%d RentalMigrating so far", len(got))
		}
		return nil
	})
	st, err := e.store.Node(t.Context(), "n1")
	if err != nil {
		t.Fatal(err)
	}
	if st.Status != capacity.StatusDead || st.Epoch != epoch+1 {
		t.Fatalf("n1 is %s at epoch %d, want dead at %d", st.Status, st.Epoch, epoch+1)
	}
	if len(st.Allocations) != 0 {
		t.Fatalf("n1 still holds %d allocations", len(st.Allocations))
	}
	for _, g := range st.FreeGPUs {
		if g.Milli != capacity.MilliPerGPU {
			t.Fatalf("GPU %d of n1 has %d milli free after the release, want all", g.Index, g.Milli)
		}
	}
	lost := events[*shizuv1.NodeLost](t, e, topology.StreamNodes, subject.NodeLostAll)
	if len(lost) != 1 || lost[0].GetReason() != shizuv1.NodeLostReason_NODE_LOST_REASON_HEARTBEAT_EXPIRED ||
		lost[0].GetFencedEpoch() != int64(epoch) || lost[0].GetLastHeartbeatAt() == nil {
		t.Fatalf("NodeLost %v, want one HEARTBEAT_EXPIRED at epoch %d with the last beat", lost, epoch)
	}
	migrating := migratingByRental(t, e)
	for _, r := range []string{"r-res", "r-od", "r-spot"} {
		m := migrating[r]
		if m.GetFromNodeId() != "n1" || m.GetFromNodeEpoch() != int64(epoch) || m.GetReason() != shizuv1.MigrationReason_MIGRATION_REASON_NODE_LOST {
			t.Errorf("%s: migrating %v", r, m)
		}
		if m.GetSpec() == nil || m.GetFromAttempt() != 1 || m.GetNextAttempt() != 2 || m.GetCheckpointUri() != "s3://ckpt/run/" {
			t.Errorf("%s: the re-queue lacks its spec, attempts or checkpoint: %v", r, m)
		}
		if m.GetMeta().GetEventId() != "rental:"+r+":migrating:2" || m.GetMeta().GetCausationId() != lost[0].GetMeta().GetEventId() {
			t.Errorf("%s: ids %v", r, m.GetMeta())
		}
		if err := m.Validate(); err != nil {
			t.Errorf("%s: %v", r, err)
		}
	}
	// The healthy node is untouched.
	if st, _ := e.store.Node(t.Context(), "n2"); st.Status != capacity.StatusReady || st.Epoch != 1 {
		t.Fatalf("n2 is %s at %d", st.Status, st.Epoch)
	}
}

func TestTheStormIsHandedOverReservedFirst(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Second)
	epoch := e.node(t, "n1", 8)
	e.rent(t, "a-spot", "n1", epoch, shizuv1.Plan_PLAN_SPOT, 0)
	e.rent(t, "b-od", "n1", epoch, shizuv1.Plan_PLAN_ON_DEMAND, 1)
	e.rent(t, "c-res", "n1", epoch, shizuv1.Plan_PLAN_RESERVED, 2)
	e.rent(t, "d-od", "n1", epoch, shizuv1.Plan_PLAN_ON_DEMAND, 3)
	cfg := testConfig()
	cfg.Pace.Burst = 1 // one at a time, so the stream order is the hand-over order
	cfg.Pace.PerSecond = 20
	e.startReplica(t, cfg, "failover-a", nil)
	waitIndexed(t, e, "a-spot", "b-od", "c-res", "d-od")
	e.beat(t, "n1", epoch)()
	var got []string
	eventually(t, func() error {
		got = got[:0]
		for _, m := range events[*shizuv1.RentalMigrating](t, e, topology.StreamRentals, subject.RentalMigratingAll) {
			got = append(got, m.GetRentalId())
		}
		if len(got) != 4 {
			return fmt.Errorf("%v so far", got)
		}
		return nil
	})
	if want := []string{"c-res", "b-od", "d-od", "a-spot"}; !slices.Equal(got, want) {
		t.Fatalf("handed over %v, want %v", got, want)
	}
}

func sumCounter(t testing.TB, reader *sdkmetric.ManualReader, name string, attr ...string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok {
				t.Fatalf("%s is %T", name, m.Data)
			}
			for _, dp := range sum.DataPoints {
				match := true
				for i := 0; i+1 < len(attr); i += 2 {
					v, ok := dp.Attributes.Value(attributeKey(attr[i]))
					match = match && ok && v.AsString() == attr[i+1]
				}
				if match {
					total += dp.Value
				}
			}
		}
	}
	return total
}

func histogramCount(t testing.TB, reader *sdkmetric.ManualReader, name string) uint64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if h, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == name {
				for _, dp := range h.DataPoints {
					n += dp.Count
				}
			}
		}
	}
	return n
}

func TestOfTwoRacingReplicasExactlyOneFencesAndMoves(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Second)
	epoch := e.node(t, "n1", 8)
	var rentals []string
	for g := range 8 {
		r := fmt.Sprintf("r%d", g)
		rentals = append(rentals, r)
		e.rent(t, r, "n1", epoch, shizuv1.Plan_PLAN_ON_DEMAND, g)
	}
	reader := sdkmetric.NewManualReader()
	m, err := app.NewMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	e.startReplica(t, testConfig(), "failover-a", m)
	e.startReplica(t, testConfig(), "failover-b", m)
	waitIndexed(t, e, rentals...)
	e.beat(t, "n1", epoch)()

	eventually(t, func() error {
		if won, lost := sumCounter(t, reader, "shizu.failover.fences", "shizu.outcome", "won"),
			sumCounter(t, reader, "shizu.failover.fences", "shizu.outcome", "lost"); won+lost < 2 {
			return fmt.Errorf("fence decisions so far: %d won, %d lost", won, lost)
		}
		if got := len(migratingByRental(t, e)); got != 8 {
			return fmt.Errorf("%d moved so far", got)
		}
		return nil
	})
	if won := sumCounter(t, reader, "shizu.failover.fences", "shizu.outcome", "won"); won != 1 {
		t.Fatalf("%d replicas won the fence, want 1", won)
	}
	// Only the winner hands rentals over: one publish per rental, not two
	// deduplicated by the stream.
	if n := sumCounter(t, reader, "shizu.failover.migrations"); n != 8 {
		t.Fatalf("%d RentalMigrating published, want 8", n)
	}
	if lost := events[*shizuv1.NodeLost](t, e, topology.StreamNodes, subject.NodeLostAll); len(lost) != 1 {
		t.Fatalf("%d NodeLost, want 1", len(lost))
	}
	if histogramCount(t, reader, "shizu.failover.detection") != 1 {
		t.Fatal("detection time not recorded once")
	}
}

func TestAFailedGPUMovesOnlyItsRentals(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Second)
	epoch := e.node(t, "n1", 8)
	e.rentShare(t, "frac-a", "n1", epoch, shizuv1.Plan_PLAN_ON_DEMAND, 500, 3)
	e.rentShare(t, "frac-b", "n1", epoch, shizuv1.Plan_PLAN_SPOT, 500, 3)
	e.rent(t, "pair-4-5", "n1", epoch, shizuv1.Plan_PLAN_ON_DEMAND, 4, 5)
	e.rent(t, "on-6", "n1", epoch, shizuv1.Plan_PLAN_ON_DEMAND, 6)
	e.startReplica(t, testConfig(), "failover-a", nil)
	waitIndexed(t, e, "frac-a", "frac-b", "pair-4-5", "on-6")
	e.beat(t, "n1", epoch)
	e.publishValid(t, subject.NodeHealth, "n1", &shizuv1.NodeHealthChanged{
		Meta: meta(fmt.Sprintf("node:n1:health:%d:3:3", epoch), "n1"), NodeId: "n1", Epoch: int64(epoch),
		GpuIndex: 3, PreviousHealth: shizuv1.Health_HEALTH_HEALTHY, Health: shizuv1.Health_HEALTH_FAILED,
		Xid: 79, Reason: "GPU has fallen off the bus",
	})
	eventually(t, func() error {
		if got := migratingByRental(t, e); len(got) != 2 {
			return fmt.Errorf("%d moved so far", len(got))
		}
		return nil
	})
	got := migratingByRental(t, e)
	for _, r := range []string{"frac-a", "frac-b"} {
		if m := got[r]; m == nil || m.GetReason() != shizuv1.MigrationReason_MIGRATION_REASON_NODE_UNHEALTHY || m.GetNextAttempt() != 2 {
			t.Errorf("%s: %v", r, m)
		}
	}
	st, err := e.store.Node(t.Context(), "n1")
	if err != nil {
		t.Fatal(err)
	}
	if st.Status != capacity.StatusReady || st.Epoch != epoch {
		t.Fatalf("n1 is %s at %d: a GPU failure must not fence the node", st.Status, st.Epoch)
	}
	var kept []string
	for _, a := range st.Allocations {
		kept = append(kept, a.RentalID)
	}
	if want := []string{"on-6", "pair-4-5"}; !slices.Equal(kept, want) {
		t.Fatalf("n1 holds %v, want %v", kept, want)
	}
	if free := st.FreeGPUs[3].Milli; free != capacity.MilliPerGPU {
		t.Fatalf("GPU 3 has %d milli free after its rentals left, want all", free)
	}
	stops := events[*shizuv1.StopRental](t, e, topology.StreamAgentCmds, "agent.n1.cmd.stop")
	var stopped []string
	for _, s := range stops {
		if s.GetAttempt() != 1 || s.GetReason() != shizuv1.ExitReason_EXIT_REASON_NODE_FAILED {
			t.Errorf("stop %v", s)
		}
		stopped = append(stopped, s.GetRentalId())
	}
	slices.Sort(stopped)
	if want := []string{"frac-a", "frac-b"}; !slices.Equal(stopped, want) {
		t.Fatalf("stopped %v, want %v", stopped, want)
	}
}

func TestAMovedRentalThatStartsAgainIsMigratedWithItsDowntime(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Second)
	epoch := e.node(t, "n1", 8)
	e.node(t, "n2", 8)
	e.rent(t, "r1", "n1", epoch, shizuv1.Plan_PLAN_ON_DEMAND, 0)
	reader := sdkmetric.NewManualReader()
	m, err := app.NewMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	e.startReplica(t, testConfig(), "failover-a", m)
	waitIndexed(t, e, "r1")
	e.beat(t, "n1", epoch)()
	var mg *shizuv1.RentalMigrating
	eventually(t, func() error {
		if mg = migratingByRental(t, e)["r1"]; mg == nil {
			return fmt.Errorf("not moved yet")
		}
		return nil
	})
	// The scheduler places attempt 2 on n2 and its agent starts it.
	e.publishValid(t, subject.RentalScheduled, "acme", &shizuv1.RentalScheduled{
		Meta: meta("rental:r1:scheduled:2", "r1"), RentalId: "r1", TenantId: "acme", NodeId: "n2", NodeEpoch: 1,
		Gpus:     []*shizuv1.GpuAssignment{{GpuIndex: 0, GpuUuid: "GPU-n2-0", MilliGpu: 1000, VramMib: 81920}},
		CpuMilli: 1000, MemoryMib: 1024, Spec: mg.GetSpec(), GpuModel: "H100-SXM5-80GB", Zone: "z1", Attempt: 2,
	})
	startedAt := time.Now()
	e.publishValid(t, subject.RentalStarted, "acme", &shizuv1.RentalStarted{
		Meta: meta("rental:r1:started:2", "r1"), RentalId: "r1", TenantId: "acme", NodeId: "n2", NodeEpoch: 1,
		StartedAt: timestamppb.New(startedAt), GpuUuids: []string{"GPU-n2-0"}, Attempt: 2,
	})
	var done []*shizuv1.RentalMigrated
	eventually(t, func() error {
		if done = events[*shizuv1.RentalMigrated](t, e, topology.StreamRentals, subject.RentalMigratedAll); len(done) != 1 {
			return fmt.Errorf("%d migrated", len(done))
		}
		return nil
	})
	got := done[0]
	want := startedAt.Sub(mg.GetLastHeartbeatAt().AsTime())
	if got.GetToNodeId() != "n2" || got.GetFromNodeId() != "n1" || got.GetDowntime().AsDuration() != want ||
		got.GetCheckpointUri() != "s3://ckpt/run/" || got.GetMeta().GetEventId() != "rental:r1:migrated:2" {
		t.Fatalf("migrated %v, want n1 -> n2 with downtime %s", got, want)
	}
	if histogramCount(t, reader, "shizu.failover.downtime") != 1 || histogramCount(t, reader, "shizu.failover.fence_to_scheduled") != 1 {
		t.Fatal("downtime or fence-to-scheduled not recorded")
	}
	if exists, _ := e.Redis.Client(t).Exists(t.Context(), "shizu:failover:migration:r1").Result(); exists != 0 {
		t.Fatal("the finished migration is still recorded")
	}
}

func TestASpotNoticeMovesRentalsBeforeBreakingThem(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Second)
	epoch := e.node(t, "n1", 8)
	e.rent(t, "s1", "n1", epoch, shizuv1.Plan_PLAN_SPOT, 0)
	e.startReplica(t, testConfig(), "failover-a", nil)
	waitIndexed(t, e, "s1")
	e.beat(t, "n1", epoch)
	e.publishValid(t, subject.NodeInterruption, "n1", &shizuv1.NodeInterruptionNoticed{
		Meta: meta(fmt.Sprintf("node:n1:interruption:%d", epoch), "n1"), NodeId: "n1", Epoch: int64(epoch),
		Deadline: timestamppb.New(time.Now().Add(time.Hour)), Reason: "reclaim",
	})
	var mg *shizuv1.RentalMigrating
	eventually(t, func() error {
		if mg = migratingByRental(t, e)["s1"]; mg == nil {
			return fmt.Errorf("not moved yet")
		}
		return nil
	})
	if mg.GetReason() != shizuv1.MigrationReason_MIGRATION_REASON_SPOT_INTERRUPTION || mg.GetNextAttempt() != 2 {
		t.Fatalf("migrating %v", mg)
	}
	st, err := e.store.Node(t.Context(), "n1")
	if err != nil {
		t.Fatal(err)
	}
	// The node takes no new work, but the rental keeps running (and its
	// allocation, handed over: out of the rental index, so the scheduler
	// reserves the next attempt beside it) until the replacement starts.
	if st.Status != capacity.StatusDraining || len(st.Allocations) != 1 || !st.Allocations[0].HandingOver {
		t.Fatalf("n1 is %s with allocations %+v, want draining with the rental's handed over", st.Status, st.Allocations)
	}
	if err := e.store.Renew(t.Context(), "s1", "n1", epoch); err != nil {
		t.Fatalf("the old run can no longer renew its allocation: %v", err)
	}
	if _, err := e.store.Allocation(t.Context(), "s1"); !capacity.IsNotFound(err) {
		t.Fatalf("the rental's allocation is still indexed on n1: %v", err)
	}
	if stops := events[*shizuv1.StopRental](t, e, topology.StreamAgentCmds, "agent.n1.cmd.stop"); len(stops) != 0 {
		t.Fatalf("stopped before the replacement started: %v", stops)
	}
	// The replacement starts on n2: the old run is told to stop now, and
	// the move cost no downtime.
	e.publishValid(t, subject.RentalStarted, "acme", &shizuv1.RentalStarted{
		Meta: meta("rental:s1:started:2", "s1"), RentalId: "s1", TenantId: "acme", NodeId: "n2", NodeEpoch: 1,
		StartedAt: timestamppb.Now(), GpuUuids: []string{"GPU-n2-0"}, Attempt: 2,
	})
	eventually(t, func() error {
		stops := events[*shizuv1.StopRental](t, e, topology.StreamAgentCmds, "agent.n1.cmd.stop")
		done := events[*shizuv1.RentalMigrated](t, e, topology.StreamRentals, subject.RentalMigratedAll)
		if len(stops) != 1 || len(done) != 1 {
			return fmt.Errorf("%d stops, %d migrated", len(stops), len(done))
		}
		if stops[0].GetAttempt() != 1 || stops[0].GetReason() != shizuv1.ExitReason_EXIT_REASON_MIGRATED {
			t.Fatalf("stop %v", stops[0])
		}
		if done[0].GetDowntime().AsDuration() != 0 {
			t.Fatalf("make-before-break cost %s", done[0].GetDowntime().AsDuration())
		}
		return nil
	})
	// The old run stops: what it held on n1 comes back.
	e.publishValid(t, subject.RentalStopped, "acme", &shizuv1.RentalStopped{
		Meta: meta("rental:s1:stopped:1", "s1"), RentalId: "s1", TenantId: "acme", NodeId: "n1", NodeEpoch: int64(epoch),
		Attempt: 1, StartedAt: timestamppb.New(time.Now().Add(-time.Minute)), StoppedAt: timestamppb.Now(),
		ExitReason: shizuv1.ExitReason_EXIT_REASON_MIGRATED,
	})
	eventually(t, func() error {
		st, err := e.store.Node(t.Context(), "n1")
		if err != nil {
			return err
		}
		if len(st.Allocations) != 0 || st.FreeGPUs[0].Milli != capacity.MilliPerGPU {
			return fmt.Errorf("n1 still holds %+v", st.Allocations)
		}
		return nil
	})
}

func attributeKey(k string) attribute.Key { return attribute.Key(k) }

func TestANodeThatReportsItselfFailedIsFencedAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute) // no expiry within the test
	epoch := e.node(t, "n1", 8)
	e.rent(t, "r1", "n1", epoch, shizuv1.Plan_PLAN_ON_DEMAND, 0)
	e.rent(t, "r2", "n1", epoch, shizuv1.Plan_PLAN_SPOT, 1)
	e.startReplica(t, testConfig(), "failover-a", nil)
	waitIndexed(t, e, "r1", "r2")
	e.beat(t, "n1", epoch)
	e.publishValid(t, subject.NodeHealth, "n1", &shizuv1.NodeHealthChanged{
		Meta: meta(fmt.Sprintf("node:n1:health:%d:-1:3", epoch), "n1"), NodeId: "n1", Epoch: int64(epoch),
		GpuIndex: -1, PreviousHealth: shizuv1.Health_HEALTH_DEGRADED, Health: shizuv1.Health_HEALTH_FAILED,
		Reason: "every GPU failed",
	})
	eventually(t, func() error {
		if got := migratingByRental(t, e); len(got) != 2 {
			return fmt.Errorf("%d moved", len(got))
		}
		return nil
	})
	lost := events[*shizuv1.NodeLost](t, e, topology.StreamNodes, subject.NodeLostAll)
	if len(lost) != 1 || lost[0].GetReason() != shizuv1.NodeLostReason_NODE_LOST_REASON_FATAL_HEALTH {
		t.Fatalf("NodeLost %v, want one FATAL_HEALTH", lost)
	}
	for r, m := range migratingByRental(t, e) {
		if m.GetReason() != shizuv1.MigrationReason_MIGRATION_REASON_NODE_UNHEALTHY {
			t.Errorf("%s moves for %s", r, m.GetReason())
		}
	}
	if st, _ := e.store.Node(t.Context(), "n1"); st.Status != capacity.StatusDead || len(st.Allocations) != 0 {
		t.Fatalf("n1 is %s with %d allocations", st.Status, len(st.Allocations))
	}
}
