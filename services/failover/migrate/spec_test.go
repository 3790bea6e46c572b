package migrate

import (
	"testing"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
)

func TestAReplacementKeepsTheGPUMemoryTheRentalRanWithWhereTheSpecLeftTheModelOpen(t *testing.T) {
	t.Parallel()
	ran := func(s *shizuv1.RentalSpec) Placement {
		return Placement{Attempt: 1, Tenant: "acme", Node: "n1", Spec: s, Model: "A100-SXM4-80GB", VRAMMiB: 81920}
	}
	whole := func() *shizuv1.RentalSpec {
		return &shizuv1.RentalSpec{GpuCount: 2, MilliGpu: 1000, Plan: shizuv1.Plan_PLAN_ON_DEMAND, CheckpointUri: "s3://c/"}
	}
	cases := []struct {
		name     string
		spec     func() *shizuv1.RentalSpec
		wantVRAM int64
	}{
		{"whole GPUs of any model ask for at least the memory they ran with", whole, 81920},
		{"a larger stated need is kept", func() *shizuv1.RentalSpec { s := whole(); s.VramMib = 90000; return s }, 90000},
		{"named models are kept as they are: the tenant accepted each", func() *shizuv1.RentalSpec {
			s := whole()
			s.AllowedModels = []string{"A100-SXM4-80GB", "RTX4090"}
			return s
		}, 0},
		{"a fraction keeps its own stated memory", func() *shizuv1.RentalSpec {
			return &shizuv1.RentalSpec{GpuCount: 1, MilliGpu: 500, VramMib: 20000, Plan: shizuv1.Plan_PLAN_SPOT}
		}, 20000},
		{"a MIG instance keeps its profile's memory", func() *shizuv1.RentalSpec {
			return &shizuv1.RentalSpec{GpuCount: 1, MilliGpu: 1000, MigProfile: "1g.10gb", Plan: shizuv1.Plan_PLAN_ON_DEMAND}
		}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			orig := c.spec()
			before := orig.GetVramMib()
			got := ReplacementSpec(ran(orig))
			if got.GetVramMib() != c.wantVRAM {
				t.Fatalf("vram_mib %d, want %d", got.GetVramMib(), c.wantVRAM)
			}
			if orig.GetVramMib() != before {
				t.Fatal("the stored spec was changed")
			}
			if err := got.Validate(); err != nil {
				t.Fatalf("the replacement spec is invalid: %v", err)
			}
		})
	}
	if ReplacementSpec(Placement{}) != nil {
		t.Fatal("a spec from nothing")
	}
}
