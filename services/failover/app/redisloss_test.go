package app_test

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// restoreNode registers a node again after Redis came back empty and
// reserves its rentals' allocations again, as its agent does (the capacity
// store's own recovery), and returns the new epoch.
func (e *env) restoreNode(t testing.TB, id string, gpus int, rentals map[string]int) uint64 {
	t.Helper()
	epoch := e.node(t, id, gpus)
	for rental, gpu := range rentals {
		p := capacity.Placement{RentalID: rental, NodeID: id, Epoch: epoch, Tenant: "acme", CPUMilli: 1000, MemoryMiB: 1024,
			GPUs: []capacity.GPUShare{{Index: gpu, Milli: 1000, VRAMMiB: 81920}}}
		if _, err := e.store.Reserve(t.Context(), p); err != nil {
			t.Fatal(err)
		}
	}
	return epoch
}

func TestANodeLostAfterRedisCameBackEmptyMovesItsRentalsWithTheirSpecs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Second)
	epoch := e.node(t, "n1", 8)
	e.node(t, "n2", 8)
	e.rent(t, "r-od", "n1", epoch, shizuv1.Plan_PLAN_ON_DEMAND, 0)
	e.rent(t, "r-res", "n1", epoch, shizuv1.Plan_PLAN_RESERVED, 1)
	e.startReplica(t, testConfig(), "failover-a", nil)
	waitIndexed(t, e, "r-od", "r-res")

	e.Redis.Restart(t) // comes back empty
	epoch = e.restoreNode(t, "n1", 8, map[string]int{"r-od": 0, "r-res": 1})
	e.restoreNode(t, "n2", 8, nil)
	stop := e.beat(t, "n1", epoch)
	e.beat(t, "n2", 1)
	stop() // the agent dies

	eventually(t, func() error {
		if got := migratingByRental(t, e); len(got) != 2 {
			return fmt.Errorf("%d RentalMigrating so far", len(got))
		}
		return nil
	})
	for r, m := range migratingByRental(t, e) {
		if m.GetSpec() == nil || m.GetFromAttempt() != 1 || m.GetNextAttempt() != 2 || m.GetCheckpointUri() != "s3://ckpt/run/" {
			t.Errorf("%s: the re-queue lacks its spec, attempts or checkpoint: %v", r, m)
		}
	}
}

func TestAMoveInFlightWhenRedisIsLostIsCompletedByItsStart(t *testing.T) {
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
	eventually(t, func() error {
		if migratingByRental(t, e)["s1"] == nil {
			return fmt.Errorf("not moved yet")
		}
		return nil
	})

	e.Redis.Restart(t) // the move's record is gone with it
	// The replacement starts on n2: the old run must still be told to stop
	// (else it runs, and is billed, beside the new one until the deadline)
	// and the move completed.
	e.publishValid(t, subject.RentalStarted, "acme", &shizuv1.RentalStarted{
		Meta: meta("rental:s1:started:2", "s1"), RentalId: "s1", TenantId: "acme", NodeId: "n2", NodeEpoch: 1,
		StartedAt: timestamppb.Now(), GpuUuids: []string{"GPU-n2-0"}, Attempt: 2,
	})
	eventually(t, func() error {
		stops := events[*shizuv1.StopRental](t, e, topology.StreamAgentCmds, "agent.n1.cmd.stop")
		done := events[*shizuv1.RentalMigrated](t, e, topology.StreamRentals, subject.RentalMigratedAll)
		if len(stops) != 1 || len(done) != 1 {
			return fmt.Errorf("%d stops of the old run, %d RentalMigrated", len(stops), len(done))
		}
		if stops[0].GetAttempt() != 1 || stops[0].GetReason() != shizuv1.ExitReason_EXIT_REASON_MIGRATED {
			t.Fatalf("stop %v", stops[0])
		}
		return nil
	})
	if n, _ := e.Redis.Client(t).Exists(t.Context(), "shizu:failover:migration:s1").Result(); n != 0 {
		t.Fatal("the completed move is still recorded")
	}
}
