package app_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/shared/rentallogs"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

// output waits until the rental's output on the LOGS stream ends with the
// end of run attempt 1, and returns it.
func output(t *testing.T, e *env, rental string) []rentallogs.Line {
	t.Helper()
	var got []rentallogs.Line
	testkit.Eventually(t, 30*time.Second, func() error {
		lines, _, err := rentallogs.Tail(t.Context(), e.Admin.JetStream(), "acme", rental, rentallogs.MaxTail)
		if err != nil {
			return err
		}
		if len(lines) == 0 || !lines[len(lines)-1].End {
			return fmt.Errorf("%d entries, not ended yet", len(lines))
		}
		got = lines
		return nil
	})
	return got
}

// metric reads one counter of the agent's /metrics whose line has every
// one of parts.
func metric(t *testing.T, addr string, parts ...string) int64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
next:
	for _, line := range strings.Split(string(b), "\n") {
		for _, p := range parts {
			if !strings.Contains(line, p) {
				continue next
			}
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		return int64(v)
	}
	return 0
}

// A workload's output reaches its rental's log: lines in order, a long
// line cut and marked, what is over the rate dropped and counted (in the
// stream and in the agent's metrics) so that every line is accounted for,
// and the end of the run last.
func TestAWorkloadsOutputIsShippedBoundedAndRateLimited(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := t.TempDir()
	killWorkloads(t, dir)
	cfg := e.config(t, "n-logs", "rtx4090x8", dir)
	// A burst of four 1,000-byte lines and next to no refill.
	cfg.Logs.MaxLineBytes, cfg.Logs.MaxBatchBytes, cfg.Logs.BurstBytes, cfg.Logs.RateBytes = 1000, 4000, 4000, 1
	cfg.Logs.Poll = 20 * time.Millisecond
	e.start(t, cfg)
	e.registered(t, "n-logs", 1)
	script := `echo hello; echo world >&2; printf '%05000d\n' 7; i=0; while [ $i -lt 300 ]; do echo "noise $i"; i=$((i+1)); done; echo bye`
	e.send(t, "n-logs", "start", e.place(t, "n-logs", 1, "r-logs", 1000, 0, "sh", "-c", script))
	stoppedOf(t, e, "r-logs")

	got := output(t, e, "r-logs")
	if got[0].Text != "hello" || got[1].Text != "world" {
		t.Fatalf("output starts %q, %q; want hello, then world (stderr)", got[0].Text, got[1].Text)
	}
	if l := got[2]; !l.Truncated || len(l.Text) != 1000 || !strings.HasSuffix(l.Text, "0000") {
		t.Fatalf("the 5,001-byte line came as %d bytes, truncated %v", len(l.Text), l.Truncated)
	}
	var shipped, dropped int64
	for _, l := range got {
		switch {
		case l.Dropped > 0:
			dropped += l.Dropped
		case !l.End:
			shipped++
		}
	}
	// hello, world, the long line, 300 noise lines and bye.
	if shipped+dropped != 304 || dropped == 0 {
		t.Fatalf("%d lines shipped and %d dropped, want 304 in all with some dropped", shipped, dropped)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		m := metric(t, cfg.Service.HTTPAddr, "shizu_agent_logs_lines", `"dropped"`)
		if m != dropped {
			return fmt.Errorf("metric counts %d dropped lines, the stream %d", m, dropped)
		}
		return nil
	})
}

// The output of a workload that outlives its agent is shipped by the next
// agent from where the last one stopped: nothing lost, nothing twice.
func TestARestartedAgentShipsTheRestOfAnAdoptedWorkloadsOutput(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := t.TempDir()
	killWorkloads(t, dir)
	first := e.start(t, e.config(t, "n-logs2", "rtx4090x8", dir))
	e.registered(t, "n-logs2", 1)
	script := `echo before; while [ ! -f go ]; do sleep 0.05; done; echo after`
	e.send(t, "n-logs2", "start", e.place(t, "n-logs2", 1, "r-logs2", 1000, 0, "sh", "-c", script))
	testkit.Eventually(t, 20*time.Second, func() error {
		lines, _, err := rentallogs.Tail(t.Context(), e.Admin.JetStream(), "acme", "r-logs2", 10)
		if err != nil {
			return err
		}
		if len(lines) != 1 || lines[0].Text != "before" {
			return fmt.Errorf("output %v", lines)
		}
		return nil
	})
	first.stop(t)
	// The workload writes on while no agent runs.
	if err := os.WriteFile(filepath.Join(dir, "work", "r-logs2-1", "go"), nil, 0o640); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		b, _ := os.ReadFile(filepath.Join(dir, "logs", "r-logs2-1.log"))
		if !strings.Contains(string(b), "after") {
			return errors.New("the workload has not written on yet")
		}
		return nil
	})
	e.start(t, e.config(t, "n-logs2", "rtx4090x8", dir))
	got := output(t, e, "r-logs2")
	var texts []string
	for _, l := range got {
		texts = append(texts, l.String())
	}
	if want := "[before after [end of the output of run 1 on node n-logs2]]"; fmt.Sprint(texts) != want {
		t.Fatalf("output %q, want %s", texts, want)
	}
}
