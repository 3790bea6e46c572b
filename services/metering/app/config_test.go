package app_test

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/services/metering/app"
)

func TestConfigurationProblemsAreAllNamed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	badAccounts := filepath.Join(dir, "accounts.json")
	if err := os.WriteFile(badAccounts, []byte(`{"commitments":[{"tenant_id":"acme","model":"b300","gpu_count":2,"term":"month","start":"2026-11-01T00:00:00Z","discount_percent":90}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		mutate func(*app.Config)
		want   []string
	}{
		{"the default configuration is valid", func(*app.Config) {}, nil},
		{"an interval that is not whole seconds is refused", func(c *app.Config) { c.Rules.Interval = 1500 * time.Millisecond }, []string{"interval: 1.5s"}},
		{"a minimum charge over an hour is refused", func(c *app.Config) { c.Rules.MinimumCharge = 2 * time.Hour }, []string{"minimum charge: 2h0m0s"}},
		{"a missing catalogue file is refused", func(c *app.Config) { c.CataloguePath = filepath.Join(dir, "nope.json") }, []string{"nope.json"}},
		{"a commitment for an unknown model is refused", func(c *app.Config) { c.AccountsPath = badAccounts }, []string{`unknown GPU model "b300"`}},
		{"no concurrency is refused", func(c *app.Config) { c.Concurrency = 0 }, []string{"concurrency 0"}},
		{"no park grace is refused", func(c *app.Config) { c.ParkGrace = 0 }, []string{"park grace 0s"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := app.DefaultConfig()
			tc.mutate(&cfg)
			err := cfg.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
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
}

// A SHIZU_METERING_* value that does not parse is named, not replaced by
// the default in silence.
func TestEnvironmentValuesThatDoNotParseAreNamed(t *testing.T) {
	cases := []struct{ name, key, value, want string }{
		{"an interval without a unit", "SHIZU_METERING_INTERVAL", "60", `SHIZU_METERING_INTERVAL: "60" is not a duration (e.g. 1m)`},
		{"a minimum charge in words", "SHIZU_METERING_MINIMUM_CHARGE", "a minute", `SHIZU_METERING_MINIMUM_CHARGE: "a minute" is not a duration (e.g. 1m)`},
		{"a concurrency in words", "SHIZU_METERING_CONCURRENCY", "four", `SHIZU_METERING_CONCURRENCY: "four" is not a whole number`},
		{"a close grace without a unit", "SHIZU_METERING_CLOSE_GRACE", "30", `SHIZU_METERING_CLOSE_GRACE: "30" is not a duration`},
		{"a park grace without a unit", "SHIZU_METERING_PARK_GRACE", "600", `SHIZU_METERING_PARK_GRACE: "600" is not a duration`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(tc.key, tc.value)
			cfg := app.DefaultConfig()
			cfg.RegisterFlags(flag.NewFlagSet("metering", flag.ContinueOnError))
			if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v; want it to say %q", err, tc.want)
			}
		})
	}
}

// Every documented SHIZU_METERING_* variable still sets its setting, and a
// flag on the command line wins over it.
func TestEnvironmentVariablesSetTheirSettings(t *testing.T) {
	dir := t.TempDir()
	accounts := filepath.Join(dir, "accounts.json")
	if err := os.WriteFile(accounts, []byte(`{}`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SHIZU_METERING_CATALOGUE", "../pricing/catalogue.json")
	t.Setenv("SHIZU_METERING_ACCOUNTS", accounts)
	t.Setenv("SHIZU_METERING_INTERVAL", "2m")
	t.Setenv("SHIZU_METERING_MINIMUM_CHARGE", "30s")
	t.Setenv("SHIZU_METERING_CONCURRENCY", "7")
	t.Setenv("SHIZU_METERING_PARK_GRACE", "3m")
	cfg := app.DefaultConfig()
	fs := flag.NewFlagSet("metering", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	if err := fs.Parse([]string{"-concurrency", "3"}); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if cfg.CataloguePath != "../pricing/catalogue.json" || cfg.AccountsPath != accounts || cfg.Rules.Interval != 2*time.Minute ||
		cfg.Rules.MinimumCharge != 30*time.Second || cfg.Concurrency != 3 || cfg.ParkGrace != 3*time.Minute {
		t.Fatalf("config %+v; want the variables' values and -concurrency 3", cfg)
	}
}
