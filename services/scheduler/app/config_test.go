package app_test

import (
	"flag"
	"os"
	"path/filepath"
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

// Every SHIZU_SCHEDULER_* variable documented before the shared flag layer
// still sets its setting.
func TestEachSchedulerVariableSetsItsSetting(t *testing.T) {
	cases := []struct {
		key, value string
		got        func(app.Config) any
		want       any
	}{
		{"SHIZU_SCHEDULER_POLICY", "fgd", func(c app.Config) any { return c.Policy }, "fgd"},
		{"SHIZU_SCHEDULER_MAX_CANDIDATES", "7", func(c app.Config) any { return c.MaxCandidates }, 7},
		{"SHIZU_SCHEDULER_BATCH_SIZE", "8", func(c app.Config) any { return c.BatchSize }, 8},
		{"SHIZU_SCHEDULER_CONCURRENCY", "9", func(c app.Config) any { return c.Concurrency }, 9},
		{"SHIZU_SCHEDULER_COMMIT_WORKERS", "3", func(c app.Config) any { return c.CommitWorkers }, 3},
		{"SHIZU_SCHEDULER_PENDING_TIMEOUT", "1m", func(c app.Config) any { return c.PendingTimeout }, time.Minute},
		{"SHIZU_SCHEDULER_PENDING_RETRY", "2s", func(c app.Config) any { return c.PendingRetry }, 2 * time.Second},
		{"SHIZU_SCHEDULER_PREEMPTION_NOTICE", "3s", func(c app.Config) any { return c.PreemptionNotice }, 3 * time.Second},
		{"SHIZU_SCHEDULER_SNAPSHOT_MAX_AGE", "4s", func(c app.Config) any { return c.SnapshotMaxAge }, 4 * time.Second},
		{"SHIZU_SCHEDULER_AGING_STEP", "5s", func(c app.Config) any { return c.AgingStep }, 5 * time.Second},
		{"SHIZU_SCHEDULER_WORKLOAD_WINDOW", "11", func(c app.Config) any { return c.WorkloadWindow }, 11},
		{"SHIZU_SCHEDULER_OUTCOME_TTL", "1h", func(c app.Config) any { return c.OutcomeTTL }, time.Hour},
		{"SHIZU_SCHEDULER_KEY_PREFIX", "other", func(c app.Config) any { return c.KeyPrefix }, "other"},
	}
	for _, tc := range cases {
		t.Run(tc.key, func(t *testing.T) {
			t.Setenv(tc.key, tc.value)
			cfg := app.DefaultConfig()
			cfg.RegisterFlags(flag.NewFlagSet("scheduler", flag.ContinueOnError))
			if got := tc.got(cfg); got != tc.want {
				t.Fatalf("%s=%s gives %v, want %v", tc.key, tc.value, got, tc.want)
			}
			if err := cfg.Validate(); err != nil {
				t.Fatalf("Validate() = %v", err)
			}
		})
	}
}

// A fleet policy that cannot be read, or whose instance type lacks a model,
// GPUs or a zone, stops the scheduler at start naming the file and the
// type; negative grace and maximum pending timeout are refused.
func TestABadFleetPolicyOrNegativeDurationIsRefusedAtStart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	noZone := filepath.Join(dir, "nozone.json")
	if err := os.WriteFile(noZone, []byte(`{"fleet": {"instance_types": [{"name": "p5", "model": "H100-SXM5-80GB", "gpus": 8}]}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		filepath.Join(dir, "missing.json"): "scheduler.fleet-policy: open " + filepath.Join(dir, "missing.json"),
		noZone:                             `fleet.instance_types[0] ("p5") needs a model, gpus >= 1 and a zone`,
	} {
		cfg := app.DefaultConfig()
		cfg.FleetPolicyPath = path
		if _, err := app.New(cfg, app.Deps{}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New with %s: %v; want %q", filepath.Base(path), err, want)
		}
	}
	cfg := app.DefaultConfig()
	cfg.UnsatisfiableGrace, cfg.MaxPendingTimeout = -time.Second, -time.Second
	err := cfg.Validate()
	for _, want := range []string{"scheduler.unsatisfiable-grace: must not be negative", "scheduler.max-pending-timeout: must not be negative"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v; want it to say %q", err, want)
		}
	}
}
