package app_test

import (
	"fmt"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// A replica that died between recording its moves and handing them over
// (its records say not published) leaves work the sweep of another
// replica finishes: the allocations on the fenced node are released and
// each rental is handed over once.
func TestMovesRecordedButNeverHandedOverAreFinishedByTheSweep(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Second)
	epoch := e.node(t, "n1", 8)
	e.rent(t, "r1", "n1", epoch, shizuv1.Plan_PLAN_ON_DEMAND, 0)
	e.rent(t, "r2", "n1", epoch, shizuv1.Plan_PLAN_ON_DEMAND, 1)
	e.node(t, "n2", 8)
	e.beat(t, "n2", 1)
	if _, err := e.store.Fence(t.Context(), "n1", epoch); err != nil {
		t.Fatal(err)
	}
	// What the dead replica wrote (records.go's format) before it died.
	rdb := e.Redis.Client(t)
	decided := time.Now().Add(-time.Minute)
	for _, r := range []string{"r1", "r2"} {
		raw := fmt.Sprintf(`{"rental":%q,"tenant":"acme","from_node":"n1","from_epoch":%d,"from_attempt":1,"next_attempt":2,`+
			`"reason":%d,"mode":"break","last_beat":%q,"last_alive":%q,"decided_at":%q,"cause":"node:n1:lost:%d","class":1}`,
			r, epoch, shizuv1.MigrationReason_MIGRATION_REASON_NODE_LOST, decided.Add(-3*time.Second).Format(time.RFC3339Nano),
			decided.Add(-3*time.Second).Format(time.RFC3339Nano), decided.Format(time.RFC3339Nano), epoch)
		if err := rdb.Set(t.Context(), "shizu:failover:migration:"+r, raw, 0).Err(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.SAdd(t.Context(), "shizu:failover:migrations", r).Err(); err != nil {
			t.Fatal(err)
		}
	}
	cfg := testConfig()
	cfg.Sweep = 200 * time.Millisecond
	e.startReplica(t, cfg, "failover-b", nil)
	eventually(t, func() error {
		got := migratingByRental(t, e)
		if got["r1"] == nil || got["r2"] == nil {
			return fmt.Errorf("handed over %d of 2", len(got))
		}
		st, err := e.store.Node(t.Context(), "n1")
		if err != nil {
			return err
		}
		if len(st.Allocations) != 0 {
			return fmt.Errorf("n1 still holds %d allocations", len(st.Allocations))
		}
		return nil
	})
	if ms := events[*shizuv1.RentalMigrating](t, e, topology.StreamRentals, subject.RentalMigratingAll); len(ms) != 2 {
		t.Fatalf("%d RentalMigrating, want one per rental", len(ms))
	}
}

func TestANodeThatDiedWhileNoReplicaWatchedIsFoundByTheSweep(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Second)
	epoch := e.node(t, "n1", 8)
	e.rent(t, "r1", "n1", epoch, shizuv1.Plan_PLAN_ON_DEMAND, 0)
	e.node(t, "n2", 8)
	e.beat(t, "n2", 1) // alive throughout
	// n1 never beats while failover runs.
	cfg := testConfig()
	cfg.Sweep = 200 * time.Millisecond
	e.startReplica(t, cfg, "failover-a", nil)
	eventually(t, func() error {
		if m := migratingByRental(t, e)["r1"]; m == nil {
			return fmt.Errorf("r1 not moved")
		}
		return nil
	})
	if st, _ := e.store.Node(t.Context(), "n2"); st.Status != capacity.StatusReady {
		t.Fatalf("the beating node n2 is %s", st.Status)
	}
	lost := events[*shizuv1.NodeLost](t, e, topology.StreamNodes, subject.NodeLostAll)
	if len(lost) != 1 || lost[0].GetNodeId() != "n1" {
		t.Fatalf("NodeLost %v, want n1 only", lost)
	}
}
