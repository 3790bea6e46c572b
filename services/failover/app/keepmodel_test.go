package app_test

import (
	"fmt"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
)

// A rental that named no model ran on 80 GB GPUs: its re-placement asks
// for at least that much memory per GPU, so it cannot land on a 24 GB
// card; a rental that named its models keeps exactly those.
func TestAMovedRentalAsksForAtLeastTheGPUMemoryItRanWith(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Second)
	epoch := e.node(t, "n1", 8)
	e.rent(t, "r-any", "n1", epoch, shizuv1.Plan_PLAN_ON_DEMAND, 0, 1) // spec: no model, no vram_mib
	e.startReplica(t, testConfig(), "failover-a", nil)
	waitIndexed(t, e, "r-any")
	e.beat(t, "n1", epoch)() // the agent dies

	var m *shizuv1.RentalMigrating
	eventually(t, func() error {
		if m = migratingByRental(t, e)["r-any"]; m == nil {
			return fmt.Errorf("r-any not moved yet")
		}
		return nil
	})
	if got := m.GetSpec().GetVramMib(); got < 81920 {
		t.Fatalf("the re-placement asks for %d MiB per GPU; it ran on 81920 MiB GPUs (H100-SXM5-80GB)", got)
	}
	if len(m.GetSpec().GetAllowedModels()) != 0 || m.GetSpec().GetGpuCount() != 2 || m.GetSpec().GetPlan() != shizuv1.Plan_PLAN_ON_DEMAND {
		t.Fatalf("the rest of the spec changed: %v", m.GetSpec())
	}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
}

// A moved rental's RentalMigrating names the GPU model it ran on (from
// its RentalScheduled), so the scheduler can prefer that model again.
func TestAMovedRentalNamesTheGPUModelItRanOn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Second)
	epoch := e.node(t, "n1", 8)
	e.rent(t, "r-model", "n1", epoch, shizuv1.Plan_PLAN_ON_DEMAND, 0) // ran on H100-SXM5-80GB
	e.startReplica(t, testConfig(), "failover-a", nil)
	waitIndexed(t, e, "r-model")
	e.beat(t, "n1", epoch)() // the agent dies

	var m *shizuv1.RentalMigrating
	eventually(t, func() error {
		if m = migratingByRental(t, e)["r-model"]; m == nil {
			return fmt.Errorf("r-model not moved yet")
		}
		return nil
	})
	if got := m.GetFromGpuModel(); got != "H100-SXM5-80GB" {
		t.Fatalf("from_gpu_model = %q, want the model it ran on, H100-SXM5-80GB", got)
	}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
}
