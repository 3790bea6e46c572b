package main

import (
	"errors"
	"strings"
	"testing"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
)

func TestRentRefusesAPlanWithoutWhatItNeeds(t *testing.T) {
	t.Parallel()
	for _, bad := range []struct {
		name string
		o    rentOptions
		want []string
	}{
		{"reserved without a model says a commitment's model is missing, with an example",
			rentOptions{gpus: 1, plan: "reserved"}, []string{"-plan reserved", "commitment", "-model", "e.g. -plan reserved -model H100-SXM5-80GB"}},
		{"a maximum price on an on-demand rental says it is for spot, with an example",
			rentOptions{gpus: 1, plan: "on-demand", maxPrice: "1.20", currency: "USD"}, []string{"-max-price", "only for -plan spot", "e.g. -plan spot -max-price 1.20"}},
	} {
		t.Run(bad.name, func(t *testing.T) {
			t.Parallel()
			_, err := bad.o.spec(nil)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range bad.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q does not say %q", err, w)
				}
			}
			if !errors.As(err, new(usageError)) {
				t.Fatalf("error %v is not a usage error (exit status 2)", err)
			}
		})
	}
	s, err := rentOptions{gpus: 2, plan: "reserved", models: "H100-SXM5-80GB"}.spec(nil)
	if err != nil || s.GetPlan() != shizuv1.Plan_PLAN_RESERVED || len(s.GetAllowedModels()) != 1 {
		t.Fatalf("a reserved rental of a model: %v, %v", s, err)
	}
}
