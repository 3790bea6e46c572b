package app_test

import (
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/services/failover/app"
)

func registered(t *testing.T) (app.Config, *flag.FlagSet) {
	t.Helper()
	cfg := app.DefaultConfig()
	fs := flag.NewFlagSet("failover", flag.ContinueOnError)
	cfg.Service.RegisterFlags(fs)
	cfg.RegisterFlags(fs)
	return cfg, fs
}

func TestEveryFailoverFlagHasASHIZU_FAILOVERVariable(t *testing.T) {
	t.Parallel()
	_, fs := registered(t)
	fs.VisitAll(func(f *flag.Flag) {
		want := "[SHIZU_FAILOVER_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if !strings.Contains(f.Usage, want) {
			t.Errorf("-%s: help %q does not name %s]", f.Name, f.Usage, want)
		}
	})
}

func TestTheAdvisoryVariablesStillConfigureTheFastPath(t *testing.T) {
	// Not parallel: it sets environment variables.
	t.Setenv("SHIZU_FAILOVER_ADVISORY_URL", "nats://nats:4222")
	t.Setenv("SHIZU_FAILOVER_ADVISORY_USER", "failover-advisories")
	t.Setenv("SHIZU_FAILOVER_ADVISORY_PASSWORD", "secret")
	t.Setenv("SHIZU_FAILOVER_CONFIRM", "750ms")
	cfg := app.DefaultConfig()
	fs := flag.NewFlagSet("failover", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	if cfg.Advisory != (app.AdvisoryConfig{URL: "nats://nats:4222", User: "failover-advisories", Password: "secret"}) {
		t.Fatalf("advisory from the environment: %+v", cfg.Advisory)
	}
	if cfg.Detect.Confirm != 750*time.Millisecond {
		t.Fatalf("confirm from SHIZU_FAILOVER_CONFIRM: %s", cfg.Detect.Confirm)
	}
	if err := fs.Parse([]string{"-advisory-user", "sys", "-confirm", "1s"}); err != nil {
		t.Fatal(err)
	}
	if cfg.Advisory.User != "sys" || cfg.Detect.Confirm != time.Second {
		t.Errorf("the command line must win: user %q, confirm %s", cfg.Advisory.User, cfg.Detect.Confirm)
	}
}

func TestConfigValidationNamesAVariableThatDoesNotParse(t *testing.T) {
	// Not parallel: it sets environment variables.
	cases := []struct {
		name, key, value, want string
	}{
		{"a duration that is not one", "SHIZU_FAILOVER_SWEEP", "ten seconds", `SHIZU_FAILOVER_SWEEP: "ten seconds" is not a duration`},
		{"a count that is not a whole number", "SHIZU_FAILOVER_MOVES_BURST", "lots", `SHIZU_FAILOVER_MOVES_BURST: "lots" is not a whole number`},
		{"a rate that is not a number", "SHIZU_FAILOVER_MOVES_PER_SECOND", "fast", `SHIZU_FAILOVER_MOVES_PER_SECOND: "fast" is not a number`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(tc.key, tc.value)
			cfg := app.DefaultConfig()
			cfg.RegisterFlags(flag.NewFlagSet("failover", flag.ContinueOnError))
			if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s=%q: Validate = %v, want it to say %s", tc.key, tc.value, err, tc.want)
			}
		})
	}
}

func TestConfigValidationReportsEveryProblem(t *testing.T) {
	t.Parallel()
	cfg := app.DefaultConfig()
	cfg.Tick, cfg.Sweep, cfg.HeartbeatTTL = 0, 0, time.Millisecond
	cfg.Advisory.URL = "nats://localhost:4222"
	err := cfg.Validate()
	if err == nil {
		t.Fatal("bad configuration accepted")
	}
	for _, want := range []string{"failover.tick", "failover.sweep", "failover.heartbeat_ttl", "failover.advisory.user"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
}
