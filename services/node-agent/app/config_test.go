package app

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Prices are read by the one money parser (rent.ParseMicros) as exact
// micro-units. It is stricter than the agent's old one: a sign ("+1") is
// refused too, and the largest price is the largest int64 of micro-units.
func TestPricesAreReadAsExactMicroUnits(t *testing.T) {
	t.Parallel()
	price := func(s string) (int64, error) {
		cfg := DefaultConfig()
		cfg.Price = s
		f, err := cfg.facts(1000, 1024)
		return f.PriceMicros, err
	}
	for in, want := range map[string]int64{"2.49": 2_490_000, "0": 0, "10": 10_000_000, "0.000001": 1, " 3.5 ": 3_500_000,
		"9223372036854.775807": 9223372036854775807} {
		if got, err := price(in); err != nil || got != want {
			t.Errorf("price %q = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "-1", "+1", "1.0000001", "abc", "1.x", ".5", "1e3", "9223372036854.775808"} {
		if _, err := price(bad); err == nil || !strings.Contains(err.Error(), "price") {
			t.Errorf("price %q: %v, want an error naming the price", bad, err)
		}
	}
}

func TestValidateReportsEveryProblemAtOnce(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.NodeID, cfg.Simulate, cfg.Market, cfg.Currency = "a b", "tpu", "lease", "usd"
	cfg.HeartbeatTTL, cfg.DefaultCommand = 500*time.Millisecond, nil
	err := cfg.Validate()
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"node.id", "simulate", "market", "heartbeat.ttl", "default.command"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

func TestFlagsOverrideTheEnvironment(t *testing.T) {
	t.Setenv("SHIZU_NODE_ZONE", "eu-west-1a")
	t.Setenv("SHIZU_NODE_MARKET", "spot")
	t.Setenv("SHIZU_HEARTBEAT_TTL", "5s")
	t.Setenv("SHIZU_DEFAULT_COMMAND", "sleep 60")
	cfg := DefaultConfig()
	fs := flag.NewFlagSet("node-agent", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	if err := fs.Parse([]string{"-simulate", "a100x8", "-heartbeat-ttl", "4s", "-node-id", "gpu-7"}); err != nil {
		t.Fatal(err)
	}
	if cfg.Zone != "eu-west-1a" || cfg.Market != "spot" || cfg.stateDir() != filepath.Join(os.TempDir(), "shizu-node-agent", "gpu-7") || cfg.HeartbeatTTL != 4*time.Second || cfg.Simulate != "a100x8" || cfg.NodeID != "gpu-7" ||
		strings.Join(cfg.DefaultCommand, " ") != "sleep 60" {
		t.Fatalf("config = %+v", cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
}

// Only a simulated host can be told of a spot interruption by a signal:
// a real one hears of it from its provider alone.
func TestASimulatedNoticeNeedsASimulatedHost(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.NodeID, cfg.SimulateNoticeLead = "gpu-1", 30*time.Second
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "simulate.notice_lead") {
		t.Fatalf("a real host took -simulate-notice-lead: %v", err)
	}
	cfg.Simulate = "h100x8"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	cfg.SimulateNoticeLead = -time.Second
	if err := cfg.Validate(); err == nil {
		t.Fatal("a negative lead was accepted")
	}
}

// An environment value that does not parse is reported, naming the
// variable: SHIZU_SIMULATE_NOTICE_LEAD=45 (no unit) used to leave the lead
// at 0, so the SIGUSR1 a harness then sent killed the agent.
func TestEnvironmentValuesThatDoNotParseAreReported(t *testing.T) {
	t.Setenv("SHIZU_SIMULATE_NOTICE_LEAD", "45")
	t.Setenv("SHIZU_CPU_MILLI", "many")
	t.Setenv("SHIZU_NODE_AGENT_HEARTBEAT_TTL", "soon")
	cfg := DefaultConfig()
	cfg.RegisterFlags(flag.NewFlagSet("node-agent", flag.ContinueOnError))
	cfg.NodeID, cfg.Simulate = "gpu-1", "a100x8"
	err := cfg.Validate()
	for _, want := range []string{`SHIZU_SIMULATE_NOTICE_LEAD: "45" is not a duration`, `SHIZU_CPU_MILLI: "many" is not a whole number`,
		`SHIZU_NODE_AGENT_HEARTBEAT_TTL: "soon" is not a duration`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v; want it to say %q", err, want)
		}
	}
}

// Every variable the agent read before the shared flag layer still
// configures it, and each flag's own SHIZU_NODE_AGENT_* variable wins over
// the older name.
func TestEveryDocumentedVariableStillConfiguresTheAgent(t *testing.T) {
	tests := []struct {
		env, value string
		got        func(Config) any
		want       any
	}{
		{"SHIZU_NODE_ID", "gpu-9", func(c Config) any { return c.NodeID }, "gpu-9"},
		{"SHIZU_SIMULATE", "a100x8", func(c Config) any { return c.Simulate }, "a100x8"},
		{"SHIZU_NODE_ZONE", "eu-west-1a", func(c Config) any { return c.Zone }, "eu-west-1a"},
		{"SHIZU_NODE_MARKET", "spot", func(c Config) any { return c.Market }, "spot"},
		{"SHIZU_PRICE", "3.10", func(c Config) any { return c.Price }, "3.10"},
		{"SHIZU_CURRENCY", "EUR", func(c Config) any { return c.Currency }, "EUR"},
		{"SHIZU_NODE_INSTANCE_TYPE", "p5.48xlarge", func(c Config) any { return c.InstanceType }, "p5.48xlarge"},
		{"SHIZU_CPU_MILLI", "4000", func(c Config) any { return c.CPUMilli }, int64(4000)},
		{"SHIZU_MEMORY_MIB", "8192", func(c Config) any { return c.MemoryMiB }, int64(8192)},
		{"SHIZU_HEARTBEAT_INTERVAL", "2s", func(c Config) any { return c.HeartbeatInterval }, 2 * time.Second},
		{"SHIZU_HEARTBEAT_TTL", "9s", func(c Config) any { return c.HeartbeatTTL }, 9 * time.Second},
		{"SHIZU_TELEMETRY_INTERVAL", "7s", func(c Config) any { return c.TelemetryInterval }, 7 * time.Second},
		{"SHIZU_LEASE_INTERVAL", "3s", func(c Config) any { return c.LeaseInterval }, 3 * time.Second},
		{"SHIZU_STATE_DIR", "/var/lib/shizu", func(c Config) any { return c.StateDir }, "/var/lib/shizu"},
		{"SHIZU_STOP_GRACE", "20s", func(c Config) any { return c.StopGrace }, 20 * time.Second},
		{"SHIZU_SIMULATE_NOTICE_LEAD", "45s", func(c Config) any { return c.SimulateNoticeLead }, 45 * time.Second},
		{"SHIZU_DEFAULT_COMMAND", "sleep 60", func(c Config) any { return strings.Join(c.DefaultCommand, " ") }, "sleep 60"},
	}
	for _, tc := range tests {
		t.Run(tc.env+" sets its flag", func(t *testing.T) {
			t.Setenv(tc.env, tc.value)
			cfg := DefaultConfig()
			cfg.RegisterFlags(flag.NewFlagSet("node-agent", flag.ContinueOnError))
			if got := tc.got(cfg); got != tc.want {
				t.Fatalf("%s=%q: got %v, want %v", tc.env, tc.value, got, tc.want)
			}
		})
	}
	t.Run("the flag's own variable wins over the older name", func(t *testing.T) {
		t.Setenv("SHIZU_NODE_ZONE", "old-zone")
		t.Setenv("SHIZU_NODE_AGENT_ZONE", "new-zone")
		cfg := DefaultConfig()
		cfg.RegisterFlags(flag.NewFlagSet("node-agent", flag.ContinueOnError))
		if cfg.Zone != "new-zone" {
			t.Fatalf("zone = %q", cfg.Zone)
		}
	})
}
