package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/shizu-gpu/shizu/shared/benchkit"
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
	if code := run(t.Context(), []string{"bench", "-n", "40", "-o", "json", "-report-only"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	// Every key, the checks' extra figures too, is snake_case.
	assertSnakeJSON(t, "bench", out.Bytes(), "results", "extra")
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
	if code := run(t.Context(), []string{"bench", "-only", "placement", "-n", "40", "-report-only"}, &out, &errOut); code != 0 {
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

// fixedCheck is a check whose Run returns value against goal (or err),
// without servers.
func fixedCheck(name string, value, goal float64, err error) benchCheck {
	return benchCheck{name: name, summary: "fixed", defaultSize: 1, run: func(context.Context, *benchkit.Env, int) (benchkit.Result, error) {
		r := benchkit.Result{Measured: "fixed", Value: value, Unit: "things/s", Ceiling: 2 * value, CeilingWhat: "twice", Goal: goal, Size: 1}
		r.Finish()
		return r, err
	}}
}

func TestBenchExitStatusFollowsTheGoals(t *testing.T) {
	met, alsoMet := fixedCheck("met", 20, 10, nil), fixedCheck("also-met", 30, 10, nil)
	missed, broken := fixedCheck("missed", 5, 10, nil), fixedCheck("broken", 0, 10, errors.New("no servers"))
	for _, tc := range []struct {
		name     string
		checks   []benchCheck
		args     []string
		want     int
		reported int // results on stdout
	}{
		{"every goal met exits 0", []benchCheck{met, alsoMet}, nil, 0, 2},
		{"a missed goal exits 1 with the table too", []benchCheck{met, missed}, []string{"-o", "table"}, 1, -1},
		{"a missed goal exits 1 after the whole report", []benchCheck{missed, met}, nil, 1, 2},
		{"-report-only exits 0 with a missed goal", []benchCheck{missed, met}, []string{"-report-only"}, 0, 2},
		{"a check that cannot run exits 1 without a report", []benchCheck{met, broken}, []string{"-report-only"}, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var names []string
			for _, c := range tc.checks {
				names = append(names, c.name)
			}
			var out, errOut bytes.Buffer
			args := append([]string{"-o", "json", "-only", strings.Join(names, ",")}, tc.args...)
			if code := runBenchCommand(t.Context(), args, tc.checks, &out, &errOut); code != tc.want {
				t.Fatalf("exit %d, want %d; stderr %s", code, tc.want, errOut.String())
			}
			if tc.want == 1 && tc.reported != 0 && !strings.Contains(errOut.String(), "shizu bench: missed missed its goal (FAIL above)") {
				t.Fatalf("stderr %q does not name the check that missed its goal", errOut.String())
			}
			if tc.reported < 0 { // the table
				if !strings.Contains(out.String(), "FAIL") {
					t.Fatalf("table without FAIL:\n%s", out.String())
				}
				return
			}
			if tc.reported == 0 {
				if out.Len() != 0 {
					t.Fatalf("stdout %q, want nothing", out.String())
				}
				return
			}
			var rep benchReport
			if err := json.Unmarshal(out.Bytes(), &rep); err != nil || len(rep.Results) != tc.reported {
				t.Fatalf("report %+v (%v), want %d results", rep, err, tc.reported)
			}
		})
	}
}
