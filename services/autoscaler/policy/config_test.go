package policy_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/services/autoscaler/policy"
)

func TestTheExamplePolicyFileParses(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("testdata/example.json")
	if err != nil {
		t.Fatal(err)
	}
	f, err := policy.Parse(data)
	if err != nil {
		t.Fatalf("example refused:\n%v", err)
	}
	if len(f.Pools) != 2 || f.Pools[0].TargetTracking.Tolerance != 0.1 || len(f.Fleet.InstanceTypes) != 2 {
		t.Fatalf("parsed %+v", f)
	}
	if got := f.Pools[0].PreWarm[0].Floor(); got != 8 {
		t.Fatalf("pre-warm floor %d, want 8", got)
	}
}

func TestABadPolicyFileReportsEveryProblemWithItsPath(t *testing.T) {
	t.Parallel()
	bad := `{
	  "pools": [
	    {"id": "a.b", "tenant": "", "rental": {"gpu_count": 0, "milli_gpu": 1000},
	     "min_replicas": 0, "max_replicas": 0, "max_step_out": 0, "max_step_in": 1,
	     "thresholds": [{"name": "x", "metric": "cpu", "scale_out_above": 10, "scale_in_below": 12, "step": 0}],
	     "target_tracking": {"metric": "p99_latency_ms", "value": -1},
	     "prewarm": [{"name": "sale", "start": "2026-06-18T00:00:00Z", "end": "2026-06-17T00:00:00Z", "peak_replicas": 10, "min_fraction_of_peak": 2}],
	     "market_mix": {"timezone": "Mars/Olympus", "spot_from": "25:00", "spot_to": "08:00", "fallback_hold": "0s"}},
	    {"id": "web", "tenant": "acme", "rental": {"gpu_count": 1, "milli_gpu": 1000}, "min_replicas": 1, "max_replicas": 2,
	     "max_step_out": 1, "max_step_in": 1, "target_tracking": {"metric": "requests_per_second_per_replica", "value": 10}},
	    {"id": "web", "tenant": "acme", "rental": {"gpu_count": 1, "milli_gpu": 1000}, "min_replicas": 1, "max_replicas": 2,
	     "max_step_out": 1, "max_step_in": 1, "target_tracking": {"metric": "requests_per_second_per_replica", "value": 10}}
	  ],
	  "fleet": {"instance_types": [{"name": "", "profile": "h100x8", "model": "H100", "gpus": 0}], "max_nodes": 0, "idle_after": "0s"}
	}`
	_, err := policy.Parse([]byte(bad))
	if err == nil {
		t.Fatal("bad file accepted")
	}
	for _, want := range []string{
		"pools[0].id:", "pools[0].tenant:", "pools[0].rental.gpu_count:", "pools[0].min_replicas: 0 needs scale_to_zero",
		"pools[0].max_replicas:", "pools[0].max_step_out:", "pools[0].thresholds[0].metric:",
		"pools[0].thresholds[0].scale_in_below:", "pools[0].thresholds[0].step:",
		"pools[0].target_tracking.metric:", "pools[0].target_tracking.value:",
		"pools[0].prewarm[0].end:", "pools[0].prewarm[0].min_fraction_of_peak:",
		"pools[0].market_mix.timezone:", "pools[0].market_mix.spot_from:", "pools[0].market_mix.fallback_hold:",
		`pools[2].id: "web" is declared twice`,
		"fleet.max_nodes:", "fleet.idle_after:", "fleet.register_timeout:", "fleet.instance_types[0].name:",
		"fleet.instance_types[0].gpus:", "fleet.instance_types[0].zones:",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q", want)
		}
	}
	if t.Failed() {
		t.Logf("error was:\n%v", err)
	}
}

func TestUnknownFieldsAndBadDurationsAreRefused(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, doc, want string }{
		{"a misspelt field is an error, not ignored", `{"pools": [{"idd": "x"}]}`, `unknown field "idd"`},
		{"a duration without a unit is an error", `{"pools": [{"scale_in_cooldown": "5"}]}`, `"5" is not a duration`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if _, err := policy.Parse([]byte(c.doc)); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want %q", err, c.want)
			}
		})
	}
}

func TestAPoolDeclaredAloneIsReadWithTheFileRules(t *testing.T) {
	t.Parallel()
	p, err := policy.ParsePool([]byte(`{"id":"web","tenant":"acme","rental":{"gpu_count":1,"milli_gpu":1000},
		"min_replicas":1,"max_replicas":4,"max_step_out":2,"max_step_in":1,
		"target_tracking":{"metric":"requests_per_second_per_replica","value":100}}`))
	if err != nil {
		t.Fatal(err)
	}
	if p.TargetTracking.Tolerance != 0.1 || p.StaleAfter.D() != 2*time.Minute {
		t.Errorf("defaults not filled: tolerance %v, stale_after %s", p.TargetTracking.Tolerance, p.StaleAfter.D())
	}
	cases := []struct{ name, json, want string }{
		{"an unknown field is refused", `{"id":"web","replicas":3}`, `unknown field "replicas"`},
		{"two values are refused", `{"id":"web"} {"id":"api"}`, "more than one JSON value"},
		{"every problem is named with its field", `{"id":"fleet","tenant":"acme","rental":{"gpu_count":1,"milli_gpu":1000},"min_replicas":3,"max_replicas":2,"max_step_out":1,"max_step_in":1,"thresholds":[{"name":"hot","metric":"qps","scale_out_above":5,"step":1}]}`,
			"id: \"fleet\" names the shared fleet"},
		{"a bad metric is named with its path", `{"id":"web","tenant":"acme","rental":{"gpu_count":1,"milli_gpu":1000},"min_replicas":1,"max_replicas":2,"max_step_out":1,"max_step_in":1,"thresholds":[{"name":"hot","metric":"qps","scale_out_above":5,"step":1}]}`,
			`thresholds[0].metric: "qps" is not one of`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := policy.ParsePool([]byte(c.json))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("ParsePool = %v, want it to contain %q", err, c.want)
			}
		})
	}
}
