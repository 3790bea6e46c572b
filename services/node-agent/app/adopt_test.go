package app_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

// workloadGone waits until the process the record of rental names has
// ended.
func workloadGone(t *testing.T, dir, rental string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "rentals", rental+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		PID int `json:"pid"`
	}
	if err := json.Unmarshal(b, &rec); err != nil || rec.PID <= 0 {
		t.Fatalf("record %s: pid %d, %v", b, rec.PID, err)
	}
	testkit.Eventually(t, 20*time.Second, func() error {
		if syscall.Kill(rec.PID, 0) == nil {
			return errors.New("the workload still runs")
		}
		return nil
	})
}

// A workload keeps its own exit status across an agent restart: the
// agent that adopts it is not its parent, yet a workload that exits 0 is
// completed, and one that exits 7 failed with code 7, whether it ends
// under the new agent or while no agent runs.
func TestAnAdoptedWorkloadKeepsItsExitStatus(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	tests := []struct {
		name     string
		node     string
		script   string
		whileOff bool // the workload ends before the next agent starts
		reason   shizuv1.ExitReason
		code     int32
		message  string
	}{
		{"one that exits 0 under the new agent is completed", "n-adopt0", "sleep 2; echo finished",
			false, shizuv1.ExitReason_EXIT_REASON_COMPLETED, 0, "finished"},
		{"one that exits 7 while no agent runs failed with code 7", "n-adopt7", "sleep 1; echo crashed; exit 7",
			true, shizuv1.ExitReason_EXIT_REASON_FAILED, 7, "crashed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			killWorkloads(t, dir)
			rental := "r-" + tc.node
			first := e.start(t, e.config(t, tc.node, "rtx4090x8", dir))
			e.registered(t, tc.node, 1)
			e.send(t, tc.node, "start", e.place(t, tc.node, 1, rental, 1000, 0, "sh", "-c", tc.script))
			startedOf(t, e, rental)
			first.stop(t)
			if tc.whileOff {
				workloadGone(t, dir, rental)
			}
			e.start(t, e.config(t, tc.node, "rtx4090x8", dir))
			stopped := stoppedOf(t, e, rental)
			if stopped.GetExitReason() != tc.reason || stopped.GetExitCode() != tc.code || stopped.GetMessage() != tc.message {
				t.Fatalf("stopped = %v, want %s, exit code %d, message %q", stopped, tc.reason, tc.code, tc.message)
			}
		})
	}
}
