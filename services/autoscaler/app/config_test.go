package app_test

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/services/autoscaler/app"
)

func TestConfigValidationReportsThePolicyFileProblems(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(path, []byte(`{"pools": [{"id": "web", "tenant": "acme", "rental": {"gpu_count": 1, "milli_gpu": 1000},
		"min_replicas": 3, "max_replicas": 2, "max_step_out": 1, "max_step_in": 1}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := app.DefaultConfig()
	cfg.PolicyFile = path
	cfg.Tick = 0
	err := cfg.Validate()
	if err == nil {
		t.Fatal("bad configuration accepted")
	}
	for _, want := range []string{"autoscaler.tick", "autoscaler.policy " + path, "pools[0].max_replicas: 2 is below min_replicas 3", "pools[0].thresholds: missing"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
}

func TestTheExamplePolicyIsAValidConfiguration(t *testing.T) {
	t.Parallel()
	cfg := app.DefaultConfig()
	cfg.PolicyFile = "../policy/testdata/example.json"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	cfg.PolicyFile = "/nonexistent/policy.json"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "autoscaler.policy") {
		t.Fatalf("missing file: %v", err)
	}
}

func TestConfigValidationReportsABadSpotCapacity(t *testing.T) {
	// Not parallel: it sets an environment variable.
	t.Setenv("SHIZU_AUTOSCALER_SPOT_CAPACITY", "two")
	cfg := app.DefaultConfig()
	cfg.RegisterFlags(flag.NewFlagSet("autoscaler", flag.ContinueOnError))
	err := cfg.Validate()
	if err == nil || !strings.Contains(err.Error(), `SHIZU_AUTOSCALER_SPOT_CAPACITY: "two" is not a whole number`) {
		t.Errorf("malformed SHIZU_AUTOSCALER_SPOT_CAPACITY: Validate = %v", err)
	}

	t.Setenv("SHIZU_AUTOSCALER_SPOT_CAPACITY", "3")
	cfg = app.DefaultConfig()
	fs := flag.NewFlagSet("autoscaler", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	if cfg.SpotCapacity != 3 {
		t.Errorf("SpotCapacity = %d from SHIZU_AUTOSCALER_SPOT_CAPACITY=3", cfg.SpotCapacity)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("spot capacity 3: %v", err)
	}
	if err := fs.Parse([]string{"-spot-capacity", "-2"}); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "autoscaler.spot-capacity: -2") {
		t.Errorf("-spot-capacity -2: Validate = %v", err)
	}
	cfg.SpotCapacity = -1
	if err := cfg.Validate(); err != nil {
		t.Errorf("spot capacity -1 (unlimited): %v", err)
	}
}

func TestEveryAutoscalerFlagHasASHIZU_AUTOSCALERVariable(t *testing.T) {
	t.Parallel()
	cfg := app.DefaultConfig()
	fs := flag.NewFlagSet("autoscaler", flag.ContinueOnError)
	cfg.Service.RegisterFlags(fs)
	cfg.RegisterFlags(fs)
	fs.VisitAll(func(f *flag.Flag) {
		want := "[SHIZU_AUTOSCALER_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if !strings.Contains(f.Usage, want) {
			t.Errorf("-%s: help %q does not name %s]", f.Name, f.Usage, want)
		}
	})
}

func TestTheAutoscalersExistingVariablesStillConfigureIt(t *testing.T) {
	// Not parallel: it sets environment variables.
	t.Setenv("SHIZU_AUTOSCALER_POLICY", "/etc/shizu/policy.json")
	t.Setenv("SHIZU_AUTOSCALER_NODE_AGENT", "/usr/bin/node-agent")
	t.Setenv("SHIZU_NODE_AGENT_NATS_PASSWORD", "agent-secret")
	t.Setenv("SHIZU_AUTOSCALER_TICK", "2s")
	cfg := app.DefaultConfig()
	fs := flag.NewFlagSet("autoscaler", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	if cfg.PolicyFile != "/etc/shizu/policy.json" || cfg.NodeAgentBinary != "/usr/bin/node-agent" ||
		cfg.AgentNATSPassword != "agent-secret" || cfg.Tick != 2*time.Second {
		t.Fatalf("environment not applied: %+v", cfg)
	}
	if err := fs.Parse([]string{"-tick", "9s", "-node-agent", ""}); err != nil {
		t.Fatal(err)
	}
	if cfg.Tick != 9*time.Second || cfg.NodeAgentBinary != "" {
		t.Errorf("the command line must win: tick %s, node agent %q", cfg.Tick, cfg.NodeAgentBinary)
	}
}
