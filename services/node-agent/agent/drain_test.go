package agent_test

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/node-agent/agent"
)

func TestADrainKeepsItsFirstStartAndReasonAndIsAnnouncedOnceTheNodeIsEmpty(t *testing.T) {
	t.Parallel()
	var d agent.Drain
	if d.Due(0) {
		t.Fatal("a node that does not drain is due a NodeDrained")
	}
	d.Begin(t0, "scale-in of pool web")
	d.Begin(t0.Add(time.Minute), "spot interruption: reclaim")
	if d.StartedAt != t0 || d.Reason != "scale-in of pool web" {
		t.Fatalf("drain = %+v, want the first start and reason", d)
	}
	if d.Due(1) {
		t.Fatal("a drain is due while a workload runs")
	}
	if !d.Due(0) {
		t.Fatal("an empty draining node is not due its NodeDrained")
	}
	d.Announced = true
	if d.Due(0) {
		t.Fatal("a NodeDrained is due twice")
	}
}

func TestARegistrationTakesTheDrainFromTheStoreAndOwesANewAnnouncement(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		before   agent.Drain
		draining bool
		want     agent.Drain
	}{
		{"a node found draining after a restart drains for that reason", agent.Drain{}, true,
			agent.Drain{Active: true, StartedAt: t0, Reason: agent.RestartReason}},
		{"a drain this agent started keeps its start and reason and is announced again", agent.Drain{Active: true, StartedAt: t0.Add(-time.Hour),
			Reason: "scale-in", Announced: true}, true, agent.Drain{Active: true, StartedAt: t0.Add(-time.Hour), Reason: "scale-in"}},
		{"a node the store has ready again takes work", agent.Drain{Active: true, StartedAt: t0.Add(-time.Hour), Reason: "scale-in", Announced: true},
			false, agent.Drain{StartedAt: t0.Add(-time.Hour), Reason: "scale-in"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := tc.before
			d.Registered(tc.draining, t0)
			if d != tc.want {
				t.Fatalf("drain = %+v, want %+v", d, tc.want)
			}
		})
	}
}

func TestAStopWaitsTheGraceItAsksForUpToTheConsumersLimit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		grace *durationpb.Duration
		want  time.Duration
	}{
		{"no grace asked takes the configured one", nil, 10 * time.Second},
		{"a short grace is kept", durationpb.New(2 * time.Second), 2 * time.Second},
		{"a zero grace kills at once", durationpb.New(0), 0},
		{"a grace beyond the ack wait is cut to the limit", durationpb.New(time.Hour), agent.MaxStopGrace},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := agent.StopGrace(&shizuv1.StopRental{GracePeriod: tc.grace}, 10*time.Second); got != tc.want {
				t.Fatalf("grace = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestTheAgentRegistersAgainWhenTheStoreLostKilledOrFencedItsNode(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		node agent.StoredNode
		want bool
	}{
		{"a node at the agent's epoch stays", agent.StoredNode{Found: true, Epoch: 3}, false},
		{"a node the store lost registers again", agent.StoredNode{}, true},
		{"a dead node registers again", agent.StoredNode{Found: true, Dead: true, Epoch: 3}, true},
		{"a fenced node (a newer epoch) registers again", agent.StoredNode{Found: true, Epoch: 4}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := agent.MustRegister(tc.node, 3); got != tc.want {
				t.Fatalf("MustRegister = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestEachVerdictHasTheOutcomeLabelItIsCountedUnder(t *testing.T) {
	t.Parallel()
	want := map[agent.Verdict]string{agent.Run: "run", agent.AlreadyDone: "already_done", agent.Skip: "skipped",
		agent.Invalid: "invalid", agent.Retry: "retry", agent.Verdict(0): ""}
	for v, label := range want {
		if v.String() != label {
			t.Errorf("verdict %d = %q, want %q", int(v), v.String(), label)
		}
	}
}
