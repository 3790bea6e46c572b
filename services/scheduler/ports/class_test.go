package ports_test

import (
	"testing"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/ports"
	"github.com/shizu-gpu/shizu/shared/rent"
)

func TestAClassRecordReadsBackWithOrWithoutAMaxPrice(t *testing.T) {
	for _, c := range []ports.Class{
		{Class: rent.ClassOnDemand, Priority: 0},
		{Class: rent.ClassSpot, Priority: -3, MaxSpotPrice: placement.Price{Micros: 1_200_000, Currency: "USD"}},
	} {
		got, ok := ports.ParseClass(c.String())
		if !ok || got != c {
			t.Fatalf("%q read back as %+v (%v), want %+v", c.String(), got, ok, c)
		}
	}
	// Written before caps were kept: no price.
	if got, ok := ports.ParseClass("2:5"); !ok || got.MaxSpotPrice.Known() || got.Priority != 5 {
		t.Fatalf("old record read as %+v %v", got, ok)
	}
	for _, bad := range []string{"", "1", "1:2:3", "1:2:x:USD", "1:2:3:", "a:b"} {
		if _, ok := ports.ParseClass(bad); ok {
			t.Errorf("%q parsed", bad)
		}
	}
}
