package app_test

import (
	"testing"
)

// A host whose GPUs 6 and 7 are in MIG mode registers them as such, with
// their instances, in the event and in the capacity store: the scheduler
// places MIG rentals only on those instances.
func TestAgentRegistersMIGModeAndInstances(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := t.TempDir()
	killWorkloads(t, dir)
	e.start(t, e.config(t, "n1", "h100x8-mig", dir))

	reg := e.registered(t, "n1", 1)
	if err := reg.Validate(); err != nil {
		t.Fatal(err)
	}
	gpus := reg.GetGpus()
	if gpus[0].GetMigEnabled() || !gpus[6].GetMigEnabled() || !gpus[7].GetMigEnabled() || len(gpus[7].GetMigInstances()) != 7 {
		t.Fatalf("registered GPUs 0, 6, 7: %v / %v / %v", gpus[0], gpus[6], gpus[7])
	}
	st, err := e.store.Node(t.Context(), "n1")
	if err != nil {
		t.Fatal(err)
	}
	if st.GPUs[0].MIGEnabled || len(st.GPUs[0].MIGInstances) != 0 || !st.GPUs[7].MIGEnabled {
		t.Fatalf("store GPUs 0 and 7: %+v / %+v", st.GPUs[0], st.GPUs[7])
	}
	for _, i := range []int{6, 7} {
		want := gpus[i].GetMigInstances()
		if len(st.GPUs[i].MIGInstances) != len(want) || len(st.FreeGPUs[i].FreeMIGInstances) != len(want) ||
			st.FreeGPUs[i].MaxSharers != len(want) {
			t.Fatalf("GPU %d: store %+v free %+v, registered %v", i, st.GPUs[i], st.FreeGPUs[i], want)
		}
		for k, m := range want {
			got := st.GPUs[i].MIGInstances[k]
			if got.UUID != m.GetUuid() || got.Profile != m.GetProfile() || got.VRAMMiB != m.GetVramMib() {
				t.Fatalf("GPU %d instance %d: store %+v, registered %v", i, k, got, m)
			}
		}
	}
}
