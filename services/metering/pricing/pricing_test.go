package pricing_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shizu-gpu/shizu/services/metering/pricing"
	"github.com/shizu-gpu/shizu/shared/gpumodel"
)

const good = `{
  "currency": "USD",
  "reserved_discount_percent": {"month": 60, "year": 70},
  "instance_types": [
    {"model": "H100-SXM5-80GB", "vram_mib": 81920, "price_per_gpu_hour_micros": 2490000,
     "bf16_tflops": 989, "fp32_tflops": 67, "memory_bandwidth_gbps": 3350, "interconnect": "nvlink4",
     "mig_profiles": {"1g.10gb": 143, "3g.40gb": 429}}
  ]
}`

func TestTheShippedCatalogueLoads(t *testing.T) {
	t.Parallel()
	c, err := pricing.Load("catalogue.json")
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if len(c.Models()) < 3 {
		t.Fatalf("shipped catalogue offers only %v", c.Models())
	}
}

func TestCataloguePricesPlansAndShares(t *testing.T) {
	t.Parallel()
	c, err := pricing.Parse([]byte(good))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	if od, _ := c.OnDemand("H100-SXM5-80GB"); od != (pricing.Money{Micros: 2_490_000, Currency: "USD"}) {
		t.Fatalf("on-demand %v", od)
	}
	if r, _ := c.Reserved("H100-SXM5-80GB", pricing.TermYear, 0); r.Micros != 747_000 {
		t.Fatalf("reserved a year at 70 %% off: %v", r)
	}
	if _, err := c.Reserved("H100-SXM5-80GB", pricing.TermYear, 85); err == nil {
		t.Fatal("a discount above 80 % was accepted")
	}
	if m, _ := c.BillableMilli("H100-SXM5-80GB", "3g.40gb", 1000); m != 429 {
		t.Fatalf("MIG 3g.40gb share %d", m)
	}
	if m, _ := c.BillableMilli("H100-SXM5-80GB", "", 250); m != 250 {
		t.Fatalf("fraction share %d", m)
	}
	if _, err := c.BillableMilli("H100-SXM5-80GB", "7g.80gb", 1000); err == nil {
		t.Fatal("an unlisted MIG profile was priced")
	}
	if _, err := c.OnDemand("b300"); !errors.Is(err, pricing.ErrUnknownModel) {
		t.Fatalf("unknown model: %v", err)
	}
}

func TestBadCataloguesAreRefusedWithEveryProblemNamed(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, json string
		want       []string
	}{
		{"a misspelt key is refused", `{"currency":"USD","reserved_discount_percent":{"month":60,"year":70},"instance_types":[],"extra":1}`, []string{"unknown field"}},
		{"an empty catalogue is refused", `{"currency":"USD","reserved_discount_percent":{"month":60,"year":70},"instance_types":[]}`, []string{"instance_types: empty"}},
		{"a bad currency and a discount out of range are both named",
			`{"currency":"usd","reserved_discount_percent":{"month":50,"year":70},"instance_types":[{"model":"x","vram_mib":1,"price_per_gpu_hour_micros":1}]}`,
			[]string{"currency:", "reserved_discount_percent.month: 50"}},
		{"a free or negative price is refused",
			`{"currency":"USD","reserved_discount_percent":{"month":60,"year":70},"instance_types":[{"model":"x","vram_mib":1,"price_per_gpu_hour_micros":0}]}`,
			[]string{"instance_types[0].price_per_gpu_hour_micros: 0"}},
		{"a model listed twice is refused",
			`{"currency":"USD","reserved_discount_percent":{"month":60,"year":70},"instance_types":[{"model":"x","vram_mib":1,"price_per_gpu_hour_micros":1},{"model":"x","vram_mib":1,"price_per_gpu_hour_micros":1}]}`,
			[]string{"listed twice"}},
		{"a spot default above the list price is refused",
			`{"currency":"USD","reserved_discount_percent":{"month":60,"year":70},"instance_types":[{"model":"x","vram_mib":1,"price_per_gpu_hour_micros":5,"spot_default_price_per_gpu_hour_micros":6}]}`,
			[]string{"instance_types[0].spot_default_price_per_gpu_hour_micros: 6 is outside 1..5"}},
		{"a MIG share above a whole GPU is refused",
			`{"currency":"USD","reserved_discount_percent":{"month":60,"year":70},"instance_types":[{"model":"x","vram_mib":1,"price_per_gpu_hour_micros":1,"mig_profiles":{"1g":1001}}]}`,
			[]string{"mig_profiles[\"1g\"]: 1001"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := pricing.Parse([]byte(tc.json))
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q does not name %q", err, w)
				}
			}
		})
	}
	dir := t.TempDir()
	if _, err := pricing.Load(filepath.Join(dir, "missing.json")); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}

// The shipped catalogue must price exactly the tokens the rest of the
// platform uses (node agents report them, the scheduler matches them), or
// rentals of a model would be dead-lettered as unknown.
func TestDefaultCatalogueUsesThePlatformModelTokens(t *testing.T) {
	t.Parallel()
	c, err := pricing.Shipped()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range c.Models() {
		if _, ok := gpumodel.Lookup(m); !ok {
			t.Errorf("catalogue.json: unknown GPU model %q", m)
		}
	}
}
