package app_test

import (
	"fmt"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/failover/app"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/subject"
)

func TestAFlappingNodeIsQuarantined(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Second)
	epoch := flap(t, e, time.Hour, nil)
	eventually(t, func() error {
		st, err := e.store.Node(t.Context(), "n1")
		if err != nil {
			return err
		}
		if st.Status != capacity.StatusDraining || st.Epoch != epoch {
			return fmt.Errorf("n1 is %s at %d, want quarantined (draining) at %d", st.Status, st.Epoch, epoch)
		}
		return nil
	})
	raw, err := e.Redis.Client(t).HGet(t.Context(), "shizu:failover:quarantine", "n1").Result()
	if err != nil || raw == "" {
		t.Fatalf("no quarantine record: %v", err)
	}
}

func TestAQuarantinedNodeTakesWorkAgainWhenItsQuarantineEnds(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Second)
	reader := sdkmetric.NewManualReader()
	m, err := app.NewMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	epoch := flap(t, e, 300*time.Millisecond, m)
	eventually(t, func() error {
		if n := sumCounter(t, reader, "shizu.failover.quarantines"); n != 1 {
			return fmt.Errorf("%d quarantines", n)
		}
		st, err := e.store.Node(t.Context(), "n1")
		if err != nil {
			return err
		}
		if st.Status != capacity.StatusReady || st.Epoch != epoch {
			return fmt.Errorf("n1 is %s at %d, want ready at %d", st.Status, st.Epoch, epoch)
		}
		n, err := e.Redis.Client(t).HLen(t.Context(), "shizu:failover:quarantine").Result()
		if err != nil {
			return err
		}
		if n != 0 {
			return fmt.Errorf("%d quarantine records left", n)
		}
		return nil
	})
}

// flap makes node n1 die twice and come back each time, with a failover
// replica that quarantines at the second loss for quarantine; it returns
// the node's last epoch.
func flap(t *testing.T, e *env, quarantine time.Duration, m *app.Metrics) uint64 {
	t.Helper()
	cfg := testConfig()
	cfg.Detect.FlapThreshold = 2
	cfg.Detect.QuarantineBase = quarantine
	cfg.Detect.QuarantineMax = quarantine
	e.startReplica(t, cfg, "failover-a", m)
	epoch := e.node(t, "n1", 2)
	register := func(epoch uint64) {
		e.publishValid(t, subject.NodeRegistered, "n1", &shizuv1.NodeRegistered{
			Meta: meta(fmt.Sprintf("node:n1:registered:%d", epoch), "n1"), NodeId: "n1", Epoch: int64(epoch), Zone: "z1",
			Market: shizuv1.Market_MARKET_ON_DEMAND, PricePerGpuHour: &shizuv1.Money{Micros: 2_000_000, Currency: "USD"},
			CpuMilli: 192_000, MemoryMib: 2 << 20,
			Gpus: []*shizuv1.Gpu{{Index: 0, Uuid: "GPU-n1-0", Model: "H100-SXM5-80GB", VramMib: 81920, PciBusId: "00000000:3B:00.0"},
				{Index: 1, Uuid: "GPU-n1-1", Model: "H100-SXM5-80GB", VramMib: 81920, PciBusId: "00000000:5D:00.0"}},
		})
	}
	register(epoch)
	for loss := 1; loss <= 2; loss++ {
		e.beat(t, "n1", epoch)() // beats once, then dies
		eventually(t, func() error {
			st, err := e.store.Node(t.Context(), "n1")
			if err != nil {
				return err
			}
			if st.Status != capacity.StatusDead {
				return fmt.Errorf("not fenced yet: %s", st.Status)
			}
			return nil
		})
		epoch = e.node(t, "n1", 2) // the agent comes back
		register(epoch)
	}
	e.beat(t, "n1", epoch) // and stays
	return epoch
}
