package app_test

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/gateway/identity"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

type rentalDoc struct {
	ID       string `json:"rental_id"`
	Tenant   string `json:"tenant_id"`
	State    string `json:"state"`
	Plan     string `json:"plan"`
	Shape    string `json:"shape"`
	Timeline []struct{ Event, Detail string }
}

func TestARentalIsRequestedForTheKeysTenantWithAnIdAndTimeOfThePlatform(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1, testOptions())
	key := h.tenant("acme", identity.ReadWrite)
	before := time.Now().UTC()
	a := h.do(req{method: "POST", path: "/v1/rentals", key: key, body: map[string]any{
		"gpu_count": 2, "interconnect": "nvlink", "allowed_models": []string{"H100-SXM5-80GB"}, "plan": "spot",
		"max_spot_price_per_gpu_hour": map[string]any{"micros": 1200000, "currency": "USD"}, "priority": 100,
		"labels": map[string]string{"team": "ml"}, "command": []string{"python", "train.py"}, "pending_timeout": "30m"}})
	if a.Status != http.StatusCreated {
		t.Fatalf("create: %d %s", a.Status, a.Body)
	}
	var r rentalDoc
	a.json(t, &r)
	if r.Tenant != "acme" || r.State != "requested" || r.Plan != "spot" || len(r.ID) < 10 || r.ID[:2] != "r-" ||
		a.Header.Get("Location") != "/v1/rentals/"+r.ID {
		t.Fatalf("created %+v, location %q", r, a.Header.Get("Location"))
	}
	var ev shizuv1.RentalRequested
	m := h.last("RENTALS", "rental.acme.requested", &ev)
	at := ev.GetMeta().GetOccurredAt().AsTime()
	if ev.GetTenantId() != "acme" || ev.GetRentalId() != r.ID || at.Before(before.Add(-time.Second)) || at.After(time.Now().Add(time.Second)) {
		t.Fatalf("published %v on %s", &ev, m.Subject)
	}
	s := ev.GetSpec()
	if s.GetGpuCount() != 2 || s.GetInterconnect() != shizuv1.Interconnect_INTERCONNECT_NVLINK || s.GetPlan() != shizuv1.Plan_PLAN_SPOT ||
		s.GetMaxSpotPricePerGpuHour().GetMicros() != 1200000 || s.GetLabels()["team"] != "ml" || s.GetPendingTimeout().AsDuration() != 30*time.Minute ||
		s.GetPriority() != 100 || len(s.GetCommand()) != 2 {
		t.Fatalf("spec %v", s)
	}
}

func TestAReadOnlyKeyReadsButCannotChangeAndAnOperatorKeyIsNotATenants(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1, testOptions())
	rw := h.tenant("acme", identity.ReadWrite)
	ro := h.key("acme", identity.ReadOnly)
	op := h.key("", identity.Operator)
	id := h.create(rw)
	h.projected(rw, id)
	for _, c := range []struct {
		name, method, path, key string
		want                    int
	}{
		{"read-only lists", "GET", "/v1/rentals", ro, 200},
		{"read-only gets", "GET", "/v1/rentals/" + id, ro, 200},
		{"read-only creates", "POST", "/v1/rentals", ro, 403},
		{"read-only stops", "POST", "/v1/rentals/" + id + "/stop", ro, 403},
		{"operator lists a tenant's rentals", "GET", "/v1/rentals", op, 403},
		{"operator creates", "POST", "/v1/rentals", op, 403},
		{"no key", "GET", "/v1/rentals", "", 401},
		{"a made-up key", "GET", "/v1/rentals", "shz_000000000000_" + "00000000000000000000000000000000000000000000000z", 401},
	} {
		var body any
		if c.method == "POST" {
			body = map[string]any{}
		}
		if a := h.do(req{method: c.method, path: c.path, key: c.key, body: body}); a.Status != c.want {
			t.Errorf("%s: %d %s, want %d", c.name, a.Status, a.Body, c.want)
		}
	}
	if n := h.count("RENTALS", "rental.acme.requested"); n != 1 {
		t.Fatalf("%d requests published, want the read-write key's one", n)
	}
}

// With tenant A's key, B's rental does not exist: get, stop and events
// are 404, the list never shows it, and nothing A sends is B's.
func TestCrossTenantCallsSeeNothingOfAnotherTenant(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1, testOptions())
	a := h.tenant("tenant-a", identity.ReadWrite)
	b := h.tenant("tenant-b", identity.ReadWrite)
	bid := h.create(b)
	h.projected(b, bid)
	aid := h.create(a)
	h.projected(a, aid)
	for _, c := range []struct{ method, path string }{
		{"GET", "/v1/rentals/" + bid}, {"POST", "/v1/rentals/" + bid + "/stop"}, {"GET", "/v1/rentals/" + bid + "/events"},
	} {
		if got := h.do(req{method: c.method, path: c.path, key: a}); got.Status != http.StatusNotFound {
			t.Errorf("A: %s %s = %d %s, want 404", c.method, c.path, got.Status, got.Body)
		}
	}
	if n := h.count("RENTALS", "rental.tenant-b.cancel_requested"); n != 0 {
		t.Fatalf("A's stop of B's rental published %d cancel requests", n)
	}
	var list struct{ Rentals []rentalDoc }
	h.do(req{method: "GET", path: "/v1/rentals", key: a}).json(t, &list)
	if len(list.Rentals) != 1 || list.Rentals[0].ID != aid {
		t.Fatalf("A's list: %+v", list.Rentals)
	}
	// The body cannot name a tenant (closed schema) ...
	got := h.do(req{method: "POST", path: "/v1/rentals", key: a, body: map[string]any{"tenant_id": "tenant-b"}})
	if p := got.problem(t); got.Status != http.StatusBadRequest || !p.names("tenant_id") {
		t.Fatalf("a body naming a tenant: %d %s", got.Status, got.Body)
	}
	// ... and every request of A's is on A's subject with A in the body.
	if n := h.count("RENTALS", "rental.tenant-b.requested"); n != 1 {
		t.Fatalf("B has %d requests, want its own one", n)
	}
	var ev shizuv1.RentalRequested
	h.last("RENTALS", "rental.tenant-a.requested", &ev)
	if ev.GetTenantId() != "tenant-a" || ev.GetRentalId() != aid {
		t.Fatalf("A's request: %v", &ev)
	}
}

func TestARevokedKeyIsRefusedByAnotherReplicaWithinASecond(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 2, testOptions())
	key := h.tenant("acme", identity.ReadOnly)
	if a := h.do(req{method: "GET", path: "/v1/rentals", key: key, replica: 1}); a.Status != http.StatusOK {
		t.Fatalf("before revoking: %d %s", a.Status, a.Body)
	}
	k, err := h.gws[0].Identity().Authenticate(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.gws[0].Identity().RevokeKey(t.Context(), k.ID); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, time.Second, func() error {
		if a := h.do(req{method: "GET", path: "/v1/rentals", key: key, replica: 1}); a.Status != http.StatusUnauthorized {
			return errStatus(a)
		}
		return nil
	})
}

func TestAnIdempotencyKeyReplayReturnsTheFirstAnswerAndCreatesNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 2, testOptions())
	key := h.tenant("acme", identity.ReadWrite)
	body := map[string]any{"gpu_count": 1, "labels": map[string]string{"run": "7"}}
	idem := map[string]string{"Idempotency-Key": "run-7-attempt"}
	first := h.do(req{method: "POST", path: "/v1/rentals", key: key, body: body, header: idem})
	if first.Status != http.StatusCreated {
		t.Fatalf("first: %d %s", first.Status, first.Body)
	}
	for replica := range 2 { // either replica answers a retry the same
		again := h.do(req{method: "POST", path: "/v1/rentals", key: key, body: body, header: idem, replica: replica})
		if again.Status != first.Status || string(again.Body) != string(first.Body) {
			t.Fatalf("replay on replica %d: %d %s\nfirst: %s", replica, again.Status, again.Body, first.Body)
		}
	}
	if n := h.count("RENTALS", "rental.acme.requested"); n != 1 {
		t.Fatalf("%d requests published, want 1", n)
	}
	other := h.do(req{method: "POST", path: "/v1/rentals", key: key, body: map[string]any{"gpu_count": 2}, header: idem})
	if p := other.problem(t); other.Status != http.StatusUnprocessableEntity || !p.names("header Idempotency-Key") {
		t.Fatalf("the same key with another body: %d %s", other.Status, other.Body)
	}
	// Another tenant's same key is its own.
	beta := h.tenant("beta", identity.ReadWrite)
	if got := h.do(req{method: "POST", path: "/v1/rentals", key: beta, body: body, header: idem}); got.Status != http.StatusCreated || string(got.Body) == string(first.Body) {
		t.Fatalf("beta with acme's idempotency key: %d %s", got.Status, got.Body)
	}
	if n := h.count("RENTALS", "rental.acme.requested"); n != 1 {
		t.Fatalf("%d acme requests published, want 1", n)
	}
}

func TestABurstPastTheKeysRateLimitGets429WithRetryAfter(t *testing.T) {
	t.Parallel()
	opts := testOptions()
	opts.RatePerSecond, opts.RateBurst = 0.5, 5
	h := newHarness(t, 1, opts)
	key := h.tenant("acme", identity.ReadOnly)
	other := h.key("acme", identity.ReadOnly)
	for i := range 5 {
		if a := h.do(req{method: "GET", path: "/v1/rentals", key: key}); a.Status != http.StatusOK {
			t.Fatalf("call %d of the burst: %d %s", i+1, a.Status, a.Body)
		}
	}
	a := h.do(req{method: "GET", path: "/v1/rentals", key: key})
	secs, err := strconv.Atoi(a.Header.Get("Retry-After"))
	if p := a.problem(t); a.Status != http.StatusTooManyRequests || err != nil || secs < 1 || secs > 2 || p.Status != 429 {
		t.Fatalf("past the burst: %d, Retry-After %q, %s", a.Status, a.Header.Get("Retry-After"), a.Body)
	}
	if a := h.do(req{method: "GET", path: "/v1/rentals", key: other}); a.Status != http.StatusOK {
		t.Fatalf("another key of the tenant: %d, want its own limit", a.Status)
	}
}

func TestEveryStateChangingCallIsAudited(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1, testOptions())
	key := h.tenant("acme", identity.ReadWrite)
	k, _ := h.gws[0].Identity().Authenticate(t.Context(), key)
	id := h.create(key)
	h.projected(key, id)
	stop := h.do(req{method: "POST", path: "/v1/rentals/" + id + "/stop", key: key, body: map[string]any{"reason": "done"},
		header: map[string]string{"X-Request-Id": "stop-1"}})
	if stop.Status != http.StatusAccepted {
		t.Fatalf("stop: %d %s", stop.Status, stop.Body)
	}
	h.do(req{method: "POST", path: "/v1/rentals", key: key, body: map[string]any{"gpu_count": 99}})
	type record struct {
		KeyID     string `json:"key_id"`
		Tenant    string `json:"tenant_id"`
		Action    string
		Method    string
		Route     string
		RentalID  string `json:"rental_id"`
		Status    int
		Remote    string `json:"remote_addr"`
		RequestID string `json:"request_id"`
		At        time.Time
	}
	read := func(subj string) record {
		var r record
		if err := json.Unmarshal(h.last("AUDIT", subj, nil).Data, &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		if h.count("AUDIT", "audit.acme.rental_stop") != 1 || h.count("AUDIT", "audit.acme.rental_create") != 2 {
			return errStatus(answer{})
		}
		return nil
	})
	s := read("audit.acme.rental_stop")
	if s.KeyID != k.ID || s.Tenant != "acme" || s.Method != "POST" || s.Route != "/v1/rentals/{rental_id}/stop" || s.RentalID != id ||
		s.Status != http.StatusAccepted || s.Remote == "" || s.RequestID != "stop-1" || s.At.IsZero() {
		t.Fatalf("stop's record: %+v", s)
	}
	if c := read("audit.acme.rental_create"); c.Status != http.StatusBadRequest || c.KeyID != k.ID {
		t.Fatalf("the refused create's record: %+v", c)
	}
	if n := h.count("AUDIT", "audit.acme.rental_list"); n != 0 {
		t.Fatalf("a read was audited")
	}
	var cancel shizuv1.RentalCancelRequested
	h.last("RENTALS", "rental.acme.cancel_requested", &cancel)
	if cancel.GetTenantId() != "acme" || cancel.GetRentalId() != id || cancel.GetReason() != "done" {
		t.Fatalf("cancel: %v", &cancel)
	}
}

func TestConcurrentRetriesWithOneIdempotencyKeyMakeOneRental(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 2, testOptions())
	key := h.tenant("acme", identity.ReadWrite)
	const n = 6
	answers := make(chan answer, n)
	for i := range n {
		go func() {
			hr, _ := http.NewRequestWithContext(t.Context(), "POST", h.urls[i%2]+"/v1/rentals", strings.NewReader(`{"gpu_count":1}`))
			hr.Header.Set("Content-Type", "application/json")
			hr.Header.Set("Authorization", "Bearer "+key)
			hr.Header.Set("Idempotency-Key", "once")
			resp, err := http.DefaultClient.Do(hr)
			if err != nil {
				answers <- answer{}
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			answers <- answer{Status: resp.StatusCode, Header: resp.Header, Body: b}
		}()
	}
	var created []string
	for range n {
		a := <-answers
		if err := h.validate("POST", "/v1/rentals", a); err != nil {
			t.Fatalf("%d %s: %v", a.Status, a.Body, err)
		}
		switch a.Status {
		case http.StatusCreated:
			created = append(created, string(a.Body))
		case http.StatusConflict:
		default:
			t.Fatalf("a concurrent retry: %d %s", a.Status, a.Body)
		}
	}
	if len(created) == 0 || len(slices.Compact(slices.Clone(created))) != 1 {
		t.Fatalf("201 answers differ or none: %q", created)
	}
	if c := h.count("RENTALS", "rental.acme.requested"); c != 1 {
		t.Fatalf("%d rentals requested by %d concurrent retries, want 1", c, n)
	}
}

func TestAnOperatorEndpointRefusesTenantKeys(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1, testOptions())
	h.gws[0].OperatorOnly("GET /v1/rentals")
	rw := h.tenant("acme", identity.ReadWrite)
	op := h.key("", identity.Operator)
	if a := h.do(req{method: "GET", path: "/v1/rentals", key: rw}); a.Status != http.StatusForbidden || !strings.Contains(a.problem(t).Detail, "operator key") {
		t.Fatalf("a tenant key on an operator endpoint: %d %s", a.Status, a.Body)
	}
	if a := h.do(req{method: "GET", path: "/v1/rentals", key: op}); a.Status != http.StatusOK {
		t.Fatalf("an operator key on an operator endpoint: %d %s", a.Status, a.Body)
	}
}
