package main

import (
	"log/slog"
	"slices"
	"testing"

	"github.com/shizu-gpu/shizu/services/autoscaler/provider"
	"github.com/shizu-gpu/shizu/services/autoscaler/provider/providertest"
	nodeagent "github.com/shizu-gpu/shizu/services/node-agent/app"
)

// The dev provider turns the autoscaler's provision and release calls into
// node agents added to and removed from the simulated fleet. (That a
// provisioned agent registers and takes a pending rental is checked by
// hand against shizu dev; here the agents have no server to reach.)
func TestDevProviderAddsAndRemovesFleetNodes(t *testing.T) {
	t.Parallel()
	config := unreachableAgent(t)
	runner, err := newFleetRunner([]fleetNode{{ID: "h100x8-1", Profile: "h100x8", Market: "on-demand"}}, config, discardLogger())
	if err != nil {
		t.Fatal(err)
	}
	profiles := map[string]string{"rtx-box": "rtx4090x8"} // the policy's instance types
	p := newDevProvider(t.Context(), runner, profiles, config)

	ids, err := p.Provision(t.Context(), "rtx-box", provider.Spot, "zone-b", 2)
	if err != nil || !slices.Equal(ids, []string{"rtx4090x8-auto-1", "rtx4090x8-auto-2"}) {
		t.Fatalf("provision: %v, %v", ids, err)
	}
	if got := runner.ids(); !slices.Equal(got, []string{"h100x8-1", "rtx4090x8-auto-1", "rtx4090x8-auto-2"}) {
		t.Fatalf("fleet after provisioning: %v", got)
	}
	listed, _ := p.List(t.Context())
	if len(listed) != 2 || listed[0].Market != provider.Spot || listed[0].Zone != "zone-b" || listed[0].InstanceType != "rtx-box" {
		t.Fatalf("list: %+v", listed)
	}
	runner.mu.Lock()
	cfg := runner.agents["rtx4090x8-auto-1"].cfg
	runner.mu.Unlock()
	if cfg.Zone != "zone-b" || cfg.Market != "spot" || cfg.Simulate != "rtx4090x8" || cfg.InstanceType != "rtx-box" {
		t.Fatalf("agent config %+v", cfg)
	}
	if err := p.Release(t.Context(), "rtx4090x8-auto-1"); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(t.Context(), "h100x8-1"); err != nil { // not provisioned: left alone
		t.Fatal(err)
	}
	if err := p.Release(t.Context(), "rtx4090x8-auto-1"); err != nil { // idempotent
		t.Fatal(err)
	}
	if got := runner.ids(); !slices.Equal(got, []string{"h100x8-1", "rtx4090x8-auto-2"}) {
		t.Fatalf("fleet after release: %v", got)
	}
	runner.stopAll()
}

// unreachableAgent configures the dev fleet's agents with no server to
// reach: each stops at once.
func unreachableAgent(t *testing.T) func(fleetNode) nodeagent.Config {
	return func(n fleetNode) nodeagent.Config {
		c := nodeagent.DefaultConfig()
		c.Service.NATS.URL = "nats://127.0.0.1:1" // nothing listens: the agent stops at once
		c.NodeID, c.Simulate, c.Market = n.ID, n.Profile, n.Market
		c.StateDir = t.TempDir()
		return c
	}
}

func TestDevProviderKeepsTheProviderContract(t *testing.T) {
	t.Parallel()
	profiles := map[string]string{"rtx-box": "rtx4090x8"} // the policy's instance types
	providertest.Run(t, providertest.Subject{
		New: func(t *testing.T) provider.Provider {
			config := unreachableAgent(t)
			runner, err := newFleetRunner(nil, config, discardLogger())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(runner.stopAll)
			return newDevProvider(t.Context(), runner, profiles, config)
		},
		InstanceType:        "rtx-box",
		UnknownInstanceType: "p5.48xlarge",
	})
}

// discardLogger logs nothing: for a runner without a log file.
func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
