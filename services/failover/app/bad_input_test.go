package app_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/failover/app"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

func TestMalformedNodeEventsAreDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Second)
	e.startReplica(t, testConfig(), "failover-a", nil)
	bad := &shizuv1.NodeHealthChanged{Meta: meta("node:n1:health:bad", "n1"), NodeId: "n1", Epoch: 1, GpuIndex: 3,
		Health: shizuv1.Health_HEALTH_FAILED, PreviousHealth: shizuv1.Health_HEALTH_FAILED}
	if bad.Validate() == nil {
		t.Fatal("the bad event is valid")
	}
	e.publish(t, subject.NodeHealth, "n1", bad)
	eventually(t, func() error {
		info, err := e.js.Stream(t.Context(), topology.StreamDeadLetter)
		if err != nil {
			return err
		}
		if info.CachedInfo().State.Msgs == 0 {
			if i, err := info.Info(t.Context()); err != nil || i.State.Msgs == 0 {
				return fmt.Errorf("no dead letter yet")
			}
		}
		return nil
	})
}

// A move that can never be published (its tenant id is no subject token)
// does not hold back the moves handed over with it: they go out, it stays
// on the dead node with its allocation, recorded as failed and counted.
func TestAMoveThatCannotBePublishedDoesNotStrandTheOthers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Second)
	epoch := e.node(t, "n1", 8)
	e.node(t, "n2", 8)
	e.rent(t, "r1", "n1", epoch, shizuv1.Plan_PLAN_ON_DEMAND, 0)
	e.rent(t, "r2", "n1", epoch, shizuv1.Plan_PLAN_ON_DEMAND, 1)
	// The capacity store takes any tenant without spaces; a subject token
	// must not contain a dot.
	bad := capacity.Placement{RentalID: "r-bad", NodeID: "n1", Epoch: epoch, Tenant: "bad.tenant", CPUMilli: 1000, MemoryMiB: 1024,
		GPUs: []capacity.GPUShare{{Index: 2, Milli: 1000, VRAMMiB: 81920}}}
	if _, err := e.store.Reserve(t.Context(), bad); err != nil {
		t.Fatal(err)
	}
	// Indexed as reserved (records.go's format), so it is first in storm
	// order: ahead of the two it must not hold back.
	rawSpec, err := proto.Marshal(spec(shizuv1.Plan_PLAN_RESERVED, 1, 1000))
	if err != nil {
		t.Fatal(err)
	}
	rdb := e.Redis.Client(t)
	if err := rdb.HSet(t.Context(), "shizu:failover:rental:r-bad", "attempt", "1", "tenant", "bad.tenant", "node", "n1", "spec", rawSpec).Err(); err != nil {
		t.Fatal(err)
	}
	reader := sdkmetric.NewManualReader()
	m, err := app.NewMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	e.startReplica(t, testConfig(), "failover-a", m)
	waitIndexed(t, e, "r1", "r2")
	e.beat(t, "n2", 1)
	e.beat(t, "n1", epoch)() // the agent dies

	eventually(t, func() error {
		if got := migratingByRental(t, e); got["r1"] == nil || got["r2"] == nil {
			return fmt.Errorf("handed over %d of 2", len(got))
		}
		if n := sumCounter(t, reader, "shizu.failover.move_failures"); n != 1 {
			return fmt.Errorf("%d move failures so far", n)
		}
		return nil
	})
	if got := migratingByRental(t, e); len(got) != 2 || got["r-bad"] != nil {
		t.Fatalf("RentalMigrating for %v, want r1 and r2 only", slices.Collect(maps.Keys(got)))
	}
	st, err := e.store.Node(t.Context(), "n1")
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Allocations) != 1 || st.Allocations[0].RentalID != "r-bad" {
		t.Fatalf("n1 holds %v, want only r-bad's allocation (the others released)", st.Allocations)
	}
	type record struct {
		Published bool   `json:"published"`
		Failed    string `json:"failed"`
	}
	recordOf := func(rental string) (record, []byte) {
		raw, err := rdb.Get(t.Context(), "shizu:failover:migration:"+rental).Bytes()
		if err != nil {
			t.Fatal(err)
		}
		var rec record
		if err := json.Unmarshal(raw, &rec); err != nil {
			t.Fatal(err)
		}
		return rec, raw
	}
	if rec, raw := recordOf("r-bad"); rec.Published || !strings.Contains(rec.Failed, "bad.tenant") {
		t.Fatalf("r-bad's record %s, want unpublished and failed naming the tenant", raw)
	}
	eventually(t, func() error { // marked handed over once the acks are in
		for _, r := range []string{"r1", "r2"} {
			if rec, raw := recordOf(r); !rec.Published || rec.Failed != "" {
				return fmt.Errorf("%s's record %s, want published", r, raw)
			}
		}
		return nil
	})
	if n := sumCounter(t, reader, "shizu.failover.migrations"); n != 2 {
		t.Fatalf("%d migrations counted, want 2", n)
	}
}
