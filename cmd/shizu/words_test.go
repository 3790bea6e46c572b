package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/gateway/identity"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

// leaked finds what must not reach people: an enum value name of the
// contract, or a field name of the rental spec.
func leaked(s string) []string {
	var out []string
	for _, m := range enumName.FindAllString(s, -1) {
		if _, ok := enumWords()[m]; ok {
			out = append(out, m)
		}
	}
	for _, m := range fieldName.FindAllString(s, -1) {
		if _, ok := rentFields[m]; ok {
			out = append(out, m)
		}
	}
	return out
}

// jsonStrings is every string value in data (one JSON value).
func jsonStrings(t *testing.T, data []byte) []string {
	t.Helper()
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, data)
	}
	var out []string
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case string:
			out = append(out, x)
		case map[string]any:
			for _, e := range x {
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(v)
	return out
}

func TestEveryEnumValueHasWords(t *testing.T) {
	t.Parallel()
	words := enumWords()
	for _, name := range []string{"REJECT_REASON_UNSATISFIABLE", "PENDING_REASON_NO_CAPACITY", "MARKET_SPOT", "PLAN_ON_DEMAND",
		"INTERCONNECT_NVLINK", "NODE_LOST_REASON_HEARTBEAT_EXPIRED", "HEALTH_DEGRADED", "EXIT_REASON_CANCELLED"} {
		if _, ok := words[name]; !ok {
			t.Errorf("no words for %s", name)
		}
	}
	for name, w := range words {
		if w == "" || strings.Contains(w, "_") || enumName.MatchString(w) {
			t.Errorf("%s is %q in words", name, w)
		}
	}
	for name, want := range map[string]string{"REJECT_REASON_UNSATISFIABLE": "unsatisfiable", "PLAN_ON_DEMAND": "on-demand",
		"MARKET_SPOT": "spot", "INTERCONNECT_NVLINK": "NVLink", "PENDING_REASON_SPOT_PRICE_ABOVE_MAX": "spot price above max"} {
		if words[name] != want {
			t.Errorf("%s = %q, want %q", name, words[name], want)
		}
	}
}

func TestSaidIsInPeoplesWords(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, in, want string }{
		{"a spec field is the flag that sets it", "spec.mig_profile: \"9x\" is not a MIG profile name", `-mig: "9x" is not a MIG profile name`},
		{"enum values are words", "spec.max_spot_price_per_gpu_hour: set, but plan is PLAN_ON_DEMAND; a maximum spot price is only for PLAN_SPOT",
			"-max-price: set, but plan is on-demand; a maximum spot price is only for spot"},
		{"problems on separate lines are one line", "spec.gpu_count: 0 is out of range 1..64\nspec.interconnect: INTERCONNECT_NVLINK needs gpu_count >= 2 (got 0)",
			"-gpus: 0 is out of range 1..64; -nvlink: NVLink needs -gpus >= 2 (got 0)"},
		{"a milli-GPU count is written as -fraction takes it", "needs gpu_count 1, milli_gpu 1000 and no NVLink",
			"needs -gpus 1, -fraction 1000m and no NVLink"},
		{"a list item is its flag", `spec.allowed_models[1]: "H100" is listed twice`, `-model: "H100" is listed twice`},
		{"a label names its key", `spec.labels["a b"]: "a b" contains " "`, `-label "a b": "a b" contains " "`},
		{"a plain-word field is replaced only as a field", `zone: "a b" contains " "; zone "mars": no node is in that zone`,
			`-zone: "a b" contains " "; zone "mars": no node is in that zone`},
		{"what is not the contract's stays", "no node could ever hold this request: needs 9 GPUs on one node; the largest node has 8",
			"no node could ever hold this request: needs 9 GPUs on one node; the largest node has 8"},
		{"a rejection's reason the scheduler wrote", "invalid spec: spec.tee_required: TEE on RTX4090-24GB; rental_id: missing",
			"invalid spec: -tee: TEE on RTX4090-24GB; rental id: missing"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := said(c.in, rentFields); got != c.want {
				t.Fatalf("said(%q)\n = %q\nwant %q", c.in, got, c.want)
			}
		})
	}
}

// TestTablesAndErrorsSpeakPeoplesWords: what the scheduler, failover and
// the agents say in the contract's terms (reasons with enum value names
// and spec field names) is printed by ls, show, stop and nodes, table and
// JSON, in people's words; a request the CLI refuses names the flags.
func TestTablesAndErrorsSpeakPeoplesWords(t *testing.T) {
	t.Parallel()
	d, conn := seedPlatform(t)
	ctx := t.Context()
	now := time.Now().UTC()
	publish := func(format, token string, m proto.Message) {
		t.Helper()
		subj, err := subject.Format(format, token)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.Admin.Publish(ctx, subj, m); err != nil {
			t.Fatal(err)
		}
	}
	spec := &shizuv1.RentalSpec{GpuCount: 1, MilliGpu: 1000, Plan: shizuv1.Plan_PLAN_SPOT, MigProfile: "7g.80gb"}
	publish(subject.RentalRequested, "acme", &shizuv1.RentalRequested{Meta: meta("q2", now), RentalId: "r-2", TenantId: "acme", Spec: spec})
	publish(subject.RentalPending, "acme", &shizuv1.RentalPending{Meta: meta("p2", now), RentalId: "r-2", TenantId: "acme",
		Reason: shizuv1.PendingReason_PENDING_REASON_SPOT_PRICE_ABOVE_MAX, Message: "MARKET_SPOT price above spec.max_spot_price_per_gpu_hour"})
	publish(subject.RentalRejected, "acme", &shizuv1.RentalRejected{Meta: meta("x2", now), RentalId: "r-2", TenantId: "acme",
		Reason:  shizuv1.RejectReason_REJECT_REASON_INVALID_SPEC,
		Message: "spec.mig_profile: \"7g.80gb\" is one whole MIG instance: needs gpu_count 1, milli_gpu 1000 and no NVLink (got gpu_count 2, milli_gpu 1000, INTERCONNECT_NVLINK)\nspec.plan: PLAN_SPOT"})
	publish(subject.NodeHealth, "n1", &shizuv1.NodeHealthChanged{Meta: meta("h1", now), NodeId: "n1", Epoch: 1, GpuIndex: 0,
		Health: shizuv1.Health_HEALTH_DEGRADED, Xid: 31})
	publish(subject.NodeLost, "n1", &shizuv1.NodeLost{Meta: meta("l1", now), NodeId: "n1", FencedEpoch: 1,
		Reason: shizuv1.NodeLostReason_NODE_LOST_REASON_HEARTBEAT_EXPIRED})
	// The tenant verbs go through the gateway with a key of acme.
	gw := startGatewayStackOn(t, d)
	api := []string{"-dev-dir", gw.devDirFor(gw.tenantKey("acme", identity.ReadWrite))}
	flagsOf := func(args []string) []string {
		switch args[0] {
		case "rent", "ls", "show", "stop":
			return api
		}
		return conn
	}
	testkit.Eventually(t, 10*time.Second, func() error { // the read model folds the seeded events
		var out, errOut bytes.Buffer
		if code := run(ctx, append([]string{"show", "r-2"}, api...), &out, &errOut); code != 0 || !strings.Contains(out.String(), "rejected") {
			return fmt.Errorf("show r-2: exit %d %s%s", code, out.String(), errOut.String())
		}
		return nil
	})
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"ls"}, []string{"invalid spec: -mig:", "needs -gpus 1, -fraction 1000m and no NVLink", "-plan: spot"}},
		{[]string{"ls", "-o", "json"}, []string{"invalid spec: -mig:"}},
		{[]string{"show", "r-2"}, []string{"spot price above max: spot price above -max-price", "rejected", "-plan: spot"}},
		{[]string{"show", "r-2", "-o", "json"}, []string{"spot price above max"}},
		{[]string{"stop", "r-2"}, []string{"r-2 is already rejected (invalid spec: -mig:"}},
		{[]string{"nodes"}, []string{"lost: heartbeat expired (epoch 1 fenced)"}},
		{[]string{"nodes", "-gpus"}, []string{"degraded"}},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			if code := run(ctx, append(slices.Clone(c.args), flagsOf(c.args)...), &out, &errOut); code != 0 {
				t.Fatalf("exit %d: %s", code, errOut.String())
			}
			said := out.String()
			if slices.Contains(c.args, "json") {
				said = strings.Join(jsonStrings(t, out.Bytes()), "\n") // the values, not the keys
			}
			if l := leaked(said); len(l) > 0 {
				t.Errorf("the contract's names %v reach people:\n%s", l, out.String())
			}
			for _, w := range c.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("no %q in\n%s", w, out.String())
				}
			}
		})
	}

	// What the CLI refuses before publishing names the flags.
	for _, args := range [][]string{
		{"rent", "-zone", "a b"},
		{"rent", "-priority", "5000", "-label", "a b=c"},
		{"rent", "-checkpoint", "relative/path"},
		{"rent", "-tenant", "a.b"},
		{"rent", "-model", "H100-SXM5-80GB,H100-SXM5-80GB"},
		{"rent", "-mig", "9x"},
		{"traffic", "chat", "-rps", "-1"},
		{"spot-price", "local", "H100-SXM5-80GB", "2.10", "-at", "2026-01-01T00:00:00Z", "-currency", "usd"},
	} {
		var out, errOut bytes.Buffer
		code := run(ctx, append(args, flagsOf(args)...), &out, &errOut)
		if code != 2 || strings.Count(strings.TrimSpace(errOut.String()), "\n") != 0 {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 and one line", args, code, errOut.String())
		}
		if l := leaked(errOut.String()); len(l) > 0 || regexp.MustCompile(`spec\.|_mib|_id\b`).MatchString(errOut.String()) {
			t.Errorf("%v: the contract's names %v reach people: %s", args, l, errOut.String())
		}
	}
}

// TestRentRefusesWhatOnlyTheContractUsedToName: the combinations the
// contract's validation refused with its own field names are refused by
// the flags first, saying what to change.
func TestRentRefusesWhatOnlyTheContractUsedToName(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		o    rentOptions
		want string
	}{
		{rentOptions{gpus: 1, nvlink: true}, "-nvlink joins GPUs of one node: it needs -gpus 2 or more (got -gpus 1)"},
		{rentOptions{gpus: 2, nvlink: true, mig: "1g.10gb"}, "-mig 1g.10gb is one whole MIG slice of one GPU: it takes neither -gpus above 1, -fraction nor -nvlink"},
		{rentOptions{gpus: 1, fraction: "0.5", vram: "10GiB", mig: "1g.10gb"}, "-mig 1g.10gb is one whole MIG slice"},
	} {
		c.o.plan = "on-demand"
		if _, err := c.o.spec(nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.o, err, c.want)
		}
	}
}
