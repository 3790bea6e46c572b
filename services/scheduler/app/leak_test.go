package app_test

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/app"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

// Every reservation ends with its rental, whatever happens between the
// reserve and the outcome record: the failpoint there (app.SetAfterReserve)
// plays a replica killed after its reserve, before it recorded anything
// (its delivery is not acknowledged, so it comes again).

// heldStill describes an allocation read that found it (err nil) or
// failed.
func heldStill(what string, err error) error {
	if err == nil {
		return errors.New(what)
	}
	return fmt.Errorf("%s (reading it: %w)", what, err)
}

var errCrashed = errors.New("failpoint: the replica died after its reserve")

// crashOnce fails the first round that reserved rental, after waiting for
// release to be closed (nil: at once), and lets every other round through.
// entered is closed when the failpoint is reached.
type crashOnce struct {
	rental  string
	release chan struct{}
	entered chan struct{}
	once    sync.Once
}

func newCrashOnce(rental string, wait bool) *crashOnce {
	c := &crashOnce{rental: rental, entered: make(chan struct{})}
	if wait {
		c.release = make(chan struct{})
	}
	return c
}

func (c *crashOnce) hook(s *app.Scheduler) {
	app.SetAfterReserve(s, func(rentals []string) error {
		if !slices.Contains(rentals, c.rental) {
			return nil
		}
		crash := false
		c.once.Do(func() {
			crash = true
			close(c.entered)
			if c.release != nil {
				<-c.release
			}
		})
		if crash {
			return errCrashed
		}
		return nil
	})
}

func TestARequestRedeliveredAfterACrashBetweenReserveAndRecordAdoptsItsReservation(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register(gpuNode("n1", 1, capacity.MarketOnDemand))
	crash := newCrashOnce("r1", false)
	e.replicaWith(testConfig(), time.Now, crash.hook)
	e.publish(requested("r1", "acme", spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), time.Now()))
	<-crash.entered
	// The redelivery finds the node full of its own reservation: it must
	// take that reservation as its placement, not wait for capacity.
	e.seen.waitFor(t, 30*time.Second, func(o *outcomes) error {
		if len(o.pending["r1"]) > 0 {
			return fmt.Errorf("r1 went pending against its own reservation: %v", o.pending["r1"][0])
		}
		s, err := scheduledOf(o, "r1")
		if err == nil && s.GetNodeId() != "n1" {
			return fmt.Errorf("r1 on %s", s.GetNodeId())
		}
		return err
	})
	a, err := e.store.Allocation(t.Context(), "r1")
	if err != nil || a.NodeID != "n1" {
		t.Fatalf("r1's allocation: %v, %v", a, err)
	}
}

func TestACancelBetweenReserveAndRecordFreesTheReservation(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register(gpuNode("n1", 1, capacity.MarketOnDemand))
	crash := newCrashOnce("r2", true)
	e.replicaWith(testConfig(), time.Now, crash.hook)
	e.publish(requested("r2", "acme", spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), time.Now()))
	<-crash.entered
	// Reserved, not recorded: the tenant cancels now, then the replica dies.
	e.publish(cancel("r2", "acme"))
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) error {
		if len(o.rejected["r2"]) != 1 || o.rejected["r2"][0].GetReason() != shizuv1.RejectReason_REJECT_REASON_CANCELLED {
			return fmt.Errorf("r2: %v", o.rejected["r2"])
		}
		return nil
	})
	close(crash.release)
	testkit.Eventually(t, 30*time.Second, func() error {
		if _, err := e.store.Allocation(t.Context(), "r2"); !capacity.IsNotFound(err) {
			return heldStill("the cancelled rental still holds capacity", err)
		}
		return nil
	})
	// The GPU is free for the next request.
	e.publish(requested("r3", "acme", spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), time.Now()))
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) (err error) { _, err = scheduledOf(o, "r3"); return })
	e.seen.mu.Lock()
	defer e.seen.mu.Unlock()
	if len(e.seen.scheduled["r2"]) != 0 || e.seen.starts["r2"] != 0 {
		t.Fatal("the cancelled rental was scheduled")
	}
}

// An allocation no live rental owns (left by a replica that died before
// it recorded anything, whose request will never come again) is freed by
// the reconciler once it is older than the reconcile age; the allocation
// of a scheduled rental stays.
func TestTheReconcilerFreesAllocationsNoLiveRentalOwns(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register(gpuNode("n1", 2, capacity.MarketOnDemand))
	ghost := capacity.Placement{RentalID: "ghost", NodeID: "n1", Epoch: 1, Tenant: "acme", CPUMilli: 1000, MemoryMiB: 1024,
		GPUs: []capacity.GPUShare{{Index: 0, Milli: 1000, VRAMMiB: 80 * 1024}}}
	if _, err := e.store.Reserve(t.Context(), ghost); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.ReconcileInterval, cfg.ReconcileAge = 50*time.Millisecond, 500*time.Millisecond
	e.replica(cfg, time.Now)
	e.publish(requested("live", "acme", spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), time.Now()))
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) (err error) { _, err = scheduledOf(o, "live"); return })
	live, err := e.store.Allocation(t.Context(), "live")
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, func() error {
		if _, err := e.store.Allocation(t.Context(), "ghost"); !capacity.IsNotFound(err) {
			return heldStill("the ghost allocation is still held", err)
		}
		return nil
	})
	// Wait until the live allocation is older than the age too, and a
	// reconcile ran after that: a ghost reserved now is freed only by a
	// pass that also saw live as old enough.
	ghost.RentalID = "ghost2"
	if _, err := e.store.Reserve(t.Context(), ghost); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, func() error {
		if _, err := e.store.Allocation(t.Context(), "ghost2"); !capacity.IsNotFound(err) {
			return heldStill("the second ghost allocation is still held", err)
		}
		return nil
	})
	if a, err := e.store.Allocation(t.Context(), "live"); err != nil || !a.CreatedAt.Equal(live.CreatedAt) {
		t.Fatalf("the scheduled rental lost its allocation: %v, %v", a, err)
	}
}
