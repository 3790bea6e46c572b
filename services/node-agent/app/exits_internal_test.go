package app

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/node-agent/app/agenttest"
	"github.com/shizu-gpu/shizu/services/node-agent/runtime"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

// exiting is an agent over fakes (withFakes) with a real process runtime
// over dir and its exits loop running until the test ends.
func exiting(t *testing.T, dir string) (*nodeAgent, *sdkmetric.ManualReader) {
	t.Helper()
	a, _, _, _ := withFakes(t)
	rt, err := runtime.NewProcess(dir)
	if err != nil {
		t.Fatal(err)
	}
	reader := sdkmetric.NewManualReader()
	if a.m, err = newMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter(meterName), a.runningCount); err != nil {
		t.Fatal(err)
	}
	a.rt = rt
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.exitsLoop(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = rt.Close()
	})
	return a, reader
}

func runWorkload(t *testing.T, a *nodeAgent, rental string, command ...string) {
	t.Helper()
	if _, err := a.rt.Start(t.Context(), runtime.Spec{RentalID: rental, TenantID: "acme", Attempt: 1, Epoch: 3,
		GPUUUIDs: []string{"GPU-0"}, MilliGPU: 1000, Command: command}); err != nil {
		t.Fatal(err)
	}
}

func stoppedHeld(t *testing.T, a *nodeAgent) map[string]*shizuv1.RentalStopped {
	t.Helper()
	out := map[string]*shizuv1.RentalStopped{}
	for _, ev := range held(t, a.bus.(*agenttest.Bus), "rental.acme.stopped",
		func() *shizuv1.RentalStopped { return &shizuv1.RentalStopped{} }) {
		out[ev.GetRentalId()] = ev
	}
	return out
}

// A stop the bus refuses for good (an event that does not encode is
// fault.ErrInvalid, as bus.Conn.Publish returns it) must not hold up the
// exits of every later workload on the node: the agent reports what it
// can of it (the reason, the exit code and the times, without the
// workload's detail) and moves on.
func TestAStopTheBusRefusesForGoodIsReportedWithoutItsDetailAndLaterExitsStillGetReported(t *testing.T) {
	t.Parallel()
	a, _ := exiting(t, t.TempDir())
	b := a.bus.(*agenttest.Bus)
	b.Refuse(func(_ string, ev proto.Message) error {
		if s, ok := ev.(*shizuv1.RentalStopped); ok && strings.Contains(s.GetMessage(), "poison") {
			return fault.Invalid("encode shizu.v1.RentalStopped: string field contains invalid UTF-8")
		}
		return nil
	})
	runWorkload(t, a, "r-poison", "sh", "-c", "echo poison; exit 4")
	testkit.Eventually(t, 20*time.Second, func() error {
		if _, ok := stoppedHeld(t, a)["r-poison"]; !ok {
			return errors.New("r-poison's stop is not reported")
		}
		return nil
	})
	runWorkload(t, a, "r-next", "sh", "-c", "echo fine; exit 0")
	testkit.Eventually(t, 20*time.Second, func() error {
		if _, ok := stoppedHeld(t, a)["r-next"]; !ok {
			return errors.New("the exit after a refused stop is not reported")
		}
		return nil
	})
	got := stoppedHeld(t, a)
	if p := got["r-poison"]; p.GetExitReason() != shizuv1.ExitReason_EXIT_REASON_FAILED || p.GetExitCode() != 4 ||
		strings.Contains(p.GetMessage(), "poison") || p.GetStoppedAt().AsTime().Before(p.GetStartedAt().AsTime()) {
		t.Fatalf("r-poison stopped = %v", p)
	}
	if n := got["r-next"]; n.GetExitReason() != shizuv1.ExitReason_EXIT_REASON_COMPLETED || n.GetMessage() != "fine" {
		t.Fatalf("r-next stopped = %v", n)
	}
	refused := 0
	for _, c := range b.Calls() {
		if s, ok := c.Event.(*shizuv1.RentalStopped); ok && s.GetRentalId() == "r-poison" && c.Err != nil {
			refused++
		}
	}
	if refused != 1 {
		t.Fatalf("the refused stop was tried %d times, want once (a permanent error is not retried)", refused)
	}
}

// When even the bare stop is refused for good, the agent gives up on it
// (the record stays for the next agent) and still reports later exits.
func TestAStopRefusedEvenWithoutItsDetailDoesNotBlockLaterExits(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a, _ := exiting(t, dir)
	b := a.bus.(*agenttest.Bus)
	b.Refuse(func(_ string, ev proto.Message) error {
		if s, ok := ev.(*shizuv1.RentalStopped); ok && s.GetRentalId() == "r-denied" {
			return fault.Invalid("publish to rental.acme.stopped: refused")
		}
		return nil
	})
	runWorkload(t, a, "r-denied", "true")
	runWorkload(t, a, "r-next", "sh", "-c", "sleep 0.2")
	testkit.Eventually(t, 20*time.Second, func() error {
		if _, ok := stoppedHeld(t, a)["r-next"]; !ok {
			return errors.New("the exit after a refused stop is not reported")
		}
		return nil
	})
	tries := 0
	for _, c := range b.Calls() {
		if s, ok := c.Event.(*shizuv1.RentalStopped); ok && s.GetRentalId() == "r-denied" {
			tries++
		}
	}
	if tries != 2 {
		t.Fatalf("the refused stop was tried %d times, want twice (with and without its detail)", tries)
	}
}
