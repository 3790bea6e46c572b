package app

import (
	"strings"
	"testing"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/shared/capacity"
)

func TestQuotaShortSaysWhichLimitLeavesNoRoom(t *testing.T) {
	t.Parallel()
	q := &capacity.Quota{MaxGPUs: 4, PerModel: map[string]int64{"H100-SXM5-80GB": 1}}
	used := capacity.Usage{MilliGPU: 3000, PerModel: map[string]int64{"H100-SXM5-80GB": 1000, "L4-24GB": 2000}}
	req := func(gpus int, milli int64, models ...string) *placement.Request {
		return &placement.Request{Tenant: "acme", GPUCount: gpus, MilliPerGPU: milli, Models: models}
	}
	for _, c := range []struct {
		name string
		r    *placement.Request
		want string // "" = room
	}{
		{"one more GPU of any model fits the total", req(1, 1000), ""},
		{"two more do not", req(2, 1000), "holds 3 of the 4 GPUs its quota allows and asks for 2 more"},
		{"a fraction counts as its share", req(1, 500), ""},
		{"the only model allowed is at its cap", req(1, 500, "H100-SXM5-80GB"), "holds 1 of the 1 H100-SXM5-80GB GPUs its quota allows and asks for 0.5 more"},
		{"another allowed model has room", req(1, 500, "H100-SXM5-80GB", "L4-24GB"), ""},
		{"a model without a cap is bounded by the total alone", req(1, 1000, "L4-24GB"), ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := quotaShort(c.r, q, used)
			if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
				t.Fatalf("quotaShort = %q; want %q", got, c.want)
			}
		})
	}
}
