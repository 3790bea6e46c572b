package app_test

import (
	"bytes"
	"encoding/csv"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/gateway/identity"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Money through the gateway is metering's to answer. The gateway's module
// does not import metering: these tests run the workspace's metering
// binary (built once per test binary) as a child on the harness's
// platform, as the metering user, and it meters what the RENTALS stream
// says happened.

const meteringPkg = "github.com/shizu-gpu/shizu/services/metering/cmd/metering"

// meteringEnv is the child's environment on h's platform.
func (h *harness) meteringEnv() []string {
	return append(os.Environ(), "SHIZU_NATS_URL="+h.d.NATS.URL, "SHIZU_NATS_USER="+topology.Metering,
		"SHIZU_NATS_PASSWORD="+testkit.Password(topology.Metering), "SHIZU_REDIS_URL="+h.d.RedisURL(),
		"SHIZU_LOG_FORMAT=text", "SHIZU_LOG_LEVEL=warn")
}

// startMetering runs metering with accounts (JSON) until the test ends,
// and waits until it answers.
func (h *harness) startMetering(accounts, key string) {
	t := h.t
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "accounts.json")
	if err := os.WriteFile(path, []byte(accounts), 0o600); err != nil {
		t.Fatal(err)
	}
	logs, err := os.Create(filepath.Join(dir, "metering.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(testkit.GoBuild(t, meteringPkg), "-accounts", path, "-http-addr=", "-tick", "200ms")
	cmd.Env, cmd.Stdout, cmd.Stderr = h.meteringEnv(), logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		_ = logs.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logs.Name()); err == nil {
				t.Logf("metering log:\n%s", b)
			}
		}
	})
	testkit.Eventually(t, 60*time.Second, func() error {
		if a := h.do(req{method: "GET", path: "/v1/budgets", key: key}); a.Status != http.StatusOK {
			return errStatus(a)
		}
		return nil
	})
}

// closeInvoice runs `metering invoice` for tenant over the day from.
func (h *harness) closeInvoice(tenant string, from time.Time) {
	h.t.Helper()
	cmd := exec.Command(testkit.GoBuild(h.t, meteringPkg), "invoice", "-tenant", tenant,
		"-from", from.Format(time.DateOnly), "-to", from.AddDate(0, 0, 1).Format(time.DateOnly))
	cmd.Env = h.meteringEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		h.t.Fatalf("metering invoice %s: %v\n%s", tenant, err, out)
	}
}

// ran publishes, as the scheduler and a node agent would, that rental id
// of tenant was placed, started at start and stopped after d.
func (h *harness) ran(tenant, id string, gpus int32, start time.Time, d time.Duration) {
	h.t.Helper()
	m := func(ev string, at time.Time) *shizuv1.EventMeta {
		return shizuv1.NewMeta("rental:"+id+":"+ev+":1", "test", "", id, at)
	}
	as := make([]*shizuv1.GpuAssignment, gpus)
	for i := range as {
		as[i] = &shizuv1.GpuAssignment{GpuIndex: int32(i), GpuUuid: fmt.Sprintf("GPU-%d", i), MilliGpu: 1000, VramMib: 81920}
	}
	spec := &shizuv1.RentalSpec{GpuCount: gpus, MilliGpu: 1000, Plan: shizuv1.Plan_PLAN_ON_DEMAND, Labels: map[string]string{"team": tenant + "-ml"}}
	h.publish(subject.RentalScheduled, tenant, &shizuv1.RentalScheduled{Meta: m("scheduled", start.Add(-time.Second)),
		RentalId: id, TenantId: tenant, NodeId: "node-1", NodeEpoch: 1, Gpus: as, Spec: spec, GpuModel: "H100-SXM5-80GB", Zone: "eu-1", Attempt: 1})
	h.publish(subject.RentalStarted, tenant, &shizuv1.RentalStarted{Meta: m("started", start), RentalId: id, TenantId: tenant,
		NodeId: "node-1", NodeEpoch: 1, StartedAt: timestamppb.New(start), Attempt: 1})
	h.publish(subject.RentalStopped, tenant, &shizuv1.RentalStopped{Meta: m("stopped", start.Add(d)), RentalId: id, TenantId: tenant,
		NodeId: "node-1", NodeEpoch: 1, StartedAt: timestamppb.New(start), StoppedAt: timestamppb.New(start.Add(d)),
		ExitReason: shizuv1.ExitReason_EXIT_REASON_COMPLETED, Attempt: 1})
}

// billedByRental sums the usage records on the BILLING stream by rental:
// the oracle the answers are checked against.
func (h *harness) billedByRental() map[string]int64 {
	h.t.Helper()
	s, err := h.admin.JetStream().Stream(h.t.Context(), topology.StreamBilling)
	if err != nil {
		h.t.Fatal(err)
	}
	out, seen := map[string]int64{}, map[string]bool{}
	for seq := uint64(1); ; seq++ {
		m, err := s.GetMsg(h.t.Context(), seq, jetstream.WithGetMsgSubject(subject.UsageRecordedAll))
		if err != nil {
			return out
		}
		seq = m.Sequence
		var ev shizuv1.UsageRecorded
		if err := proto.Unmarshal(m.Data, &ev); err != nil || seen[ev.GetMeta().GetEventId()] {
			continue
		}
		seen[ev.GetMeta().GetEventId()] = true
		out[ev.GetRentalId()] += ev.GetAmount().GetMicros()
	}
}

type usageDoc struct {
	From, To, Currency string
	GroupBy            string `json:"group_by"`
	Rows               []struct {
		Key, Plan       string
		MilliGPUSeconds int64 `json:"milli_gpu_seconds"`
		Seconds         int64
		AmountMicros    int64 `json:"amount_micros"`
	}
}

func TestUsageInvoicesAndBudgetsComeFromMeteringForTheKeysTenantOnly(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1, testOptions())
	acme, globex := h.tenant("acme", identity.ReadOnly), h.tenant("globex", identity.ReadWrite)
	h.startMetering(`{"budgets": [{"tenant_id": "acme", "currency": "USD", "amount_micros": 1000000000,
		"thresholds_percent": [50], "thresholds_micros": [1], "policy": "stop-running", "grace": "90s"}]}`, acme)
	acmeRW := h.key("acme", identity.ReadWrite)
	start := time.Now().UTC().Add(-2 * time.Hour).Truncate(time.Minute)
	mine := []string{h.create(acmeRW), h.create(acmeRW)}
	theirs := h.create(globex)
	h.ran("acme", mine[0], 2, start, 10*time.Minute)
	h.ran("acme", mine[1], 1, start.Add(5*time.Minute), 7*time.Minute+30*time.Second)
	h.ran("globex", theirs, 8, start, 20*time.Minute)
	q := "?from=" + start.Format(time.DateOnly) + "&to=" + time.Now().UTC().AddDate(0, 0, 1).Format(time.DateOnly)
	var byRental usageDoc
	testkit.Eventually(t, 30*time.Second, func() error {
		want := h.billedByRental()
		if len(want) != 3 {
			return fmt.Errorf("records of %d rentals on the stream", len(want))
		}
		a := h.do(req{method: "GET", path: "/v1/usage" + q + "&group_by=rental", key: acme})
		if a.Status != http.StatusOK {
			return errStatus(a)
		}
		byRental = usageDoc{}
		a.json(t, &byRental)
		if len(byRental.Rows) != 2 {
			return fmt.Errorf("acme's usage by rental has %d rows: %s", len(byRental.Rows), a.Body)
		}
		for _, r := range byRental.Rows {
			if r.AmountMicros != want[r.Key] || r.Seconds == 0 {
				return fmt.Errorf("row %+v, the stream says %d µ", r, want[r.Key])
			}
		}
		return nil
	})
	if byRental.Currency != "USD" || byRental.GroupBy != "rental" || byRental.Rows[0].Key == theirs || byRental.Rows[1].Key == theirs {
		t.Fatalf("acme's usage by rental: %+v", byRental)
	}
	total := byRental.Rows[0].AmountMicros + byRental.Rows[1].AmountMicros
	for _, g := range []string{"model", "day", "label"} {
		checkCSVMatchesJSON(t, h, acme, q+"&group_by="+g, total)
	}
	// globex sees its own rental only, and none of acme's.
	var theirUsage usageDoc
	h.do(req{method: "GET", path: "/v1/usage" + q + "&group_by=rental", key: globex}).json(t, &theirUsage)
	if len(theirUsage.Rows) != 1 || theirUsage.Rows[0].Key != theirs {
		t.Fatalf("globex's usage by rental: %+v", theirUsage)
	}
	checkBudgetsOfEach(t, h, acme, globex, total, theirUsage.Rows[0].AmountMicros)
	checkInvoicesOfEach(t, h, acme, globex, start)
}

// checkCSVMatchesJSON reads the same usage as JSON, as CSV by Accept and
// as CSV by format=csv: the CSV parses and says what the JSON says.
func checkCSVMatchesJSON(t *testing.T, h *harness, key, query string, total int64) {
	t.Helper()
	var doc usageDoc
	h.do(req{method: "GET", path: "/v1/usage" + query, key: key}).json(t, &doc)
	var sum int64
	for _, r := range doc.Rows {
		sum += r.AmountMicros
	}
	if len(doc.Rows) == 0 || sum != total {
		t.Fatalf("usage %s: %+v sums to %d, want %d", query, doc, sum, total)
	}
	byAccept := h.do(req{method: "GET", path: "/v1/usage" + query, key: key, header: map[string]string{"Accept": "text/csv"}})
	byFormat := h.do(req{method: "GET", path: "/v1/usage" + query + "&format=csv", key: key})
	if !bytes.Equal(byAccept.Body, byFormat.Body) || byAccept.Header.Get("Content-Type") != "text/csv; charset=utf-8" {
		t.Fatalf("CSV by Accept (%s) and by format differ:\n%s\n%s", byAccept.Header.Get("Content-Type"), byAccept.Body, byFormat.Body)
	}
	lines, err := csv.NewReader(bytes.NewReader(byAccept.Body)).ReadAll()
	if err != nil {
		t.Fatalf("CSV does not parse: %v\n%s", err, byAccept.Body)
	}
	if len(lines) != len(doc.Rows)+1 || lines[0][0] != doc.GroupBy || lines[0][4] != "amount_micros" {
		t.Fatalf("CSV %v for %d rows grouped by %s", lines, len(doc.Rows), doc.GroupBy)
	}
	for i, r := range doc.Rows {
		want := []string{r.Key, r.Plan, strconv.FormatInt(r.MilliGPUSeconds, 10), strconv.FormatInt(r.Seconds, 10),
			strconv.FormatInt(r.AmountMicros, 10), doc.Currency}
		if fmt.Sprint(lines[i+1]) != fmt.Sprint(want) {
			t.Fatalf("CSV line %d %v, JSON row %v", i+1, lines[i+1], want)
		}
	}
}

type budgetDoc struct {
	Month, Currency string
	Spend           int64 `json:"spend_micros"`
	Budget          *struct {
		ID         string `json:"budget_id"`
		Amount     int64  `json:"amount_micros"`
		Policy     string
		Grace      int64 `json:"grace_seconds"`
		Thresholds []struct {
			Micros           int64
			Percent          int
			Reached, Alerted bool
		}
	}
}

func checkBudgetsOfEach(t *testing.T, h *harness, acme, globex string, acmeSpend, globexSpend int64) {
	t.Helper()
	month := time.Now().UTC().Format("2006-01")
	if time.Now().UTC().Add(-3*time.Hour).Format("2006-01") != month {
		t.Log("the rentals may straddle a month boundary: the month's spend is not compared")
		acmeSpend, globexSpend = -1, -1
	}
	var mine, theirs budgetDoc
	h.do(req{method: "GET", path: "/v1/budgets", key: acme}).json(t, &mine)
	if mine.Month != month || (acmeSpend >= 0 && mine.Spend != acmeSpend) || mine.Budget == nil || mine.Budget.Amount != 1_000_000_000 ||
		mine.Budget.Policy != "stop-running" || mine.Budget.Grace != 90 ||
		// 1 µ, 50 % and the 100 % a policy that stops adds
		len(mine.Budget.Thresholds) != 3 || !mine.Budget.Thresholds[0].Reached || mine.Budget.Thresholds[1].Percent != 50 ||
		mine.Budget.Thresholds[2].Percent != 100 || mine.Budget.Thresholds[2].Reached {
		t.Fatalf("acme's budget: %+v (spend %d)", mine, acmeSpend)
	}
	h.do(req{method: "GET", path: "/v1/budgets", key: globex}).json(t, &theirs)
	if theirs.Budget != nil || (globexSpend >= 0 && theirs.Spend != globexSpend) {
		t.Fatalf("globex (no budget) sees %+v; want its own spend %d and no budget", theirs, globexSpend)
	}
}

type invoiceListDoc struct {
	Invoices []struct {
		ID    string `json:"invoice_id"`
		Total int64  `json:"total_micros"`
		Lines []struct{ Plan, Model string }
	}
	Next string `json:"next_cursor"`
}

func checkInvoicesOfEach(t *testing.T, h *harness, acme, globex string, start time.Time) {
	t.Helper()
	day := start.Truncate(24 * time.Hour)
	h.closeInvoice("acme", day)
	h.closeInvoice("globex", day)
	h.closeInvoice("acme", day.AddDate(0, 0, 1))
	var page, next, theirs invoiceListDoc
	h.do(req{method: "GET", path: "/v1/invoices?limit=1", key: acme}).json(t, &page)
	if len(page.Invoices) != 1 || page.Next == "" || page.Invoices[0].ID != "invoice:acme:"+day.Format(time.RFC3339) {
		t.Fatalf("acme's first page: %+v", page)
	}
	h.do(req{method: "GET", path: "/v1/invoices?limit=1&cursor=" + page.Next, key: acme}).json(t, &next)
	if len(next.Invoices) != 1 || next.Next != "" || next.Invoices[0].ID != "invoice:acme:"+day.AddDate(0, 0, 1).Format(time.RFC3339) {
		t.Fatalf("acme's second page: %+v", next)
	}
	h.do(req{method: "GET", path: "/v1/invoices", key: globex}).json(t, &theirs)
	if len(theirs.Invoices) != 1 || theirs.Invoices[0].ID != "invoice:globex:"+day.Format(time.RFC3339) {
		t.Fatalf("globex's invoices: %+v", theirs)
	}
	if a := h.do(req{method: "GET", path: "/v1/invoices?cursor=42", key: acme}); a.Status != http.StatusBadRequest || !a.problem(t).names("query cursor") {
		t.Fatalf("a cursor this API did not return: %d %s", a.Status, a.Body)
	}
}

func TestMoneyWithoutMeteringIs503WithRetryAfterAndBadQueriesNameTheField(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1, testOptions())
	key := h.tenant("acme", identity.ReadOnly)
	for _, path := range []string{"/v1/usage", "/v1/usage?group_by=model&format=csv", "/v1/invoices", "/v1/budgets"} {
		a := h.do(req{method: "GET", path: path, key: key})
		if a.Status != http.StatusServiceUnavailable || a.Header.Get("Retry-After") == "" || a.problem(t).Type != "urn:shizu:problem:unavailable" {
			t.Fatalf("%s without metering: %d (Retry-After %q) %s", path, a.Status, a.Header.Get("Retry-After"), a.Body)
		}
	}
	for path, field := range map[string]string{
		"/v1/usage?group_by=week":                 "query group_by",
		"/v1/usage?from=2026-02-30":               "query from",
		"/v1/usage?from=2026-12-02&to=2026-12-01": "query to",
		"/v1/usage?from=2024-01-01&to=2026-01-01": "query to",
		"/v1/usage?format=xml":                    "query format",
		"/v1/invoices?limit=1000":                 "query limit",
		"/v1/invoices?cursor=r-1":                 "query cursor",
	} {
		a := h.do(req{method: "GET", path: path, key: key})
		if a.Status != http.StatusBadRequest || !a.problem(t).names(field) {
			t.Fatalf("%s: %d %s; want 400 naming %s", path, a.Status, a.Body, field)
		}
	}
	if a := h.do(req{method: "GET", path: "/v1/usage"}); a.Status != http.StatusUnauthorized {
		t.Fatalf("usage without a key: %d", a.Status)
	}
	op := h.key("", identity.Operator)
	if a := h.do(req{method: "GET", path: "/v1/budgets", key: op}); a.Status != http.StatusForbidden {
		t.Fatalf("budgets with an operator key: %d", a.Status)
	}
}
