package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/quota"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// TestQuotaSetShowDelete runs `shizu quota` against real NATS (the
// operator's admin user) and Redis: set writes the QUOTAS bucket the
// scheduler watches, show reads it back with what the tenant holds in the
// capacity store, bad input is refused with the reason and changes
// nothing, delete removes it.
func TestQuotaSetShowDelete(t *testing.T) {
	t.Parallel()
	d := testkit.Platform(t)
	shizu := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		args = append(args, "-nats-url", d.NATS.URL, "-nats-user", topology.Admin, "-nats-password", testkit.Password(topology.Admin),
			"-redis-url", d.RedisURL(), "-dev-dir", t.TempDir())
		code := run(t.Context(), args, &out, &errOut)
		return code, out.String(), errOut.String()
	}
	code, out, errOut := shizu("quota", "set", "-tenant", "acme", "-max-gpus", "8", "-model", "H100-SXM5-80GB=2", "-model", "L4-24GB=4")
	if code != exitOK || out != "quota of acme set: at most 8 GPUs, of which at most 2 H100-SXM5-80GB, 4 L4-24GB\n" {
		t.Fatalf("set: exit %d\n%s%s", code, out, errOut)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-tenant", "acme"}, "-max-gpus: required"},
		{[]string{"-max-gpus", "2"}, "-tenant: "},
		{[]string{"-tenant", "acme", "-max-gpus", "2", "-model", "H100"}, `"H100": want MODEL=N`},
		{[]string{"-tenant", "acme", "-max-gpus", "2", "-model", "H100=1"}, `"H100" is not a GPU model Shizu knows`},
		{[]string{"-tenant", "acme", "-max-gpus", "2", "-model", "L4-24GB=3"}, "L4-24GB: 3 is more than max_gpus 2"},
		{[]string{"-tenant", "a.b", "-max-gpus", "2"}, "-tenant: "},
	} {
		code, _, errOut := shizu(append([]string{"quota", "set"}, c.args...)...)
		if code != exitUsage || !strings.Contains(errOut, c.want) || strings.Count(errOut, "\n") > 3 {
			t.Errorf("quota set %v: exit %d, stderr %q; want exit %d saying %q", c.args, code, errOut, exitUsage, c.want)
		}
	}
	qs, err := quota.Open(t.Context(), d.Admin.JetStream())
	if err != nil {
		t.Fatal(err)
	}
	if l, ok, err := qs.Get(t.Context(), "acme"); err != nil || !ok || l.MaxGPUs != 8 || l.MaxGPUsPerModel["L4-24GB"] != 4 {
		t.Fatalf("after the refused sets, the stored quota is %+v, %v, %v", l, ok, err)
	}

	// What the tenant holds comes from the capacity store.
	store := d.Capacity(t)
	n := capacity.Node{ID: "n1", Zone: "z", Market: capacity.MarketOnDemand, PricePerGPUHourMicros: 1, Currency: "USD",
		CPUMilli: 8000, MemoryMiB: 8192, GPUs: []capacity.GPU{{Index: 0, UUID: "GPU-0", Model: "L4-24GB", VRAMMiB: 24 * 1024}}}
	epoch, err := store.Register(t.Context(), n)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Reserve(t.Context(), capacity.Placement{RentalID: "r1", NodeID: "n1", Epoch: epoch, Tenant: "acme",
		GPUs: []capacity.GPUShare{{Index: 0, Milli: 500}}}); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = shizu("quota", "show", "-tenant", "acme")
	if code != exitOK || out != "quota of acme: at most 8 GPUs, of which at most 2 H100-SXM5-80GB, 4 L4-24GB\nholds now: 0.5 GPUs, 0.5 L4-24GB\n" {
		t.Fatalf("show: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = shizu("quota", "show", "-tenant", "acme", "-o", "json")
	var shown struct {
		Tenant string       `json:"tenant"`
		Quota  quota.Limits `json:"quota"`
		Usage  struct {
			MilliGPU int64 `json:"milli_gpu"`
		} `json:"usage"`
	}
	if code != exitOK || json.Unmarshal([]byte(out), &shown) != nil || shown.Quota.MaxGPUs != 8 || shown.Usage.MilliGPU != 500 {
		t.Fatalf("show -o json: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = shizu("quota", "delete", "-tenant", "acme")
	if code != exitOK || !strings.Contains(out, "quota of acme removed") {
		t.Fatalf("delete: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = shizu("quota", "show", "-tenant", "acme")
	if code != exitOK || !strings.HasPrefix(out, "acme has no quota") {
		t.Fatalf("show after delete: exit %d\n%s%s", code, out, errOut)
	}
	var errBuf bytes.Buffer
	if code, errOut := run(t.Context(), []string{"quota"}, &bytes.Buffer{}, &errBuf), errBuf.String(); code != exitUsage || !strings.Contains(errOut, "want a sub-command") {
		t.Fatalf("quota without a sub-command: exit %d, %q", code, errOut)
	}
}
