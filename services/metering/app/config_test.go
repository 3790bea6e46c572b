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
	t.Setenv("SHIZU_METERING_INTERVAL", "60")
	t.Setenv("SHIZU_METERING_CONCURRENCY", "four")
	cfg := app.DefaultConfig()
	cfg.RegisterFlags(flag.NewFlagSet("metering", flag.ContinueOnError))
	err := cfg.Validate()
	for _, want := range []string{`SHIZU_METERING_INTERVAL: "60" is not a duration`, `SHIZU_METERING_CONCURRENCY: "four" is not a whole number`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v; want it to say %q", err, want)
		}
	}
}
