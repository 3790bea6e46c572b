package rent_test

import (
	"testing"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/rent"
)

func TestParseMicros(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		in   string
		want int64
	}{
		{"a price with cents is micro-units", "2.49", 2_490_000},
		{"a whole amount has no decimals", "100", 100_000_000},
		{"one micro-unit is the smallest amount", "0.000001", 1},
		{"zero is an amount", "0", 0},
		{"a trailing dot is a whole amount", "2.", 2_000_000},
		{"surrounding space is ignored", " 1.5 ", 1_500_000},
		{"the largest int64 of micro-units is accepted", "9223372036854.775807", 9223372036854775807},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := rent.ParseMicros(c.in)
			if err != nil || got != c.want {
				t.Errorf("ParseMicros(%q) = %d, %v; want %d", c.in, got, err, c.want)
			}
		})
	}
	for _, c := range []struct{ name, in string }{
		{"empty is not an amount", ""},
		{"a negative amount is refused", "-1"},
		{"a negative fraction is refused", "1.-5"},
		{"a plus sign in the fraction is refused", "1.+5"},
		{"a plus sign is refused", "+1"},
		{"seven decimals are refused", "0.0000001"},
		{"an exponent is refused", "1e3"},
		{"one micro-unit past int64 overflows", "9223372036854.775808"},
		{"a whole part past int64 overflows", "9223372036855"},
		{"far past int64 overflows", "99999999999999999999"},
		{"a lone dot is not an amount", "."},
		{"a fraction without a whole part is refused", ".5"},
		{"letters are refused", "two"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got, err := rent.ParseMicros(c.in); !fault.IsInvalid(err) {
				t.Errorf("ParseMicros(%q) = %d, %v; want an invalid-input error", c.in, got, err)
			}
		})
	}
}

func TestMarketMapsToAndFromTheEventContract(t *testing.T) {
	t.Parallel()
	for _, m := range []rent.Market{rent.AnyMarket, rent.OnDemand, rent.Spot} {
		if got := rent.MarketOf(m.Proto()); got != m {
			t.Errorf("MarketOf(%q.Proto()) = %q", m, got)
		}
	}
	if rent.Spot.Plan() != shizuv1.Plan_PLAN_SPOT || rent.OnDemand.Plan() != shizuv1.Plan_PLAN_ON_DEMAND {
		t.Error("a replica bought on spot rents on the spot plan, on on-demand on the on-demand plan")
	}
	if _, err := rent.ParseMarket("reserved"); err == nil {
		t.Error(`"reserved" is a plan, not a market`)
	}
	if m, err := rent.ParseMarket("spot"); err != nil || m != rent.Spot {
		t.Errorf("ParseMarket(spot) = %q, %v", m, err)
	}
}

func TestClassOrdersPlansReservedFirstAndUnknownLast(t *testing.T) {
	t.Parallel()
	reserved := rent.ClassOf(shizuv1.Plan_PLAN_RESERVED)
	onDemand := rent.ClassOf(shizuv1.Plan_PLAN_ON_DEMAND)
	spot := rent.ClassOf(shizuv1.Plan_PLAN_SPOT)
	unknown := rent.ClassOf(shizuv1.Plan_PLAN_UNSPECIFIED)
	if !(reserved > onDemand && onDemand > spot && spot > unknown) || unknown != rent.ClassUnknown {
		t.Errorf("classes %v %v %v %v; want reserved > on-demand > spot > unknown", reserved, onDemand, spot, unknown)
	}
	for in, want := range map[string]shizuv1.Plan{"on-demand": shizuv1.Plan_PLAN_ON_DEMAND, "OnDemand": shizuv1.Plan_PLAN_ON_DEMAND,
		"on_demand": shizuv1.Plan_PLAN_ON_DEMAND, "Reserved": shizuv1.Plan_PLAN_RESERVED, "spot": shizuv1.Plan_PLAN_SPOT} {
		if got, err := rent.ParsePlan(in); err != nil || got != want {
			t.Errorf("ParsePlan(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := rent.ParsePlan("cheap"); err == nil {
		t.Error(`ParsePlan("cheap") accepted`)
	}
}

func TestHealthMapsToAndFromTheEventContract(t *testing.T) {
	t.Parallel()
	for _, h := range []rent.Health{rent.Healthy, rent.Degraded, rent.Failed} {
		if got, ok := rent.HealthOf(h.Proto()); !ok || got != h {
			t.Errorf("HealthOf(%q.Proto()) = %q, %v", h, got, ok)
		}
	}
	if _, ok := rent.HealthOf(shizuv1.Health_HEALTH_UNSPECIFIED); ok {
		t.Error("an unset health is not a health")
	}
}
