package capacity_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/shizu-gpu/shizu/shared/capacity"
)

// Eight replicas race for the two MIG instances of one GPU: each instance
// goes to exactly one rental, the store lists what is free, and a release
// gives the instance back.
func TestMIGInstancesAreHeldByOneRentalAtATime(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := t.Context()
	epoch := mustRegister(t, s, migNode("n1"))
	if st := mustNode(t, s, "n1"); !slices.Equal(st.FreeGPUs[1].FreeMIGInstances, []string{"MIG-n1-1a", "MIG-n1-1b"}) ||
		len(st.FreeGPUs[0].FreeMIGInstances) != 0 || st.FreeGPUs[1].MaxSharers != 2 {
		t.Fatalf("a fresh MIG GPU: %+v", st.FreeGPUs)
	}
	const replicas = 8
	won := make([][]string, replicas)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for w := range replicas {
		wg.Go(func() {
			<-start
			var ps []capacity.Placement
			for _, inst := range []string{"MIG-n1-1a", "MIG-n1-1b"} {
				sh := migShare(1, inst)
				if inst == "MIG-n1-1b" {
					sh.MIGProfile, sh.Milli, sh.VRAMMiB = "3g.40gb", 428, 40*1024
				}
				ps = append(ps, place(fmt.Sprintf("w%d-%s", w, inst), "n1", epoch, sh))
			}
			for i, r := range s.ReserveMany(ctx, ps) {
				switch {
				case r.Err == nil:
					won[w] = append(won[w], ps[i].GPUs[0].MIGInstance)
				case !capacity.IsInsufficient(r.Err):
					t.Errorf("replica %d: %v", w, r.Err)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	holders := map[string]int{}
	for _, w := range won {
		for _, inst := range w {
			holders[inst]++
		}
	}
	if holders["MIG-n1-1a"] != 1 || holders["MIG-n1-1b"] != 1 {
		t.Fatalf("instances granted %v, want each exactly once", holders)
	}
	st := mustNode(t, s, "n1")
	if len(st.FreeGPUs[1].FreeMIGInstances) != 0 || len(st.Allocations) != 2 {
		t.Fatalf("both instances held: %+v", st)
	}
	for _, a := range st.Allocations {
		if a.GPUs[0].MIGInstance == "" {
			t.Fatalf("allocation %s does not name its instance", a.RentalID)
		}
	}
	if ok, err := s.Release(ctx, st.Allocations[0].RentalID); err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}
	if got := mustNode(t, s, "n1").FreeGPUs[1].FreeMIGInstances; !slices.Equal(got, []string{st.Allocations[0].GPUs[0].MIGInstance}) {
		t.Fatalf("after release, free instances %v", got)
	}
	// Registering the same partition again keeps who holds what.
	n := migNode("n1")
	n.Labels = map[string]string{"pool": "repartitioned"}
	mustRegister(t, s, n)
	if got := mustNode(t, s, "n1").FreeGPUs[1].FreeMIGInstances; !slices.Equal(got, []string{st.Allocations[0].GPUs[0].MIGInstance}) {
		t.Fatalf("after registering again, free instances %v", got)
	}
}
