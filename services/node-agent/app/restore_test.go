package app_test

import (
	"fmt"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// restoredWith waits until the store holds node again with rental's
// allocation on GPU 0 taking milli, and returns the node.
func restoredWith(t *testing.T, e *env, node, rental string, milli int64) capacity.NodeState {
	t.Helper()
	var st capacity.NodeState
	testkit.Eventually(t, 20*time.Second, func() error {
		var err error
		if st, err = e.store.Node(t.Context(), node); err != nil {
			return err
		}
		if len(st.Allocations) != 1 || st.Allocations[0].RentalID != rental {
			return fmt.Errorf("node %s holds %+v, want %s", node, st.Allocations, rental)
		}
		if free := st.FreeGPUs[0].Milli; free != capacity.MilliPerGPU-milli {
			return fmt.Errorf("GPU 0 has %d milli free, want %d", free, capacity.MilliPerGPU-milli)
		}
		return nil
	})
	return st
}

// stopsOf is every RentalStopped of rental so far.
func stopsOf(t *testing.T, e *env, rental string) []*shizuv1.RentalStopped {
	t.Helper()
	var out []*shizuv1.RentalStopped
	for _, ev := range all[*shizuv1.RentalStopped](t, e, topology.StreamRentals, "rental.acme.stopped") {
		if ev.GetRentalId() == rental {
			out = append(out, ev)
		}
	}
	return out
}

// Workloads outlive the loss of Redis (restarted empty, as compose and
// k8s ran it without persistence): their agent sees the store's
// generation change and restores its node together with the workloads'
// allocations, at the epoch it held; no workload is stopped, and a stop
// later ends one and releases its allocation as any other.
func TestWorkloadsSurviveTheLossOfRedis(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := t.TempDir()
	killWorkloads(t, dir)
	const node, n = "n-redis-lost", 4
	e.start(t, e.config(t, node, "rtx4090x8", dir))
	e.registered(t, node, 1)
	var rentals []string
	for i := range n {
		r := fmt.Sprintf("r-redis-lost-%d", i)
		rentals = append(rentals, r)
		e.send(t, node, "start", e.place(t, node, 1, r, 250, 4096))
		startedOf(t, e, r)
	}
	before, err := e.store.Generation(t.Context())
	if err != nil || before == "" {
		t.Fatalf("generation before the loss = %q, %v", before, err)
	}

	e.Redis.Restart(t)

	var st capacity.NodeState
	testkit.Eventually(t, 20*time.Second, func() error {
		var err error
		if st, err = e.store.Node(t.Context(), node); err != nil {
			return err
		}
		if len(st.Allocations) != n {
			return fmt.Errorf("node %s holds %d allocations, want %d", node, len(st.Allocations), n)
		}
		return nil
	})
	if st.Epoch != 1 || st.FreeGPUs[0].Milli != 0 || st.FreeGPUs[0].VRAMMiB != st.GPUs[0].VRAMMiB-n*4096 || st.FreeGPUs[0].Sharers != n {
		t.Fatalf("restored node %+v; want epoch 1 and GPU 0 taken by the %d workloads", st, n)
	}
	if after, _ := e.store.Generation(t.Context()); after == "" || after == before {
		t.Fatalf("generation after the loss = %q, before %q; want a new one", after, before)
	}
	for _, r := range rentals {
		if err := e.store.Renew(t.Context(), r, node, 1); err != nil {
			t.Fatalf("renew of the restored allocation of %s: %v", r, err)
		}
	}
	e.send(t, node, "stop", stopCmd(node, rentals[0], shizuv1.ExitReason_EXIT_REASON_PREEMPTED, time.Second))
	stopped := stoppedOf(t, e, rentals[0])
	if stopped.GetExitReason() != shizuv1.ExitReason_EXIT_REASON_PREEMPTED {
		t.Fatalf("the workload stopped with %v (%q); want only the stop it was sent", stopped.GetExitReason(), stopped.GetMessage())
	}
	stops := 0
	for _, r := range rentals {
		stops += len(stopsOf(t, e, r))
	}
	if stops != 1 {
		t.Fatalf("%d stops of the %d workloads; want only the one asked for", stops, n)
	}
	if released, err := e.store.Release(t.Context(), rentals[0]); err != nil || !released {
		t.Fatalf("release of the restored allocation = %v, %v", released, err)
	}
	if st, err := e.store.Node(t.Context(), node); err != nil || st.FreeGPUs[0].Milli != 250 {
		t.Fatalf("after the release GPU 0 = %+v, %v; want 250 milli free", st.FreeGPUs, err)
	}
}

// An agent that restarts while Redis is lost (both down at once, then
// both back) adopts its workloads and restores them: the generation it
// registered in is kept in its state directory.
func TestAnAgentRestartedAfterRedisWasLostRestoresItsWorkloads(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := t.TempDir()
	killWorkloads(t, dir)
	const node, rental = "n-both-lost", "r-both-lost"
	first := e.start(t, e.config(t, node, "rtx4090x8", dir))
	e.registered(t, node, 1)
	e.send(t, node, "start", e.place(t, node, 1, rental, 1000, 0))
	startedOf(t, e, rental)
	first.stop(t)

	e.Redis.Restart(t)
	e.start(t, e.config(t, node, "rtx4090x8", dir))

	restoredWith(t, e, node, rental, 1000)
	if err := e.store.Renew(t.Context(), rental, node, 1); err != nil {
		t.Fatalf("renew of the restored allocation: %v", err)
	}
	if stops := stopsOf(t, e, rental); len(stops) != 0 {
		t.Fatalf("the adopted workload was stopped: %v", stops)
	}
}

// A rental placed just before Redis was lost, whose start arrives after
// the agent restored its node, still starts: the agent adds its placement
// to the restored node (the decision is in JetStream; only the store
// forgot it).
func TestAStartPlacedBeforeTheLossOfRedisRunsAfterIt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := t.TempDir()
	killWorkloads(t, dir)
	const node, rental = "n-start-lost", "r-start-lost"
	e.start(t, e.config(t, node, "rtx4090x8", dir))
	e.registered(t, node, 1)
	start := e.place(t, node, 1, rental, 250, 2048)
	before, _ := e.store.Generation(t.Context())

	e.Redis.Restart(t)
	testkit.Eventually(t, 20*time.Second, func() error {
		if g, err := e.store.Generation(t.Context()); err != nil || g == "" || g == before {
			return fmt.Errorf("generation %q, was %q: not restored yet: %w", g, before, err)
		}
		_, err := e.store.Node(t.Context(), node)
		return err
	})
	e.send(t, node, "start", start)

	startedOf(t, e, rental)
	restoredWith(t, e, node, rental, 250)
}

// A GPU the agent knows failed comes back failed in the restored store:
// no scheduler places onto it (the store refuses it) until the agent
// reports it healthy.
func TestAFailedGPUStaysFailedAfterTheLossOfRedis(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const node = "n-lost-failed"
	f := simulated(t, "h100x8", node)
	cfg := e.config(t, node, "", t.TempDir())
	cfg.Simulated = f
	e.start(t, cfg)
	e.registered(t, node, 1)
	testkit.Eventually(t, 20*time.Second, func() error {
		if ev, ok := last[*shizuv1.NodeHealthChanged](t, e, topology.StreamNodes, "node."+node+".health"); ok && ev.GetGpuIndex() == -1 {
			return nil
		}
		if err := f.InjectECC(2, 0, 1); err != nil { // inject until the agent's watcher reports it
			t.Fatal(err)
		}
		return fmt.Errorf("GPU 2 not reported failed yet")
	})
	before, _ := e.store.Generation(t.Context())

	e.Redis.Restart(t)

	testkit.Eventually(t, 20*time.Second, func() error {
		g, err := e.store.Generation(t.Context())
		if err != nil || g == "" || g == before {
			return fmt.Errorf("generation %q, was %q: not restored yet: %w", g, before, err)
		}
		st, err := e.store.Node(t.Context(), node)
		if err != nil {
			return err
		}
		if st.FreeGPUs[2].Health != capacity.HealthFailed || !st.FreeGPUs[0].Healthy() {
			return fmt.Errorf("restored GPU health: 0 %q, 2 %q; want GPU 2 failed, GPU 0 healthy", st.FreeGPUs[0].Health, st.FreeGPUs[2].Health)
		}
		return nil
	})
	_, err := e.store.Reserve(t.Context(), capacity.Placement{RentalID: "r-on-failed", NodeID: node, Epoch: 1, Tenant: "acme",
		GPUs: []capacity.GPUShare{{Index: 2, Milli: 1000}}})
	if !capacity.IsConflict(err) {
		t.Fatalf("reserve on the failed GPU after the restore: %v; want a conflict", err)
	}
}
