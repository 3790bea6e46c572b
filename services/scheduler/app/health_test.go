package app_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

func gpuHealth(node string, epoch int64, gpu int32, prev, now shizuv1.Health, xid int32) *shizuv1.NodeHealthChanged {
	return &shizuv1.NodeHealthChanged{
		Meta:   &shizuv1.EventMeta{EventId: fmt.Sprintf("node:%s:health:%d:%d:%d", node, gpu, now, time.Now().UnixNano()), OccurredAt: timestamppb.Now(), Source: "node-agent/" + node},
		NodeId: node, Epoch: epoch, GpuIndex: gpu, PreviousHealth: prev, Health: now, Xid: xid,
		Reason: "test",
	}
}

// GPU 1 of a two-GPU node falls off the bus (XID 79): from then on, neither
// of two replicas places anything on it, while GPU 0 keeps taking work;
// what does not fit on GPU 0 waits, and is placed on GPU 1 once the GPU is
// reported healthy again.
func TestAFailedGPUTakesNoNewRentals(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register(gpuNode("n1", 2, capacity.MarketOnDemand))
	cfg := testConfig()
	e.replica(cfg, time.Now)
	e.replica(cfg, time.Now)

	e.publish(gpuHealth("n1", 1, 1, shizuv1.Health_HEALTH_HEALTHY, shizuv1.Health_HEALTH_FAILED, 79))
	testkit.Eventually(t, 30*time.Second, func() error {
		st, err := e.store.Node(t.Context(), "n1")
		if err != nil {
			return err
		}
		if st.FreeGPUs[1].Health != capacity.HealthFailed {
			return fmt.Errorf("GPU 1 is %q in the store", st.FreeGPUs[1].Health)
		}
		return nil
	})

	// Four quarters fill GPU 0's sharer slots; a fifth fits only on GPU 1.
	var ids []string
	for i := range 5 {
		id := fmt.Sprintf("q%d", i)
		ids = append(ids, id)
		e.publish(requested(id, "acme", spec(1, 250, 8*1024, shizuv1.Plan_PLAN_ON_DEMAND), time.Now()))
	}
	var late string
	e.seen.waitFor(t, 30*time.Second, func(o *outcomes) error {
		placed, waiting := 0, 0
		for _, id := range ids {
			switch {
			case len(o.scheduled[id]) > 0:
				placed++
			case len(o.pending[id]) > 0:
				waiting++
				late = id
			}
		}
		if placed != 4 || waiting != 1 {
			return fmt.Errorf("%d scheduled, %d pending; want 4 and 1", placed, waiting)
		}
		return nil
	})
	e.seen.mu.Lock()
	for _, id := range ids {
		for _, s := range e.seen.scheduled[id] {
			if g := s.GetGpus()[0].GetGpuIndex(); g != 0 {
				t.Errorf("%s was placed on GPU %d, which had failed", id, g)
			}
		}
	}
	e.seen.mu.Unlock()

	// The GPU is healthy again: the waiting request lands on it.
	e.publish(gpuHealth("n1", 1, 1, shizuv1.Health_HEALTH_FAILED, shizuv1.Health_HEALTH_HEALTHY, 0))
	e.seen.waitFor(t, 30*time.Second, func(o *outcomes) error {
		if len(o.scheduled[late]) == 0 {
			return errors.New(late + " not scheduled")
		}
		if g := o.scheduled[late][0].GetGpus()[0].GetGpuIndex(); g != 1 {
			return fmt.Errorf("%s placed on GPU %d, want 1", late, g)
		}
		return nil
	})
}
