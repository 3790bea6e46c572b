package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/gateway/identity"
	"github.com/shizu-gpu/shizu/shared/benchkit"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

var snakeKey = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

// jsonKeys decodes data (one JSON value) and returns every object key in
// it, at any depth, except the keys of the maps listed in free (objects
// whose keys are the user's: labels). It fails the test when data is not
// one JSON value.
func jsonKeys(t *testing.T, data []byte, free ...string) []string {
	t.Helper()
	var v any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, data)
	}
	if dec.More() {
		t.Fatalf("more than one JSON value:\n%s", data)
	}
	var keys []string
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				keys = append(keys, k)
				if !slices.Contains(free, k) {
					walk(e)
				}
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(v)
	slices.Sort(keys)
	return slices.Compact(keys)
}

// assertSnakeJSON checks that data is one JSON value whose keys are all
// snake_case and include want.
func assertSnakeJSON(t *testing.T, what string, data []byte, want ...string) {
	t.Helper()
	keys := jsonKeys(t, data, "labels")
	for _, k := range keys {
		if !snakeKey.MatchString(k) {
			t.Errorf("%s: key %q is not snake_case\n%s", what, k, data)
		}
	}
	for _, k := range want {
		if !slices.Contains(keys, k) {
			t.Errorf("%s: no key %q in %v", what, k, keys)
		}
	}
}

// seedPlatform starts a platform (real NATS with the platform's users and
// streams, real Redis) holding a few events of tenant acme (rental r-1
// requested, scheduled and started on n1, billed and invoiced; pool chat
// scaled; node n1 registered and in the capacity store) and returns it
// with the connection flags of the CLI.
func seedPlatform(t *testing.T) (*testkit.Deployment, []string) {
	t.Helper()
	d := testkit.Platform(t)
	ctx := t.Context()
	now := time.Now().UTC().Truncate(time.Second)
	spec := &shizuv1.RentalSpec{GpuCount: 1, MilliGpu: 1000, Plan: shizuv1.Plan_PLAN_ON_DEMAND, Labels: map[string]string{"Team-Name": "x"}}
	publish := func(subj string, m proto.Message) {
		t.Helper()
		if _, err := d.Admin.Publish(ctx, subj, m); err != nil {
			t.Fatal(err)
		}
	}
	rental := func(format string) string { s, _ := subject.Format(format, "acme"); return s }
	publish(rental(subject.RentalRequested), &shizuv1.RentalRequested{Meta: meta("q1", now), RentalId: "r-1", TenantId: "acme", Spec: spec})
	publish(rental(subject.RentalScheduled), &shizuv1.RentalScheduled{Meta: meta("s1", now), RentalId: "r-1", TenantId: "acme", NodeId: "n1",
		Attempt: 1, Spec: spec, GpuModel: "H100-SXM5-80GB", Gpus: []*shizuv1.GpuAssignment{{GpuIndex: 0, GpuUuid: "GPU-0", MilliGpu: 1000}}})
	publish(rental(subject.RentalStarted), &shizuv1.RentalStarted{Meta: meta("st1", now), RentalId: "r-1", TenantId: "acme", NodeId: "n1",
		Attempt: 1, StartedAt: timestamppb.New(now)})
	usage, _ := subject.Format(subject.UsageRecorded, "acme")
	publish(usage, &shizuv1.UsageRecorded{Meta: meta("u1", now), RentalId: "r-1", TenantId: "acme", Plan: shizuv1.Plan_PLAN_ON_DEMAND,
		Model: "H100-SXM5-80GB", IntervalStart: timestamppb.New(now), IntervalEnd: timestamppb.New(now.Add(time.Minute)), Seconds: 60,
		Amount: &shizuv1.Money{Micros: 41_500, Currency: "USD"}, NodeId: "n1"})
	invoice, _ := subject.Format(subject.InvoiceClosed, "acme")
	publish(invoice, &shizuv1.InvoiceClosed{Meta: meta("i1", now), InvoiceId: "inv-1", TenantId: "acme", PeriodStart: timestamppb.New(now),
		PeriodEnd: timestamppb.New(now.Add(time.Hour)), Total: &shizuv1.Money{Micros: 41_500, Currency: "USD"}})
	decided, _ := subject.Format(subject.ScaleDecided, "chat")
	publish(decided, &shizuv1.ScalingDecided{Meta: meta("d1", now), PoolId: "chat", FromReplicas: 1, ToReplicas: 3, Rule: "busy",
		Metric: "concurrent_requests_per_replica", ObservedValue: 12, Threshold: 8, Reason: "busy"})
	registered, _ := subject.Format(subject.NodeRegistered, "n1")
	publish(registered, &shizuv1.NodeRegistered{Meta: meta("n1", now), NodeId: "n1", Epoch: 1})
	rdb := redis.NewClient(&redis.Options{Addr: d.Redis.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	store, err := capacity.New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Register(ctx, capacity.Node{ID: "n1", Zone: "local", Market: capacity.MarketOnDemand, PricePerGPUHourMicros: 2_490_000,
		Currency: "USD", CPUMilli: 16000, MemoryMiB: 65536,
		GPUs: []capacity.GPU{{Index: 0, UUID: "GPU-0", Model: "H100-SXM5-80GB", VRAMMiB: 81559}}}); err != nil {
		t.Fatal(err)
	}
	return d, []string{"-dev-dir", t.TempDir(), "-nats-url", d.NATS.URL, "-nats-user", topology.Admin,
		"-nats-password", testkit.Password(topology.Admin), "-redis-url", "redis://" + d.Redis.Addr + "/0"}
}

// TestEveryVerbPrintsSnakeCaseJSON runs every verb with -o json against a
// real NATS (the platform's users and streams) and Redis holding a few
// stored events and a registered node, decodes what it prints and checks
// every key is snake_case, with the keys a script relies on.
func TestEveryVerbPrintsSnakeCaseJSON(t *testing.T) {
	t.Parallel()
	d, conn := seedPlatform(t)
	ctx := t.Context()
	conn = append([]string{"-o", "json"}, conn...)
	// The tenant verbs go through the gateway with a key of acme.
	gw := startGatewayStackOn(t, d)
	api := []string{"-o", "json", "-dev-dir", gw.devDirFor(gw.tenantKey("acme", identity.ReadWrite))}
	testkit.Eventually(t, 10*time.Second, func() error { // the read model folds the seeded events
		var out, errOut bytes.Buffer
		if code := run(ctx, append([]string{"show", "r-1"}, api...), &out, &errOut); code != 0 || !strings.Contains(out.String(), `"running"`) {
			return fmt.Errorf("show r-1: exit %d %s%s", code, out.String(), errOut.String())
		}
		return nil
	})
	pool := filepath.Join(t.TempDir(), "chat.json")
	if err := os.WriteFile(pool, []byte(`{"id":"chat","tenant":"acme","rental":{"gpu_count":1,"milli_gpu":1000},
		"min_replicas":1,"max_replicas":4,"max_step_out":1,"max_step_in":1,
		"target_tracking":{"metric":"requests_per_second_per_replica","value":100}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want []string
		api  bool // a tenant verb: through the gateway
	}{
		{[]string{"ls"}, []string{"rental_id", "tenant_id", "state", "node", "gpus", "model", "plan", "shape", "since"}, true},
		{[]string{"show", "r-1"}, []string{"rental_id", "state", "timeline", "at", "event", "detail", "segments", "started_at"}, true},
		{[]string{"bill", "-tenant", "acme"}, []string{"tenant_id", "charges", "amount_micros", "billed_through", "total_micros", "invoices", "invoice_id", "period_start"}, false},
		{[]string{"pools"}, []string{"pool_id", "replicas", "decisions", "from", "to", "rule", "observed", "threshold"}, false},
		{[]string{"nodes"}, []string{"node_id", "status", "health", "epoch", "gpus", "used_milli", "free_vram_mib", "utilization_percent", "free_milli_gpu"}, false},
		{[]string{"advise", "-training-gpu-hours", "16", "-training-gpus", "2"}, []string{"model", "prices", "on_demand_micros", "advice", "blocks",
			"what", "plan", "start", "end", "gpus", "cost_micros", "total_micros", "all_on_demand_micros", "saving_micros"}, false},
		{[]string{"rent", "-wait", "0", "-label", "Team-Name=x"}, []string{"rental_id", "tenant_id", "state", "plan", "shape"}, true},
		{[]string{"stop", "r-1", "-wait", "0"}, []string{"rental_id", "state"}, true},
		{[]string{"traffic", "chat", "-rps", "10"}, []string{"pool_id", "samples"}, false},
		{[]string{"spot-price", "local", "H100-SXM5-80GB", "2.10"}, []string{"event_id", "zone", "model", "price_per_gpu_hour_micros", "currency"}, false},
		{[]string{"pools", "apply", "-f", pool}, []string{"pool_id", "tenant_id", "declared", "min_replicas", "max_replicas", "gpus_per_replica"}, false},
		{[]string{"pools", "withdraw", "chat", "-tenant", "acme"}, []string{"pool_id", "tenant_id", "withdrawn"}, false},
	} {
		name := strings.Join(c.args[:min(2, len(c.args))], " ")
		t.Run(name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			flags := conn
			if c.api {
				flags = api
			}
			if code := run(ctx, append(slices.Clone(c.args), flags...), &out, &errOut); code != 0 {
				t.Fatalf("exit %d: %s", code, errOut.String())
			}
			assertSnakeJSON(t, name, out.Bytes(), c.want...)
		})
	}
}

// TestLocalJSONIsSnakeCase: the JSON of what needs no platform: version,
// the chaos endpoint's reply, and a bench report with extra figures.
func TestLocalJSONIsSnakeCase(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	if code := run(t.Context(), []string{"version", "-json"}, &out, &errOut); code != 0 {
		t.Fatalf("version -json: exit %d: %s", code, errOut.String())
	}
	assertSnakeJSON(t, "version", out.Bytes(), "release", "commit", "modified", "go", "platform")

	data, err := json.Marshal(chaosReply{OK: true, Message: "m", Nodes: []chaosNode{{ID: "n1", Profile: "h100x8", Market: "spot", Running: true, Partitioned: true}}})
	if err != nil {
		t.Fatal(err)
	}
	assertSnakeJSON(t, "chaos", data, "ok", "nodes", "node_id", "partitioned")

	extra := benchCheck{name: "extra", summary: "fixed", defaultSize: 1, run: func(_ context.Context, _ *benchkit.Env, _ int) (benchkit.Result, error) {
		r := benchkit.Result{Measured: "fixed", Value: 2, Unit: "x/s", Ceiling: 4, CeilingWhat: "twice", Goal: 1, Size: 1, AtMost: true,
			Extra: map[string]float64{"paced_p99_ms": 1}}
		r.Finish()
		return r, nil
	}}
	out.Reset()
	if code := runBenchCommand(t.Context(), []string{"-o", "json", "-report-only"}, []benchCheck{extra}, &out, &errOut); code != 0 {
		t.Fatalf("bench: exit %d: %s", code, errOut.String())
	}
	assertSnakeJSON(t, "bench", out.Bytes(), "results", "check", "ceiling_measured", "goal_is_upper_bound", "extra", "not_here")
}
