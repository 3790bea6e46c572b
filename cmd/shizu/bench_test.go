package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// TestBenchPrintsEveryCheckWithItsCeilingAndGoal runs `shizu bench` at a
// tiny size on real servers and checks the report's structure, not its
// timings: every check has a measured value, a ceiling from the same run,
// their ratio and a verdict against its goal; stdout is only the JSON and
// the progress goes to stderr.
func TestBenchPrintsEveryCheckWithItsCeilingAndGoal(t *testing.T) {
	if testing.Short() {
		t.Skip("starts NATS and Redis for each check")
	}
	var out, errOut bytes.Buffer
	if code := run(t.Context(), []string{"bench", "-n", "40", "-o", "json"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var rep benchReport
	dec := json.NewDecoder(&out)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("stdout is not the JSON report: %v\n%s", err, out.String())
	}
	want := []string{"placement", "scheduler", "metering", "autoscaler"}
	if len(rep.Results) != len(want) {
		t.Fatalf("%d results, want %v", len(rep.Results), want)
	}
	for i, r := range rep.Results {
		if r.Check != want[i] || r.Size != 40 {
			t.Fatalf("result %d: %s at size %d, want %s at 40", i, r.Check, r.Size, want[i])
		}
		if r.Value <= 0 || r.Ceiling <= 0 || r.Goal <= 0 || r.Unit == "" || r.Measured == "" || r.CeilingWhat == "" {
			t.Fatalf("%s: incomplete result %+v", r.Check, r)
		}
		if got := r.Value / r.Ceiling; got != r.Ratio {
			t.Fatalf("%s: ratio %v, want value/ceiling %v", r.Check, r.Ratio, got)
		}
		if pass := (r.AtMost && r.Value < r.Goal) || (!r.AtMost && r.Value >= r.Goal); pass != r.Pass {
			t.Fatalf("%s: pass %v for %v against the goal %v (upper bound %v)", r.Check, r.Pass, r.Value, r.Goal, r.AtMost)
		}
	}
	if rep.Redis == "" || rep.CPUs < 1 || len(rep.NotHere) == 0 || !strings.Contains(rep.NotHere[0], "failover") {
		t.Fatalf("report header %+v", rep)
	}
	if !strings.Contains(errOut.String(), "bench: [400/400]") {
		t.Fatalf("no progress on stderr:\n%s", errOut.String())
	}

	// The table names the same checks with their ratios.
	out.Reset()
	if code := run(t.Context(), []string{"bench", "-only", "placement", "-n", "40"}, &out, &errOut); code != 0 {
		t.Fatalf("table: exit %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "RATIO") || !strings.Contains(out.String(), "placement") || strings.Contains(out.String(), "scheduler ") {
		t.Fatalf("table:\n%s", out.String())
	}
}

func TestBenchRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "-only", "scheduler,warp"},
		{"bench", "-o", "yaml"},
		{"bench", "-n", "-1"},
		{"bench", "extra"},
	} {
		var out, errOut bytes.Buffer
		if code := run(t.Context(), args, &out, &errOut); code != 2 || out.Len() != 0 || strings.Count(strings.TrimSpace(errOut.String()), "\n") != 0 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 and a one-line error", args, code, out.String(), errOut.String())
		}
	}
}
