package app

import "testing"

func TestAnIdleGPUsBackgroundUtilizationDoesNotKeepItsNodeBusy(t *testing.T) {
	t.Parallel()
	cases := []struct {
		util float64
		busy bool
	}{{0, false}, {1, false}, {4.9, false}, {6, false}, {9.9, false}, {10, true}, {63, true}}
	for _, c := range cases {
		if got := gpuBusy(c.util); got != c.busy {
			t.Errorf("gpuBusy(%v) = %v, want %v", c.util, got, c.busy)
		}
	}
}
