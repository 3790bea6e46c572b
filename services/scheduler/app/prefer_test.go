package app_test

import (
	"errors"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/capacity"
)

// a100Node is gpuNode with A100 80 GB GPUs.
func a100Node(id string, n int) capacity.Node {
	node := gpuNode(id, n, capacity.MarketOnDemand)
	for i := range node.GPUs {
		node.GPUs[i].Model = "A100-SXM4-80GB"
	}
	return node
}

// A rental that named no model ran on an A100; failover moves it with
// from_gpu_model A100 (and the 80 GB floor). With A100 and H100 nodes
// free, it lands on the A100 again.
func TestAMovedRentalPrefersTheGPUModelItRanOn(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register(a100Node("a0", 1))
	e.replica(testConfig(), time.Now)
	sp := spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND) // no model
	e.publish(requested("p1", "acme", sp, time.Now()))
	var first *shizuv1.RentalScheduled
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) (err error) { first, err = scheduledOf(o, "p1"); return })
	if first.GetGpuModel() != "A100-SXM4-80GB" {
		t.Fatalf("first placement on %s", first.GetGpuModel())
	}

	if _, err := e.store.Fence(t.Context(), "a0", uint64(first.GetNodeEpoch())); err != nil {
		t.Fatal(err)
	}
	e.register(gpuNode("h1", 1, capacity.MarketOnDemand), gpuNode("h2", 1, capacity.MarketOnDemand),
		a100Node("a1", 1), gpuNode("h3", 1, capacity.MarketOnDemand))
	moved := spec(1, 1000, 80*1024, shizuv1.Plan_PLAN_ON_DEMAND) // failover's floor
	m := migrating(first, moved)
	m.FromGpuModel = first.GetGpuModel()
	e.publish(m)
	var second *shizuv1.RentalScheduled
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) error {
		if len(o.scheduled["p1"]) < 2 {
			return errors.New("not placed again")
		}
		second = o.scheduled["p1"][1]
		return nil
	})
	if second.GetNodeId() != "a1" || second.GetGpuModel() != "A100-SXM4-80GB" {
		t.Fatalf("placed again on %s (%s); want the free A100 node a1", second.GetNodeId(), second.GetGpuModel())
	}
}
