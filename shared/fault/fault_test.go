package fault_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/shizu-gpu/shizu/shared/fault"
)

func TestKindsSurviveWrapping(t *testing.T) {
	t.Parallel()
	base := errors.New("disk on fire")
	cases := []struct {
		name string
		err  error
		is   func(error) bool
	}{
		{"not found is detected through fmt wrapping", fmt.Errorf("load: %w", fault.NotFound("node %q", "n1")), fault.IsNotFound},
		{"conflict is detected", fault.Conflict("epoch %d moved", 3), fault.IsConflict},
		{"invalid is detected", fault.Invalid("gpu_count: %d", 0), fault.IsInvalid},
		{"unavailable keeps the cause", fault.Unavailable("redis: %w", base), fault.IsUnavailable},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if !c.is(c.err) {
				t.Fatalf("%v: kind lost", c.err)
			}
		})
	}
	if err := fault.Unavailable("redis: %w", base); !errors.Is(err, base) || err.Error() != "redis: disk on fire" {
		t.Fatalf("cause or message lost: %v", err)
	}
	if fault.IsInvalid(fault.NotFound("x")) {
		t.Fatal("not found must not read as invalid")
	}
}
