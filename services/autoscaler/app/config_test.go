package app_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

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
