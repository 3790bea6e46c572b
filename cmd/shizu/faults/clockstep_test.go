package faults

import (
	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"

	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"time"

	nodeagent "github.com/shizu-gpu/shizu/services/node-agent/app"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// steppedClock is a wall clock an operator (or NTP) steps: its readings
// carry no monotonic part (Round(0)), as a wall clock read after a step
// looks (as services/node-agent/app/clock_test.go's).
type steppedClock struct {
	mu     sync.Mutex
	offset time.Duration
}

func (c *steppedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset).Round(0)
}

func (c *steppedClock) Step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset += d
}

// steppedZone is the zone of the node whose clock is stepped; the warm
// load asks for it, so its rentals run there.
const steppedZone = "stepped"

// clockStep runs n00's agent in this process on a stepped clock, places
// the whole load there (steppedSpec), and steps the clock an hour forward,
// then two hours back, while rentals start and stop on it. Every run must last
// what it really lasted, be billed that, and nothing may be evicted.
func clockStep() scenario {
	var clock *steppedClock
	return scenario{Name: "clock-step",
		Shape: func(sh *shape, sz size) { sh.InProcessAgents = []string{"n00"} },
		Setup: func(r *run) {
			clock = &steppedClock{}
			r.d.startAgentInProcess("n00", clock.Now)
			r.d.waitNodesReady()
		},
		Spec: steppedSpec,
		Fault: func(r *run) {
			clock.Step(time.Hour)
			hold(r.ctx, 3*time.Second)
			clock.Step(-2 * time.Hour)
			hold(r.ctx, 3*time.Second)
		},
		Check: func(r *run, o observation) {
			longest := time.Since(r.started)
			bad, stepped := 0, 0
			for _, s := range o.Runs {
				if s.Node == "n00" {
					stepped++
				}
				if s.Node == "n00" && !s.Stopped.IsZero() && (s.Stopped.Before(s.Started) || s.Stopped.Sub(s.Started) > longest) {
					bad++
					r.res.problem("%s attempt %d ran %s by its stamps, the scenario lasted %s", s.Rental, s.Attempt, s.Stopped.Sub(s.Started), longest)
				}
			}
			r.res.Extra["bad_runs_mistimed"] = float64(bad)
			r.res.Extra["runs_on_stepped_node"] = float64(stepped)
			if stepped == 0 {
				r.res.Extra["bad_no_run_on_stepped_node"] = 1
			}
		}}
}

// steppedSpec is request i of the clock-step load: a quarter GPU on the
// stepped node, every other one a short workload (2 s) that completes,
// so that the whole load fits on that node.
func steppedSpec(d *deployment, i int) *rentalSpec {
	sp := &rentalSpec{Plan: shizuv1.Plan_PLAN_ON_DEMAND, GpuCount: 1, MilliGpu: 250, VramMib: 20480, Zone: steppedZone}
	if i%2 == 1 {
		sp.Command = []string{d.workload, "2"}
	}
	return sp
}

// startAgentInProcess runs node's agent in this process with clock (the
// agent's Config.Now), until the test ends.
func (d *deployment) startAgentInProcess(node string, clock func() time.Time) {
	t := d.t
	log, err := os.OpenFile(filepath.Join(d.subdir("logs"), "agent-"+node+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cfg := nodeagent.DefaultConfig()
	cfg.Service = d.serviceDefaults("node-agent-"+node, topology.NodeAgent)
	cfg.Service.LogWriter = log
	cfg.NodeID, cfg.Simulate, cfg.Zone = node, d.shape.Profile, steppedZone
	cfg.StateDir = d.subdir(filepath.Join("state", node))
	cfg.DefaultCommand, cfg.StopGrace, cfg.TelemetryInterval = []string{d.workload}, 2*time.Second, 30*time.Second
	cfg.Now = clock
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- nodeagent.Run(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("in-process agent %s: %v", node, err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("in-process agent %s did not stop within 20 s", node)
		}
		_ = log.Close()
	})
}

type rentalSpec = shizuv1.RentalSpec
