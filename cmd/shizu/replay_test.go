package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const slice = "../../services/scheduler/replay/testdata/openb_slice_"

func TestReplayPrintsJSONPerPolicyAndWritesThePlot(t *testing.T) {
	t.Parallel()
	plot := filepath.Join(t.TempDir(), "alloc.svg")
	var out, errOut bytes.Buffer
	code := run(t.Context(), []string{"replay", "-nodes", slice + "nodes.csv", "-pods", slice + "pods.csv",
		"-policies", "fgd,bestfit,shizu", "-seeds", "2", "-o", "json", "-plot", plot}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var rep struct {
		Mode     string `json:"mode"`
		Policies []struct {
			Policy string  `json:"policy"`
			Seeds  []int64 `json:"seeds"`
			Levels []struct {
				Arrived int `json:"arrived_pct"`
			} `json:"levels"`
		} `json:"policies"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if rep.Mode != "inflation" || len(rep.Policies) != 3 || rep.Policies[2].Policy != "shizu" || len(rep.Policies[0].Seeds) != 2 || len(rep.Policies[0].Levels) == 0 {
		t.Fatalf("report %+v", rep)
	}
	if !strings.Contains(errOut.String(), "[6/6]") {
		t.Errorf("no progress on stderr: %s", errOut.String())
	}
	if svg, err := os.ReadFile(plot); err != nil || !strings.Contains(string(svg), "<svg") {
		t.Fatalf("plot: %v", err)
	}
}

func TestReplayRefusesBadFlagsAndNamesAMissingTraceFolder(t *testing.T) {
	t.Setenv("SHIZU_TRACE_DIR", filepath.Join(t.TempDir(), "nowhere"))
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"an unknown policy", []string{"-policies", "fgd,best"}, 2, `unknown placement policy "best"`},
		{"an unknown mode", []string{"-mode", "live"}, 2, "unknown replay mode"},
		{"an unknown output", []string{"-o", "csv"}, 2, "want table or json"},
		{"a missing trace folder", nil, 1, "is not a folder"},
	} {
		var out, errOut bytes.Buffer
		if code := run(t.Context(), append([]string{"replay"}, tc.args...), &out, &errOut); code != tc.code || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%s: exit %d, stderr %q; want %d and %q", tc.name, code, errOut.String(), tc.code, tc.want)
		}
	}
}
