package app

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestPricesAreReadAsExactMicroUnits(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int64{"2.49": 2_490_000, "0": 0, "10": 10_000_000, "0.000001": 1, " 3.5 ": 3_500_000} {
		if got, err := parseMicros(in); err != nil || got != want {
			t.Errorf("parseMicros(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "-1", "1.0000001", "abc", "1.x", ".5"} {
		if _, err := parseMicros(bad); err == nil {
			t.Errorf("parseMicros(%q) accepted", bad)
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
	cfg := DefaultConfig()
	cfg.RegisterFlags(flag.NewFlagSet("node-agent", flag.ContinueOnError))
	cfg.NodeID, cfg.Simulate = "gpu-1", "a100x8"
	err := cfg.Validate()
	for _, want := range []string{`SHIZU_SIMULATE_NOTICE_LEAD: "45" is not a duration`, `SHIZU_CPU_MILLI: "many" is not a whole number`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v; want it to say %q", err, want)
		}
	}
}
