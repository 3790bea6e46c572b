package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/capacity"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func meta(id string, at time.Time) *shizuv1.EventMeta {
	return shizuv1.NewMeta(id, "test", "", "", at)
}

func evs(msgs ...proto.Message) []event {
	out := make([]event, len(msgs))
	for i, m := range msgs {
		out[i] = event{Seq: uint64(i + 1), Msg: m}
	}
	return out
}

func TestParseFleet(t *testing.T) {
	t.Parallel()
	nodes, err := parseFleet("h100x8:2, rtx4090x8:1:spot,a100x8")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, n := range nodes {
		got = append(got, n.ID+"/"+n.Profile+"/"+n.Market)
	}
	want := "h100x8-1/h100x8/on-demand h100x8-2/h100x8/on-demand rtx4090x8-spot-1/rtx4090x8/spot a100x8-1/a100x8/on-demand"
	if strings.Join(got, " ") != want {
		t.Fatalf("fleet = %v, want %s", got, want)
	}
	if _, err := parseFleet(defaultFleet); err != nil {
		t.Fatalf("default fleet: %v", err)
	}
	for _, bad := range []struct{ name, spec, want string }{
		{"an unknown profile names the known ones", "v100x8:1", "profiles:"},
		{"a count that is not a number is refused", "h100x8:two", "not a number"},
		{"a market other than on-demand or spot is refused", "h100x8:1:reserved", "want on-demand or spot"},
		{"too many fields are refused", "h100x8:1:spot:x", "profile[:count[:market]]"},
		{"more than 64 nodes are refused", "h100x8:64,a100x8:1", "at most 64"},
	} {
		t.Run(bad.name, func(t *testing.T) {
			if _, err := parseFleet(bad.spec); err == nil || !strings.Contains(err.Error(), bad.want) {
				t.Fatalf("parseFleet(%q) = %v, want an error with %q", bad.spec, err, bad.want)
			}
		})
	}
}

func TestParseFractionAndMemory(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want int32
	}{{"", 1000}, {"1", 1000}, {"0.25", 250}, {"0.5", 500}, {".125", 125}, {"250m", 250}, {"1.0", 1000}} {
		if got, err := parseFraction(c.in); err != nil || got != c.want {
			t.Errorf("parseFraction(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"0", "0.0", "1.5", "2", "1001m", "0.0001", "-0.5", "quarter", "250"} {
		if _, err := parseFraction(bad); err == nil {
			t.Errorf("parseFraction(%q) accepted", bad)
		}
	}
	for _, c := range []struct {
		in   string
		want int64
	}{{"20480", 20480}, {"20GiB", 20480}, {"20g", 20480}, {"512MiB", 512}, {"", 0}} {
		if got, err := parseMiB(c.in); err != nil || got != c.want {
			t.Errorf("parseMiB(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	if _, err := parseMiB("lots"); err == nil {
		t.Error("parseMiB(lots) accepted")
	}
}

func TestRentSpecFromFlags(t *testing.T) {
	t.Parallel()
	o := rentOptions{gpus: 1, fraction: "0.25", vram: "20GiB", plan: "spot", maxPrice: "1.2", currency: "USD", labels: labelFlag{"team": "ml"}}
	s, err := o.spec([]string{"python", "train.py"})
	if err != nil {
		t.Fatal(err)
	}
	if s.GetMilliGpu() != 250 || s.GetVramMib() != 20480 || s.GetPlan() != shizuv1.Plan_PLAN_SPOT ||
		s.GetMaxSpotPricePerGpuHour().GetMicros() != 1_200_000 || strings.Join(s.GetCommand(), " ") != "python train.py" || s.GetLabels()["team"] != "ml" {
		t.Fatalf("spec = %v", s)
	}
	for _, bad := range []struct {
		name string
		o    rentOptions
		want string
	}{
		{"a fraction without VRAM says to add -vram", rentOptions{gpus: 1, fraction: "0.5", plan: "on-demand"}, "needs -vram"},
		{"an unknown plan names the flag and lists the plans", rentOptions{gpus: 1, plan: "cheap"}, `-plan "cheap": want on-demand, reserved or spot`},
		{"an unknown model lists the models", rentOptions{gpus: 1, plan: "spot", models: "V100"}, "H100-SXM5-80GB"},
		{"zero GPUs are refused", rentOptions{gpus: 0, plan: "spot"}, "1..64"},
		{"a price that is not an amount names the flag", rentOptions{gpus: 1, plan: "spot", maxPrice: "cheap"}, `-max-price: "cheap" is not a non-negative amount (e.g. -max-price 2.49)`},
		{"a price with a seventh decimal is refused", rentOptions{gpus: 1, plan: "spot", maxPrice: "1.0000001"}, "at most 6 decimals"},
		{"a negative price is refused", rentOptions{gpus: 1, plan: "spot", maxPrice: "-1"}, "non-negative"},
	} {
		t.Run(bad.name, func(t *testing.T) {
			_, err := bad.o.spec(nil)
			if err == nil || !strings.Contains(err.Error(), bad.want) {
				t.Fatalf("spec error %v, want %q", err, bad.want)
			}
			if !errors.As(err, new(usageError)) {
				t.Fatalf("spec error %v is not a usage error (exit status 2)", err)
			}
		})
	}
}

func TestRentalTimelineThroughMigration(t *testing.T) {
	t.Parallel()
	spec := &shizuv1.RentalSpec{GpuCount: 2, MilliGpu: 1000, Interconnect: shizuv1.Interconnect_INTERCONNECT_NVLINK, Plan: shizuv1.Plan_PLAN_ON_DEMAND}
	sched := func(node string, attempt int32, at time.Time) *shizuv1.RentalScheduled {
		return &shizuv1.RentalScheduled{Meta: meta("s", at), RentalId: "r-1", TenantId: "acme", NodeId: node, Attempt: attempt, Spec: spec,
			GpuModel: "H100-SXM5-80GB", Gpus: []*shizuv1.GpuAssignment{{GpuIndex: 0}, {GpuIndex: 1}}}
	}
	started := func(node string, attempt int32, at time.Time) *shizuv1.RentalStarted {
		return &shizuv1.RentalStarted{Meta: meta("st", at), RentalId: "r-1", TenantId: "acme", NodeId: node, Attempt: attempt, StartedAt: timestamppb.New(at)}
	}
	stopped := func(node string, attempt int32, at time.Time, why shizuv1.ExitReason) *shizuv1.RentalStopped {
		return &shizuv1.RentalStopped{Meta: meta("sp", at), RentalId: "r-1", TenantId: "acme", NodeId: node, Attempt: attempt,
			StartedAt: timestamppb.New(t0), StoppedAt: timestamppb.New(at), ExitReason: why}
	}
	events := []proto.Message{
		&shizuv1.RentalRequested{Meta: meta("q", t0), RentalId: "r-1", TenantId: "acme", Spec: spec},
		sched("n1", 1, t0.Add(time.Millisecond)),
		started("n1", 1, t0.Add(time.Second)),
		&shizuv1.RentalMigrating{Meta: meta("m", t0.Add(10*time.Second)), RentalId: "r-1", TenantId: "acme", FromNodeId: "n1",
			Reason: shizuv1.MigrationReason_MIGRATION_REASON_NODE_LOST, FromAttempt: 1, NextAttempt: 2},
	}
	step := func(extra ...proto.Message) *rentalView {
		rs := rentals(evs(append(append([]proto.Message(nil), events...), extra...)...))
		if len(rs) != 1 {
			t.Fatalf("%d rentals, want 1", len(rs))
		}
		return rs[0]
	}
	if r := step(); r.State != stateMigrating || !strings.Contains(r.Why, "from n1") {
		t.Fatalf("after migrating: %s (%s), want migrating from n1", r.State, r.Why)
	}
	// The old node's late stop of attempt 1 does not end the rental.
	late := stopped("n1", 1, t0.Add(11*time.Second), shizuv1.ExitReason_EXIT_REASON_NODE_FAILED)
	if r := step(late); r.State != stateMigrating {
		t.Fatalf("after the old placement stopped: %s, want still migrating", r.State)
	}
	moved := []proto.Message{late, sched("n2", 2, t0.Add(12*time.Second)), started("n2", 2, t0.Add(13*time.Second)),
		&shizuv1.RentalMigrated{Meta: meta("md", t0.Add(13*time.Second)), RentalId: "r-1", TenantId: "acme", FromNodeId: "n1", ToNodeId: "n2",
			Downtime: durationpb.New(3 * time.Second)}}
	r := step(moved...)
	if r.State != stateRunning || r.Node != "n2" || r.Attempt != 2 {
		t.Fatalf("after migrated: %s on %s attempt %d, want running on n2 attempt 2", r.State, r.Node, r.Attempt)
	}
	var names []string
	for _, s := range r.Timeline {
		names = append(names, s.Event)
	}
	if got := strings.Join(names, ","); got != "requested,scheduled,started,migrating,stopped,scheduled,started,migrated" {
		t.Fatalf("timeline %s", got)
	}
	if len(r.Segments) != 2 || r.Segments[0].StoppedAt == nil || r.Segments[1].StoppedAt != nil {
		t.Fatalf("segments %+v, want the first closed and the second open", r.Segments)
	}
	r = step(append(moved, stopped("n2", 2, t0.Add(20*time.Second), shizuv1.ExitReason_EXIT_REASON_CANCELLED))...)
	if r.State != stateStopped || r.Why != "cancelled" {
		t.Fatalf("after the final stop: %s (%s)", r.State, r.Why)
	}
}

func TestRentalPendingThenRejected(t *testing.T) {
	t.Parallel()
	spec := &shizuv1.RentalSpec{GpuCount: 16, MilliGpu: 1000, Plan: shizuv1.Plan_PLAN_ON_DEMAND}
	rs := rentals(evs(
		&shizuv1.RentalRequested{Meta: meta("q", t0), RentalId: "r-2", TenantId: "acme", Spec: spec},
		&shizuv1.RentalPending{Meta: meta("p", t0), RentalId: "r-2", TenantId: "acme", Reason: shizuv1.PendingReason_PENDING_REASON_NO_CAPACITY},
	))
	if rs[0].State != statePending || rs[0].Why != "no capacity" {
		t.Fatalf("pending view %s (%s)", rs[0].State, rs[0].Why)
	}
	rs = rentals(evs(
		&shizuv1.RentalRequested{Meta: meta("q", t0), RentalId: "r-2", TenantId: "acme", Spec: spec},
		&shizuv1.RentalRejected{Meta: meta("x", t0), RentalId: "r-2", TenantId: "acme", Reason: shizuv1.RejectReason_REJECT_REASON_UNSATISFIABLE, Message: "16 GPUs on one node"},
	))
	if rs[0].State != stateRejected || rs[0].Why != "unsatisfiable: 16 GPUs on one node" {
		t.Fatalf("rejected view %s (%s)", rs[0].State, rs[0].Why)
	}
}

func TestBillSumsRecordsOncePerID(t *testing.T) {
	t.Parallel()
	rec := func(id, rental, tenant string, secs, micros int64) *shizuv1.UsageRecorded {
		return &shizuv1.UsageRecorded{Meta: meta(id, t0), RentalId: rental, TenantId: tenant, Plan: shizuv1.Plan_PLAN_ON_DEMAND, Model: "H100-SXM5-80GB",
			IntervalStart: timestamppb.New(t0), IntervalEnd: timestamppb.New(t0.Add(time.Duration(secs) * time.Second)), Seconds: secs,
			Amount: &shizuv1.Money{Micros: micros, Currency: "USD"}}
	}
	v := bill("acme", evs(
		rec("u1", "r-1", "acme", 60, 41_500),
		rec("u2", "r-1", "acme", 30, 20_750),
		rec("u2", "r-1", "acme", 30, 20_750), // a redelivered record counts once
		rec("u3", "r-2", "acme", 10, 6_917),
		rec("u4", "r-3", "other", 10, 999),
		&shizuv1.InvoiceClosed{Meta: meta("i", t0), InvoiceId: "inv-1", TenantId: "acme", PeriodStart: timestamppb.New(t0), PeriodEnd: timestamppb.New(t0.Add(24 * time.Hour)),
			Total: &shizuv1.Money{Micros: 69_167, Currency: "USD"}},
	))
	if v.Total != 69_167 || len(v.Charges) != 2 || v.Charges[0].Seconds != 90 || v.Charges[0].Records != 2 || len(v.Invoices) != 1 {
		t.Fatalf("bill %+v", v)
	}
	if got := money(v.Total, v.Currency); got != "0.069167 USD" {
		t.Fatalf("money = %q", got)
	}
}

func TestNodesJoinCapacityAndHealth(t *testing.T) {
	t.Parallel()
	snap := capacity.Snapshot{Nodes: []capacity.NodeState{{
		Node: capacity.Node{ID: "n1", Zone: "local", Market: capacity.MarketOnDemand,
			GPUs: []capacity.GPU{{Index: 0, Model: "H100-SXM5-80GB", VRAMMiB: 81559}, {Index: 1, Model: "H100-SXM5-80GB", VRAMMiB: 81559}}},
		Status: capacity.StatusReady, Epoch: 2,
		FreeGPUs:    []capacity.FreeGPU{{Index: 0, Milli: 750, VRAMMiB: 61079, Sharers: 1}, {Index: 1, Milli: 1000, VRAMMiB: 81559}},
		Allocations: []capacity.Allocation{{Placement: capacity.Placement{RentalID: "r-1", GPUs: []capacity.GPUShare{{Index: 0, Milli: 250}}}}},
	}}}
	h := foldNodeEvents(evs(
		&shizuv1.NodeRegistered{Meta: meta("a", t0), NodeId: "n1", Epoch: 1},
		&shizuv1.NodeHealthChanged{Meta: meta("b", t0), NodeId: "n1", Epoch: 1, GpuIndex: 1, Health: shizuv1.Health_HEALTH_FAILED, Xid: 79},
		&shizuv1.NodeRegistered{Meta: meta("c", t0), NodeId: "n1", Epoch: 2},
		&shizuv1.NodeHealthChanged{Meta: meta("d", t0), NodeId: "n1", Epoch: 2, GpuIndex: 0, Health: shizuv1.Health_HEALTH_DEGRADED, Xid: 31},
	))
	tel := map[string]*shizuv1.NodeTelemetry{"n1": {NodeId: "n1", Epoch: 2, Gpus: []*shizuv1.GpuTelemetry{{GpuIndex: 0, UtilizationPercent: 23, VramUsedMib: 20480}}}}
	ns := nodesFrom(snap, h, tel)
	if len(ns) != 1 {
		t.Fatalf("%d nodes", len(ns))
	}
	n := ns[0]
	if n.FreeMilli != 1750 || n.Rentals != 1 || n.GPUs[0].UsedMilli != 250 || n.GPUs[0].Health != "degraded" || n.GPUs[1].Health != "healthy" ||
		strings.Join(n.GPUs[0].Rentals, ",") != "r-1" || n.LastEvent != "GPU 0 degraded (Xid 31)" ||
		n.GPUs[0].Utilization != 23 || n.GPUs[0].VRAMUsed != 20480 || n.GPUs[1].Utilization != -1 {
		t.Fatalf("node view %+v", n)
	}
}

func TestNodesCountNoFreeCapacityOnFailedGPUsOrNodesThatTakeNoWork(t *testing.T) {
	t.Parallel()
	gpus := []capacity.GPU{{Index: 0, Model: "H100-SXM5-80GB", VRAMMiB: 81559}, {Index: 1, Model: "H100-SXM5-80GB", VRAMMiB: 81559}}
	whole := func(i int, h capacity.GPUHealth) capacity.FreeGPU {
		return capacity.FreeGPU{Index: i, Milli: 1000, VRAMMiB: 81559, Health: h}
	}
	snap := capacity.Snapshot{Nodes: []capacity.NodeState{
		{Node: capacity.Node{ID: "n1", GPUs: gpus}, Status: capacity.StatusReady, Epoch: 1,
			FreeGPUs: []capacity.FreeGPU{whole(0, capacity.HealthFailed), whole(1, "")}},
		{Node: capacity.Node{ID: "n2", GPUs: gpus}, Status: capacity.StatusDraining, Epoch: 1,
			FreeGPUs: []capacity.FreeGPU{whole(0, ""), whole(1, "")}},
		{Node: capacity.Node{ID: "n3", GPUs: gpus}, Status: capacity.StatusDead, Epoch: 2,
			FreeGPUs: []capacity.FreeGPU{whole(0, ""), whole(1, "")}},
	}}
	// No health events at all: the store's mark alone must count.
	ns := nodesFrom(snap, foldNodeEvents(nil), nil)
	if len(ns) != 3 {
		t.Fatalf("%d nodes", len(ns))
	}
	if n := ns[0]; n.FreeMilli != 1000 || n.GPUs[0].Health != "failed" || n.GPUs[0].FreeVRAM != 0 || n.GPUs[1].FreeVRAM != 81559 {
		t.Errorf("a failed GPU counted as free: %+v", n)
	}
	for _, n := range ns[1:] {
		if n.FreeMilli != 0 || n.GPUs[0].FreeVRAM != 0 {
			t.Errorf("%s node counted free capacity: %+v", n.Status, n)
		}
	}
}

func TestClientResolvesCredentialsFromTheDevEnvFile(t *testing.T) {
	dir := t.TempDir()
	env := "export SHIZU_NATS_URL=nats://127.0.0.1:1\nexport SHIZU_NATS_USER=admin\nexport SHIZU_NATS_PASSWORD=secret\nexport SHIZU_REDIS_URL=redis://127.0.0.1:2/0\n"
	if err := os.WriteFile(filepath.Join(dir, "env"), []byte(env), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"SHIZU_NATS_URL", "SHIZU_NATS_USER", "SHIZU_NATS_PASSWORD", "SHIZU_REDIS_URL"} {
		t.Setenv(k, "")
	}
	cf := clientFlags{devDir: dir, output: "table"}
	r, err := cf.resolve()
	if err != nil || r.bus.URL != "nats://127.0.0.1:1" || r.bus.Password != "secret" || r.redisURL != "redis://127.0.0.1:2/0" {
		t.Fatalf("resolve = %+v, %v", r, err)
	}
	cf.url = "nats://127.0.0.1:3"
	if r, _ := cf.resolve(); r.bus.URL != "nats://127.0.0.1:3" {
		t.Fatalf("a flag does not win over the env file: %s", r.bus.URL)
	}
}

func TestVerbsFailInOneLine(t *testing.T) {
	// Not parallel: sets the environment.
	for _, k := range []string{"SHIZU_NATS_URL", "SHIZU_NATS_USER", "SHIZU_NATS_PASSWORD", "SHIZU_REDIS_URL", envAPIURL, envAPIKey} {
		t.Setenv(k, "")
	}
	empty := t.TempDir()
	t.Setenv(envConfigDir, empty) // no shizu login
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"rent refuses a fraction above one GPU", []string{"rent", "-fraction", "1.5", "-vram", "1G"}, 2, "-fraction"},
		{"rent refuses an NVLink MIG slice", []string{"rent", "-gpus", "2", "-nvlink", "-mig", "1g.10gb"}, 2, "-mig 1g.10gb is one whole MIG slice"},
		{"rent refuses a spot cap on demand", []string{"rent", "-max-price", "1.0"}, 2, "a maximum price is only for -plan spot"},
		{"rent refuses an unknown flag", []string{"rent", "-gpu", "2"}, 2, "flag provided but not defined"},
		{"ls without a key says to log in or start shizu dev", []string{"ls", "-dev-dir", empty}, 1, "run `shizu login` with your key (or start `shizu dev`"},
		{"an unreachable server says how to start one", []string{"bill", "-nats-url", "nats://127.0.0.1:1"}, 1, "start it with `shizu dev`"},
		{"show wants a rental id", []string{"show"}, 2, "want one rental id"},
		{"chaos wants a known action", []string{"chaos", "melt", "n1"}, 2, "unknown action"},
		{"traffic refuses a bad pool id", []string{"traffic", "a.b"}, 2, "pool id"},
		{"spot-price wants a zone, a model and a price", []string{"spot-price", "local", "H100-SXM5-80GB"}, 2, "want <zone> <model> <price>"},
		{"spot-price refuses a price that is no amount", []string{"spot-price", "local", "H100-SXM5-80GB", "2,10"}, 2, "price"},
		{"spot-price refuses a model that is no subject token", []string{"spot-price", "local", "H100 SXM", "2.10"}, 2, "zone or model"},
		{"-o refuses unknown formats", []string{"ls", "-o", "yaml", "-dev-dir", empty}, 2, "want table or json"},
		{"advise refuses an unknown model", []string{"advise", "-offline", "-model", "V100"}, 2, "not in the price catalogue"},
		{"advise names a negative quantity's flag", []string{"advise", "-offline", "-sessions", "-3"}, 2, "-sessions -3: must not be negative"},
		{"advise names the GPUs training lacks", []string{"advise", "-offline", "-training-gpus", "0"}, 2, "-training-gpus 0: training needs at least one GPU"},
		{"advise names a session without a length", []string{"advise", "-offline", "-session-length", "0s"}, 2, "-session-length 0s: tuning sessions need a length"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(t.Context(), c.args, &out, &errOut)
			msg := errOut.String()
			if strings.Count(strings.TrimSpace(msg), "\n") != 0 {
				t.Fatalf("stderr is not one line:\n%s", msg)
			}
			if code != c.code || !strings.Contains(msg, c.want) {
				t.Fatalf("exit %d, stderr %q; want exit %d and %q", code, msg, c.code, c.want)
			}
		})
	}
}

func TestHelpHasExamples(t *testing.T) {
	t.Parallel()
	for name := range verbs() {
		var out, errOut bytes.Buffer
		if code := run(t.Context(), []string{name, "-h"}, &out, &errOut); code != 0 {
			t.Errorf("%s -h: exit %d", name, code)
		}
		if !strings.Contains(errOut.String(), "Examples:\n  shizu "+name) {
			t.Errorf("%s -h has no examples:\n%s", name, errOut.String())
		}
	}
}

func TestAdviseOffline(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	code := run(t.Context(), []string{"advise", "-offline", "-spot-price", "0.80", "-training-gpu-hours", "100", "-training-gpus", "4", "-o", "json"}, &out, &errOut)
	if code != 0 || !strings.Contains(out.String(), `"saving_micros"`) || !strings.Contains(out.String(), "assumed flat spot price 0.800000 USD") {
		t.Fatalf("exit %d\n%s\n%s", code, out.String(), errOut.String())
	}
}

func TestShowAndBillNameAModelChangeAcrossAMigration(t *testing.T) {
	t.Parallel()
	spec := &shizuv1.RentalSpec{GpuCount: 1, MilliGpu: 1000, Plan: shizuv1.Plan_PLAN_ON_DEMAND}
	sched := func(node, model string, attempt int32, at time.Time) *shizuv1.RentalScheduled {
		return &shizuv1.RentalScheduled{Meta: meta("s", at), RentalId: "r-1", TenantId: "acme", NodeId: node, Attempt: attempt, Spec: spec,
			GpuModel: model, Gpus: []*shizuv1.GpuAssignment{{GpuIndex: 0}}}
	}
	rs := rentals(evs(
		&shizuv1.RentalRequested{Meta: meta("q", t0), RentalId: "r-1", TenantId: "acme", Spec: spec},
		sched("n1", "A100-SXM4-80GB", 1, t0.Add(time.Millisecond)),
		&shizuv1.RentalMigrating{Meta: meta("m", t0.Add(10*time.Second)), RentalId: "r-1", TenantId: "acme", FromNodeId: "n1",
			Reason: shizuv1.MigrationReason_MIGRATION_REASON_NODE_LOST, FromAttempt: 1, NextAttempt: 2},
		sched("n2", "H100-SXM5-80GB", 2, t0.Add(12*time.Second)),
	))
	last := rs[0].Timeline[len(rs[0].Timeline)-1]
	if rs[0].Model != "H100-SXM5-80GB" || !strings.Contains(last.Detail, "model changed from A100-SXM4-80GB") {
		t.Fatalf("show: model %s, last step %+v; want the new model and the change named", rs[0].Model, last)
	}
	rec := func(id, model string) *shizuv1.UsageRecorded {
		return &shizuv1.UsageRecorded{Meta: meta(id, t0), RentalId: "r-1", TenantId: "acme", Plan: shizuv1.Plan_PLAN_ON_DEMAND, Model: model,
			IntervalStart: timestamppb.New(t0), IntervalEnd: timestamppb.New(t0.Add(10 * time.Second)), Seconds: 10,
			Amount: &shizuv1.Money{Micros: 1000, Currency: "USD"}}
	}
	v := bill("acme", evs(rec("u1", "A100-SXM4-80GB"), rec("u2", "A100-SXM4-80GB"), rec("u3", "H100-SXM5-80GB")))
	if c := v.Charges[0]; c.Model != "A100-SXM4-80GB" || !slices.Equal(c.Models, []string{"A100-SXM4-80GB", "H100-SXM5-80GB"}) ||
		c.modelColumn() != "A100-SXM4-80GB→H100-SXM5-80GB" {
		t.Fatalf("bill: charge %+v, want both models named in order", c)
	}
}
