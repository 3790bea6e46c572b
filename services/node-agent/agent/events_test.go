package agent_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/node-agent/agent"
	"github.com/shizu-gpu/shizu/services/node-agent/gpu"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func events() agent.Events { return agent.Events{NodeID: "n1", Source: "node-agent/n1"} }

func rental() agent.Rental {
	return agent.Rental{RentalID: "r1", TenantID: "acme", Attempt: 2, Epoch: 3, GPUUUIDs: []string{"GPU-0"}, MilliGPU: 1000, StartedAt: t0}
}

// validated is a check every built event must pass: it validates and
// encodes (proto.Marshal refuses invalid UTF-8).
func validated(t *testing.T, ev interface {
	proto.Message
	Validate() error
}) {
	t.Helper()
	if err := ev.Validate(); err != nil {
		t.Fatalf("%T does not validate: %v", ev, err)
	}
	if _, err := proto.Marshal(ev); err != nil {
		t.Fatalf("%T does not encode: %v", ev, err)
	}
}

func TestEachEventIsNamedByWhatHappenedSoARepeatIsStoredOnce(t *testing.T) {
	t.Parallel()
	e := events()
	desc, err := agent.Describe(facts(), inventory())
	if err != nil {
		t.Fatal(err)
	}
	change := agent.HealthChange{Index: 1, Previous: healthy, Now: degraded, XID: 63, Reason: "Xid 63"}
	tests := []struct {
		name string
		meta *shizuv1.EventMeta
		want string
	}{
		{"a registration by node and epoch", e.Registered(desc, 4, t0).GetMeta(), "node:n1:registered:4"},
		{"a start by rental and attempt", e.Started(rental(), "cmd-1").GetMeta(), "rental:r1:started:2"},
		{"a stop by rental and attempt", e.Stopped(rental(), agent.Outcome{StoppedAt: t0}, "").GetMeta(), "rental:r1:stopped:2"},
		{"a notice by node and epoch", e.Interruption(3, gpu.Notice{Deadline: t0}, t0).GetMeta(), "node:n1:interruption:3"},
		{"a drain by node and epoch", e.Drained(3, agent.Drain{}, t0).GetMeta(), "node:n1:drained:3"},
		{"a health change by epoch, GPU and health", e.HealthChanged(3, change, t0).GetMeta(), "node:n1:health:3:1:HEALTH_DEGRADED"},
		{"telemetry by epoch and millisecond", e.Telemetry(3, t0, nil).GetMeta(), fmt.Sprintf("node:n1:telemetry:3:%d", t0.UnixMilli())},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if tc.meta.GetEventId() != tc.want || tc.meta.GetSource() != "node-agent/n1" {
				t.Fatalf("meta = %v, want id %s from node-agent/n1", tc.meta, tc.want)
			}
		})
	}
}

func TestARegistrationCarriesItsEpochAndLeavesTheDescriptionAlone(t *testing.T) {
	t.Parallel()
	desc, err := agent.Describe(facts(), inventory())
	if err != nil {
		t.Fatal(err)
	}
	ev := events().Registered(desc, 4, t0)
	validated(t, ev)
	if ev.GetEpoch() != 4 || ev.GetMeta().GetCorrelationId() != "n1" || desc.GetMeta() != nil || desc.GetEpoch() != 0 {
		t.Fatalf("registered = %v, description now %v", ev, desc)
	}
}

func TestAStartAndItsStopCarryTheRuntimesTimestampsAndTheCommandThatCausedThem(t *testing.T) {
	t.Parallel()
	e := events()
	started := e.Started(rental(), "cmd-1")
	validated(t, started)
	if !started.GetStartedAt().AsTime().Equal(t0) || started.GetMeta().GetCausationId() != "cmd-1" ||
		started.GetMeta().GetCorrelationId() != "r1" || started.GetNodeEpoch() != 3 || started.GetNodeId() != "n1" {
		t.Fatalf("started = %v", started)
	}
	o := agent.Outcome{Reason: shizuv1.ExitReason_EXIT_REASON_FAILED, ExitCode: 7, StoppedAt: t0.Add(time.Minute), Message: "CUDA error"}
	stopped := e.Stopped(rental(), o, "")
	validated(t, stopped)
	if !stopped.GetStartedAt().AsTime().Equal(t0) || !stopped.GetStoppedAt().AsTime().Equal(o.StoppedAt) ||
		stopped.GetExitCode() != 7 || stopped.GetMessage() != "CUDA error" || !stopped.GetMeta().GetOccurredAt().AsTime().Equal(o.StoppedAt) {
		t.Fatalf("stopped = %v", stopped)
	}
}

func TestAStopMessageOfProgressBarsIsCutOnARuneBoundaryAndEncodes(t *testing.T) {
	t.Parallel()
	bar := strings.Repeat("█", 2000) // 6000 bytes, three per rune
	tests := []struct {
		name, message string
	}{
		{"a bar longer than the limit", bar},
		{"a bar whose first rune was cut off by a log tail", bar[1:]},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ev := events().Stopped(rental(), agent.Outcome{Reason: shizuv1.ExitReason_EXIT_REASON_FAILED, StoppedAt: t0, Message: tc.message}, "")
			validated(t, ev)
			if m := ev.GetMessage(); !utf8.ValidString(m) || len(m) > agent.MaxStopMessage || len(m) < agent.MaxStopMessage-3 {
				t.Fatalf("message of %d bytes, valid %v", len(m), utf8.ValidString(m))
			}
		})
	}
}

func TestTelemetryLeavesLostGPUsOut(t *testing.T) {
	t.Parallel()
	ev := events().Telemetry(3, t0, []gpu.Sample{{Index: 0, PowerMW: 700_000, TemperatureC: 60}, {Index: 1, Lost: true}})
	validated(t, ev)
	if len(ev.GetGpus()) != 1 || ev.GetGpus()[0].GetGpuIndex() != 0 || ev.GetGpus()[0].GetPowerMw() != 700_000 {
		t.Fatalf("telemetry = %v", ev)
	}
}

func TestANoticeAndADrainSayWhenAndWhy(t *testing.T) {
	t.Parallel()
	n := events().Interruption(3, gpu.Notice{Deadline: t0.Add(2 * time.Minute), Reason: "instance-action: terminate"}, t0)
	validated(t, n)
	if !n.GetDeadline().AsTime().Equal(t0.Add(2*time.Minute)) || n.GetReason() != "instance-action: terminate" || n.GetEpoch() != 3 {
		t.Fatalf("notice = %v", n)
	}
	d := events().Drained(3, agent.Drain{Active: true, StartedAt: t0, Reason: "scale-in"}, t0.Add(time.Hour))
	validated(t, d)
	if !d.GetDrainStartedAt().AsTime().Equal(t0) || d.GetReason() != "scale-in" || d.GetEpoch() != 3 {
		t.Fatalf("drained = %v", d)
	}
}

func TestAWorkloadThatEndedIsReportedWithWhyAndNeverBeforeItStarted(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		requested shizuv1.ExitReason
		code      int
		stoppedAt time.Time
		want      agent.Outcome
	}{
		{"a workload that exited by itself keeps its code", shizuv1.ExitReason_EXIT_REASON_UNSPECIFIED, 3, t0.Add(time.Minute),
			agent.Outcome{Reason: shizuv1.ExitReason_EXIT_REASON_FAILED, ExitCode: 3, StoppedAt: t0.Add(time.Minute), Message: "detail"}},
		{"a stopped workload reports why it was stopped", shizuv1.ExitReason_EXIT_REASON_CANCELLED, -1, t0.Add(time.Minute),
			agent.Outcome{Reason: shizuv1.ExitReason_EXIT_REASON_CANCELLED, StoppedAt: t0.Add(time.Minute), Message: "detail"}},
		{"a stop stamped before the start (a clock step) is moved to the start", shizuv1.ExitReason_EXIT_REASON_UNSPECIFIED, 0, t0.Add(-time.Second),
			agent.Outcome{Reason: shizuv1.ExitReason_EXIT_REASON_COMPLETED, StoppedAt: t0, Message: "detail"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := agent.Ended(rental(), tc.requested, tc.code, tc.stoppedAt, "detail"); got != tc.want {
				t.Fatalf("outcome = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestAWorkloadThatNeverRanIsAZeroLengthFailedRun(t *testing.T) {
	t.Parallel()
	got := agent.FailedToStart(t0, errors.New("exec: \"trian\": executable file not found"))
	want := agent.Outcome{Reason: shizuv1.ExitReason_EXIT_REASON_FAILED, ExitCode: -1, StoppedAt: t0,
		Message: "exec: \"trian\": executable file not found"}
	if got != want {
		t.Fatalf("outcome = %+v, want %+v", got, want)
	}
}
