package main

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

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

// -pending-timeout becomes the spec's pending_timeout; absent, the spec
// leaves it to the scheduler; a negative one is a usage error.
func TestRentPendingTimeoutFlagSetsTheSpec(t *testing.T) {
	t.Parallel()
	parse := func(args ...string) (*shizuv1.RentalSpec, error) {
		fs := flag.NewFlagSet("rent", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		c := &rentCommand{o: rentOptions{labels: labelFlag{}}}
		c.register(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return c.o.spec(nil)
	}
	s, err := parse("-pending-timeout", "30m")
	if err != nil || s.GetPendingTimeout().AsDuration() != 30*time.Minute {
		t.Fatalf("-pending-timeout 30m: %v, %v", s.GetPendingTimeout(), err)
	}
	if s, err := parse(); err != nil || s.GetPendingTimeout() != nil {
		t.Fatalf("no -pending-timeout: %v, %v; want none in the spec", s.GetPendingTimeout(), err)
	}
	_, err = parse("-pending-timeout", "-1m")
	if err == nil || !errors.As(err, new(usageError)) || !strings.Contains(err.Error(), "-pending-timeout -1m0s: want a positive duration") {
		t.Fatalf("-pending-timeout -1m: %v; want a usage error", err)
	}
}
