package budgetkv_test

import (
	"errors"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/shared/budget"
	"github.com/shizu-gpu/shizu/shared/budget/budgetkv"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

func state(tenant string, at time.Time) budget.State {
	return budget.State{Tenant: tenant, Budget: "monthly", Month: budget.Month(at), SpentMicros: 10, LimitMicros: 10,
		Currency: "USD", Policy: budget.StopRunning, GraceMillis: 1000, ExhaustedAt: at}
}

// TestMeteringWritesAndTheSchedulerWatchesTheBudgetStates runs on a real
// nats-server with the topology's users: metering (the writer) creates
// the bucket and writes, the scheduler (a reader) opens and watches it.
func TestMeteringWritesAndTheSchedulerWatchesTheBudgetStates(t *testing.T) {
	d := testkit.Platform(t)
	sched := d.Connect(t, topology.Scheduler)
	if _, err := budgetkv.Open(t.Context(), sched.JetStream()); !errors.Is(err, budgetkv.ErrNoBucket) {
		t.Fatalf("Open before metering created the bucket: %v, want ErrNoBucket", err)
	}
	meter := d.Connect(t, topology.Metering)
	w, err := budgetkv.Ensure(t.Context(), meter.JetStream(), 1)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	// A tenant whose token needs escaping as a key.
	for _, tenant := range []string{"acme", "team@lab"} {
		if _, err := w.Put(t.Context(), state(tenant, t0)); err != nil {
			t.Fatal(err)
		}
	}
	// A later write of the same month and limit keeps the first exhaustion.
	later := state("acme", t0.Add(time.Minute))
	later.SpentMicros = 12
	got, err := w.Put(t.Context(), later)
	if err != nil || !got.ExhaustedAt.Equal(t0) || got.SpentMicros != 12 {
		t.Fatalf("second Put = %+v, %v; want exhausted_at kept at %s, spend 12", got, err, t0)
	}
	r, err := budgetkv.Open(t.Context(), sched.JetStream())
	if err != nil {
		t.Fatal(err)
	}
	changes, err := r.Watch(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]budget.State{}
	for c := range changes {
		if c == nil {
			break
		}
		seen[c.State.Tenant] = c.State
	}
	if len(seen) != 2 || !seen["acme"].ExhaustedAt.Equal(t0) || seen["team@lab"].Tenant != "team@lab" {
		t.Fatalf("initial states %+v", seen)
	}
	if err := w.Delete(t.Context(), "acme"); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-changes:
		if c == nil || !c.Lifted || c.Key != budgetkv.Key("acme") {
			t.Fatalf("after Delete: %+v, want acme lifted", c)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no change after Delete")
	}
	all, err := w.All(t.Context())
	if err != nil || len(all) != 1 || all[0].Tenant != "team@lab" {
		t.Fatalf("All = %+v, %v", all, err)
	}
	// The scheduler may read but not write.
	ro, err := budgetkv.Open(t.Context(), sched.JetStream())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ro.Put(t.Context(), state("intruder", t0)); err == nil {
		t.Fatal("the scheduler wrote a budget state")
	}
	if _, err := budgetkv.Ensure(t.Context(), sched.JetStream(), 1); err == nil {
		t.Fatal("the scheduler created the bucket")
	}
}

func TestAnInvalidStateIsNotWritten(t *testing.T) {
	d := testkit.Platform(t)
	w, err := budgetkv.Ensure(t.Context(), d.Connect(t, topology.Metering).JetStream(), 1)
	if err != nil {
		t.Fatal(err)
	}
	bad := state("acme", time.Now())
	bad.Policy = budget.Alert
	if _, err := w.Put(t.Context(), bad); err == nil {
		t.Fatal("a state under the alert policy was written")
	}
	if _, ok, err := w.Get(t.Context(), "acme"); err != nil || ok {
		t.Fatalf("Get after a refused Put: ok=%v, %v", ok, err)
	}
}
