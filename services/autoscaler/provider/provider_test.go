package provider_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/services/autoscaler/provider"
	"github.com/shizu-gpu/shizu/services/autoscaler/provider/providertest"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

func TestMemoryProviderKeepsTheContract(t *testing.T) {
	t.Parallel()
	providertest.Run(t, providertest.Subject{
		New:          func(*testing.T) provider.Provider { return providertest.NewMemory() },
		InstanceType: "p5.48xlarge",
	})
}

func TestMemoryProviderRunsOutOfSpot(t *testing.T) {
	t.Parallel()
	m := providertest.NewMemory()
	m.SpotCapacity = 1
	if _, err := m.Provision(t.Context(), "x", provider.Spot, "z", 2); !errors.Is(err, provider.ErrInsufficientCapacity) {
		t.Fatalf("got %v", err)
	}
	if _, err := m.Provision(t.Context(), "x", provider.OnDemand, "z", 2); err != nil {
		t.Fatalf("on-demand refused: %v", err)
	}
}

// buildStandIn compiles the stand-in node-agent into a temporary directory.
func buildStandIn(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "node-agent")
	cmd := exec.Command("go", "build", "-o", bin, "./testdata/standin")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the stand-in node-agent: %v\n%s", err, out)
	}
	return bin
}

// newLocal returns a local provider starting the stand-in agent, which
// records its arguments and environment under dir; every agent is stopped
// at cleanup.
func newLocal(t *testing.T, bin, dir string) *provider.Local {
	t.Helper()
	local, err := provider.NewLocal(provider.LocalConfig{
		Binary:   bin,
		Profiles: map[string]string{"p5.48xlarge": "h100x8"},
		Env: map[string]string{"SHIZU_NATS_URL": "nats://127.0.0.1:4222", "SHIZU_NATS_USER": "node-agent",
			"SHIZU_NATS_PASSWORD": "pw", "SHIZU_REDIS_URL": "redis://127.0.0.1:6379/0", "STANDIN_DIR": dir},
		SpotCapacity: -1,
		StopGrace:    10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = local.Close(context.WithoutCancel(t.Context())) })
	return local
}

func TestLocalProviderKeepsTheContract(t *testing.T) {
	t.Parallel()
	bin := buildStandIn(t)
	providertest.Run(t, providertest.Subject{
		New:                 func(t *testing.T) provider.Provider { return newLocal(t, bin, t.TempDir()) },
		InstanceType:        "p5.48xlarge",
		UnknownInstanceType: "zzz",
	})
}

func TestLocalProviderStartsAndStopsAgentProcesses(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	local := newLocal(t, buildStandIn(t), dir)
	if _, err := local.Provision(t.Context(), "p5.48xlarge", provider.OnDemand, "z1", 2); err != nil {
		t.Fatal(err)
	}
	if _, err := local.Provision(t.Context(), "p5.48xlarge", provider.Spot, "z1", 1); err != nil {
		t.Fatal(err)
	}
	nodes, _ := local.List(t.Context())
	if len(nodes) != 3 {
		t.Fatalf("listed %+v; want 3 nodes", nodes)
	}
	for _, n := range nodes {
		var rec string
		testkit.Eventually(t, 10*time.Second, func() error {
			b, err := os.ReadFile(filepath.Join(dir, n.ID+".started"))
			rec = string(b)
			return err
		})
		for _, want := range []string{"args=-simulate h100x8 -node-id " + n.ID, "SHIZU_NATS_URL=nats://127.0.0.1:4222",
			"SHIZU_NATS_USER=node-agent", "SHIZU_NATS_PASSWORD=pw", "SHIZU_REDIS_URL=redis://127.0.0.1:6379/0",
			"SHIZU_NODE_ZONE=z1", "SHIZU_NODE_MARKET=" + string(n.Market)} {
			if !strings.Contains(rec, want) {
				t.Errorf("%s: record lacks %q:\n%s", n.ID, want, rec)
			}
		}
		if err := local.Release(t.Context(), n.ID); err != nil {
			t.Fatal(err)
		}
		// Release returns once the process exited; it exited on SIGTERM.
		if b, err := os.ReadFile(filepath.Join(dir, n.ID+".stopped")); err != nil || string(b) != "SIGTERM\n" {
			t.Fatalf("%s did not stop on SIGTERM: %q %v", n.ID, b, err)
		}
	}
}

func TestLocalProviderRefusesBadConfigAndUnknownTypes(t *testing.T) {
	t.Parallel()
	_, err := provider.NewLocal(provider.LocalConfig{Binary: "/nonexistent/node-agent"})
	if err == nil || !strings.Contains(err.Error(), "binary") || !strings.Contains(err.Error(), "profiles") {
		t.Fatalf("got %v", err)
	}
	local, err := provider.NewLocal(provider.LocalConfig{Binary: "/bin/true", Profiles: map[string]string{"a": "b"}, SpotCapacity: 0})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := local.Provision(t.Context(), "zzz", provider.OnDemand, "z", 1); !errors.Is(err, provider.ErrUnknownInstanceType) {
		t.Fatalf("unknown type: %v", err)
	}
	if _, err := local.Provision(t.Context(), "a", provider.Spot, "z", 1); !errors.Is(err, provider.ErrInsufficientCapacity) {
		t.Fatalf("spot beyond capacity: %v", err)
	}
}
