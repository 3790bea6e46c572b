package runtime_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/shizu-gpu/shizu/services/node-agent/runtime"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

func spec(id string, cmd ...string) runtime.Spec {
	return runtime.Spec{RentalID: id, TenantID: "acme", Attempt: 1, Epoch: 1, GPUUUIDs: []string{"GPU-a"},
		Command: cmd, Env: map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-a", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}}
}

func open(t *testing.T, dir string) *runtime.Process {
	t.Helper()
	p, err := runtime.NewProcess(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, w := range p.List() {
			_ = syscall.Kill(-w.PID, syscall.SIGKILL)
		}
		_ = p.Close()
	})
	return p
}

func nextExit(t *testing.T, p *runtime.Process) runtime.Exit {
	t.Helper()
	select {
	case x := <-p.Exits():
		return x
	case <-time.After(20 * time.Second):
		t.Fatal("no exit reported")
	}
	return runtime.Exit{}
}

func logOf(t *testing.T, w runtime.Workload) string {
	t.Helper()
	b, err := os.ReadFile(w.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestAWorkloadRunsWithItsGPUsInTheEnvironmentAndNothingOfTheAgents(t *testing.T) {
	t.Setenv("SHIZU_NATS_PASSWORD", "secret") // an agent credential must not leak
	p := open(t, t.TempDir())
	w, err := p.Start(t.Context(), spec("r1", "sh", "-c", "env; sleep 30"))
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		if !strings.Contains(logOf(t, w), "CUDA_VISIBLE_DEVICES=GPU-a") {
			return errors.New("environment not logged yet")
		}
		return nil
	})
	log := logOf(t, w)
	for _, want := range []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25", "HOME=", "PATH="} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	if strings.Contains(log, "SHIZU_NATS_PASSWORD") {
		t.Errorf("agent credential leaked into the workload:\n%s", log)
	}
	if got := p.List(); len(got) != 1 || got[0].PID != w.PID {
		t.Fatalf("list = %+v", got)
	}
	again, err := p.Start(t.Context(), spec("r1", "sh", "-c", "exit 3"))
	if err != nil || again.PID != w.PID {
		t.Fatalf("second start of a running rental = %+v, %v; want the running one", again, err)
	}
	if err := p.Stop(t.Context(), "r1", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	x := nextExit(t, p)
	if x.Workload.Spec.RentalID != "r1" || x.ExitCode != -1 || !strings.Contains(x.Detail, "killed by SIGTERM") {
		t.Fatalf("exit = %+v", x)
	}
	if x.StoppedAt.Before(x.Workload.StartedAt) {
		t.Fatalf("stopped %v before started %v", x.StoppedAt, x.Workload.StartedAt)
	}
	if err := syscall.Kill(w.PID, 0); err == nil {
		t.Fatal("process still exists after stop")
	}
	if err := p.Forget("r1"); err != nil {
		t.Fatal(err)
	}
}

func TestAWorkloadThatIgnoresTheSignalIsKilledAfterTheGracePeriod(t *testing.T) {
	t.Parallel()
	p := open(t, t.TempDir())
	w, err := p.Start(t.Context(), spec("stubborn", "sh", "-c", "trap '' TERM; echo ready; while true; do sleep 1; done"))
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		if !strings.Contains(logOf(t, w), "ready") {
			return errors.New("not ready")
		}
		return nil
	})
	if err := p.Stop(t.Context(), "stubborn", 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if x := nextExit(t, p); !strings.Contains(x.Detail, "killed") {
		t.Fatalf("exit = %+v, want killed", x)
	}
}

func TestAWorkloadThatEndsByItselfReportsItsCodeAndLastLine(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, script string
		code         int
	}{
		{"a clean exit reports code 0", "echo done; exit 0", 0},
		{"a crash reports its code and last line", "echo 'CUDA error: out of memory'; exit 7", 7},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := open(t, t.TempDir())
			if _, err := p.Start(t.Context(), spec("r", "sh", "-c", tc.script)); err != nil {
				t.Fatal(err)
			}
			x := nextExit(t, p)
			if x.ExitCode != tc.code {
				t.Fatalf("code = %d, want %d", x.ExitCode, tc.code)
			}
			if last := strings.TrimPrefix(strings.SplitN(tc.script, ";", 2)[0], "echo "); x.Detail != strings.Trim(last, "'") {
				t.Fatalf("detail = %q", x.Detail)
			}
		})
	}
}

func TestANewRuntimeAdoptsRunningWorkloadsAndReportsThoseThatEnded(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first, err := runtime.NewProcess(dir)
	if err != nil {
		t.Fatal(err)
	}
	keep, err := first.Start(t.Context(), spec("keep", "sleep", "30"))
	if err != nil {
		t.Fatal(err)
	}
	short, err := first.Start(t.Context(), spec("short", "sleep", "30")) // runs until the test kills it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-keep.PID, syscall.SIGKILL) })
	_ = first.Close() // the agent goes away; its workloads keep running
	if err := syscall.Kill(-short.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The closed runtime still reaps its child; wait until it is gone.
	testkit.Eventually(t, 10*time.Second, func() error {
		if syscall.Kill(short.PID, 0) == nil {
			return fmt.Errorf("pid %d still there", short.PID)
		}
		return nil
	})

	second := open(t, dir)
	list := second.List()
	if len(list) != 1 || list[0].Spec.RentalID != "keep" || !list[0].Adopted || !list[0].StartedAt.Equal(keep.StartedAt) {
		t.Fatalf("adopted = %+v", list)
	}
	if x := nextExit(t, second); x.Workload.Spec.RentalID != "short" || x.ExitCode != -1 {
		t.Fatalf("exit of the workload that ended meanwhile = %+v", x)
	}
	if err := second.Stop(t.Context(), "keep", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if x := nextExit(t, second); x.Workload.Spec.RentalID != "keep" {
		t.Fatalf("exit = %+v", x)
	}
	if err := second.Stop(t.Context(), "keep", time.Second); !errors.Is(err, runtime.ErrNotRunning) {
		t.Fatalf("second stop = %v, want ErrNotRunning", err)
	}
}

func TestBadSpecsAreRefused(t *testing.T) {
	t.Parallel()
	p := open(t, t.TempDir())
	for name, s := range map[string]runtime.Spec{
		"no command":             spec("r"),
		"a rental id with slash": spec("../etc", "true"),
		// The status shell must not turn a missing command into a run that exits 127.
		"a command that does not exist": spec("r", "no-such-command-shizu"),
	} {
		if _, err := p.Start(t.Context(), s); err == nil {
			t.Errorf("%s: started", name)
		}
	}
	if got := p.List(); len(got) != 0 {
		t.Fatalf("list = %+v", got)
	}
}

// A tqdm progress bar is a long run of █ (three bytes each): the last line
// of such a log must come back as whole runes, or the exit event that
// carries it would not encode.
func TestALastLineOfProgressBarIsCutOnARuneBoundary(t *testing.T) {
	t.Parallel()
	p := open(t, t.TempDir())
	// 600 bars and a trailing space: the log's tail starts inside a rune.
	script := `i=0; while [ $i -lt 600 ]; do printf '█'; i=$((i+1)); done; printf ' \n'; exit 1`
	if _, err := p.Start(t.Context(), spec("r", "sh", "-c", script)); err != nil {
		t.Fatal(err)
	}
	x := nextExit(t, p)
	if !utf8.ValidString(x.Detail) || strings.Trim(x.Detail, "█") != "" || len(x.Detail) != 255 {
		t.Fatalf("detail = %q (%d bytes), want 85 whole bars", x.Detail, len(x.Detail))
	}
}

// The status shell the workload runs under outlives a polite stop: the
// workload gets the signal, cleans up in its grace, and its own exit code
// and last line are reported; once reported, Forget leaves nothing behind
// in the records.
func TestAWorkloadThatHandlesTheStopSignalReportsItsOwnExitCode(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := open(t, dir)
	w, err := p.Start(t.Context(), spec("polite", "sh", "-c", "trap 'sleep 0.2; echo saved; exit 5' TERM; echo ready; while true; do sleep 0.1; done"))
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		if !strings.Contains(logOf(t, w), "ready") {
			return errors.New("not ready")
		}
		return nil
	})
	if err := p.Stop(t.Context(), "polite", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if x := nextExit(t, p); x.ExitCode != 5 || x.Detail != "saved" {
		t.Fatalf("exit = %+v, want code 5 and its last line", x)
	}
	if err := p.Forget("polite"); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(dir + "/rentals"); len(left) != 0 {
		t.Fatalf("records left after Forget: %v", left)
	}
}
