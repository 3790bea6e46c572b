package app_test

import (
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/services/scheduler/app"
)

// A SHIZU_SCHEDULER_* value that does not parse is an error naming the
// variable, not a silent default; an outcome TTL under a second (Redis
// expires keys in whole seconds) is refused.
func TestConfigRefusesBadEnvironmentAndSubSecondOutcomeTTL(t *testing.T) {
	t.Setenv("SHIZU_SCHEDULER_BATCH_SIZE", "lots")
	t.Setenv("SHIZU_SCHEDULER_PENDING_TIMEOUT", "45")
	cfg := app.DefaultConfig()
	cfg.RegisterFlags(flag.NewFlagSet("scheduler", flag.ContinueOnError))
	cfg.OutcomeTTL = 500 * time.Millisecond
	err := cfg.Validate()
	for _, want := range []string{`SHIZU_SCHEDULER_BATCH_SIZE: "lots" is not a whole number`,
		`SHIZU_SCHEDULER_PENDING_TIMEOUT: "45" is not a duration`, "scheduler.outcome-ttl: must be at least 1s"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v; want it to say %q", err, want)
		}
	}
	if err := app.DefaultConfig().Validate(); err != nil {
		t.Fatalf("the default configuration is refused: %v", err)
	}
}
