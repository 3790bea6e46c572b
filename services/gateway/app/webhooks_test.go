package app_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/gateway/app"
	"github.com/shizu-gpu/shizu/services/gateway/identity"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

// receiver is a webhook endpoint that records what it is sent; fail
// answers 503 to that many first attempts.
type receiver struct {
	t      testing.TB
	srv    *httptest.Server
	mu     sync.Mutex
	secret string
	fail   int
	tries  int
	// refuse, when set, answers 500 to every attempt of a delivery it
	// says so of (counted in refused).
	refuse  func(delivery) bool
	refused int
	got     []delivery
	bad     []string
}

type delivery struct {
	ID     string
	Type   string `json:"type"`
	Tenant string `json:"tenant"`
	Rental struct {
		ID     string `json:"rental_id"`
		Tenant string `json:"tenant_id"`
		State  string `json:"state"`
	} `json:"rental"`
}

func newReceiver(t testing.TB, fail int) *receiver {
	rc := &receiver{t: t, fail: fail}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		defer rc.mu.Unlock()
		rc.tries++
		if rc.tries <= rc.fail {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		if !validSignature(rc.secret, r.Header.Get("Shizu-Signature"), body) {
			rc.bad = append(rc.bad, "bad signature "+r.Header.Get("Shizu-Signature"))
		}
		var d delivery
		if err := json.Unmarshal(body, &d); err != nil {
			rc.bad = append(rc.bad, err.Error())
		}
		d.ID = r.Header.Get("Shizu-Delivery-Id")
		if rc.refuse != nil && rc.refuse(d) {
			rc.refused++
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		rc.got = append(rc.got, d)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

// validSignature checks Shizu-Signature as docs/gateway.md tells receivers to.
func validSignature(secret, header string, body []byte) bool {
	var ts, sig string
	for _, part := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			sig = v
		}
	}
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts + "."))
	mac.Write(body)
	want := hex.EncodeToString(mac.Sum(nil))
	return ts != "" && hmac.Equal([]byte(sig), []byte(want))
}

func (rc *receiver) deliveries() []delivery {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.bad) > 0 {
		rc.t.Errorf("receiver: %v", rc.bad)
	}
	return append([]delivery(nil), rc.got...)
}

// states waits until the receiver has n deliveries and returns their types.
func (rc *receiver) states(n int) []string {
	rc.t.Helper()
	testkit.Eventually(rc.t, 10*time.Second, func() error {
		if got := len(rc.deliveries()); got < n {
			return fmt.Errorf("%d deliveries, want %d", got, n)
		}
		return nil
	})
	var out []string
	for _, d := range rc.deliveries() {
		out = append(out, d.Type)
	}
	return out
}

func webhookOptions() app.Options {
	o := testOptions()
	o.WebhookLoopback = true
	o.WebhookRetryInitial = 10 * time.Millisecond
	o.WebhookRetryFor = time.Minute
	return o
}

// register makes a webhook to rc for key and keeps its secret in rc.
func (h *harness) register(key string, rc *receiver, events ...string) string {
	h.t.Helper()
	body := map[string]any{"url": rc.srv.URL + "/hook"}
	if len(events) > 0 {
		body["events"] = events
	}
	a := h.do(req{method: "POST", path: "/v1/webhooks", key: key, body: body})
	if a.Status != http.StatusCreated {
		h.t.Fatalf("register: %d %s", a.Status, a.Body)
	}
	var out struct {
		ID     string `json:"webhook_id"`
		Secret string `json:"secret"`
	}
	a.json(h.t, &out)
	rc.mu.Lock()
	rc.secret = out.Secret
	rc.mu.Unlock()
	return out.ID
}

func (h *harness) reject(tenant, id string) {
	h.t.Helper()
	h.publish(subject.RentalRejected, tenant, &shizuv1.RentalRejected{
		Meta:     shizuv1.NewMeta("rental:"+id+":rejected", "scheduler", "", id, time.Now()),
		RentalId: id, TenantId: tenant, Reason: shizuv1.RejectReason_REJECT_REASON_UNSATISFIABLE, Message: "no node fits"})
}

func TestWebhookURLsAreCheckedAndListedWithoutSecrets(t *testing.T) {
	t.Parallel()
	o := testOptions()
	h := newHarness(t, 1, o)
	key := h.tenant("acme", identity.ReadWrite)
	for _, u := range []string{"http://127.0.0.1:9/x", "ftp://example.com/x", "not a url", "https://user:pw@example.com/"} {
		a := h.do(req{method: "POST", path: "/v1/webhooks", key: key, body: map[string]any{"url": u}})
		if a.Status != http.StatusBadRequest || !a.problem(t).names("url") {
			t.Errorf("url %q: %d %s; want 400 naming url", u, a.Status, a.Body)
		}
	}
	a := h.do(req{method: "POST", path: "/v1/webhooks", key: key, body: map[string]any{"url": "https://example.com/h", "events": []string{"sleeping"}}})
	if a.Status != http.StatusBadRequest || !a.problem(t).names("events.0") {
		t.Errorf("events [sleeping]: %d %s; want 400 naming events.0", a.Status, a.Body)
	}
	a = h.do(req{method: "POST", path: "/v1/webhooks", key: key, body: map[string]any{"url": "https://example.com/h"}})
	if a.Status != http.StatusCreated || !strings.Contains(string(a.Body), `"secret":"whsec_`) {
		t.Fatalf("create: %d %s", a.Status, a.Body)
	}
	l := h.do(req{method: "GET", path: "/v1/webhooks", key: key})
	if l.Status != http.StatusOK || strings.Contains(string(l.Body), "secret") || !strings.Contains(string(l.Body), "https://example.com/h") {
		t.Fatalf("list: %d %s", l.Status, l.Body)
	}
	other := h.tenant("bolt", identity.ReadWrite)
	if l := h.do(req{method: "GET", path: "/v1/webhooks", key: other}); string(l.Body) != "{\"webhooks\":[]}\n" {
		t.Fatalf("another tenant's list: %s", l.Body)
	}
}

// A rental's states arrive in order, signed; tenant B's webhook never
// sees A's rental; after the webhook is deleted nothing more arrives.
func TestWebhooksDeliverStatesInOrderToTheTenantOnly(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1, webhookOptions())
	a, b := h.tenant("acme", identity.ReadWrite), h.tenant("bolt", identity.ReadWrite)
	ra, rb := newReceiver(t, 0), newReceiver(t, 0)
	hookA := h.register(a, ra)
	h.register(b, rb)
	id := h.create(a)
	if got := ra.states(1); got[0] != "rental.requested" {
		t.Fatalf("first delivery %v, want rental.requested", got)
	}
	h.reject("acme", id)
	got := ra.states(2)
	if strings.Join(got, " ") != "rental.requested rental.rejected" {
		t.Fatalf("deliveries %v, want rental.requested then rental.rejected", got)
	}
	for _, d := range ra.deliveries() {
		if d.Tenant != "acme" || d.Rental.Tenant != "acme" || d.Rental.ID != id || d.ID == "" ||
			d.Type != "rental."+d.Rental.State {
			t.Errorf("delivery %+v", d)
		}
	}
	// B's own rental reaches B; none of A's ever did.
	idB := h.create(b)
	rb.states(1)
	for _, d := range rb.deliveries() {
		if d.Rental.ID != idB || d.Tenant != "bolt" {
			t.Fatalf("tenant bolt's webhook received %+v", d)
		}
	}
	if del := h.do(req{method: "DELETE", path: "/v1/webhooks/" + hookA, key: b}); del.Status != http.StatusNotFound {
		t.Fatalf("bolt deletes acme's webhook: %d, want 404", del.Status)
	}
	if del := h.do(req{method: "DELETE", path: "/v1/webhooks/" + hookA, key: a}); del.Status != http.StatusNoContent {
		t.Fatalf("delete: %d %s", del.Status, del.Body)
	}
	// A later rental of acme's is delivered to a second webhook (so it
	// was handled) but not to the deleted one.
	later := newReceiver(t, 0)
	h.register(a, later)
	id2 := h.create(a)
	later.states(1)
	for _, d := range ra.deliveries() {
		if d.Rental.ID == id2 {
			t.Fatalf("a deleted webhook received %+v", d)
		}
	}
}

// A receiver that answers 503 is retried until it takes the delivery;
// the filter leaves out states it did not ask for.
func TestWebhookDeliveriesAreRetriedAndFiltered(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1, webhookOptions())
	key := h.tenant("acme", identity.ReadWrite)
	rc := newReceiver(t, 3)
	h.register(key, rc, "rejected")
	id := h.create(key)
	h.projected(key, id)
	h.reject("acme", id)
	got := rc.states(1)
	if len(got) != 1 || got[0] != "rental.rejected" {
		t.Fatalf("deliveries %v, want one rental.rejected", got)
	}
	rc.mu.Lock()
	tries := rc.tries
	rc.mu.Unlock()
	if tries != 4 {
		t.Fatalf("%d attempts, want 3 refused and 1 taken", tries)
	}
}

// With two replicas each event is delivered once.
func TestWebhooksWithTwoReplicasDeliverEachEventOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 2, webhookOptions())
	key := h.tenant("acme", identity.ReadWrite)
	rc := newReceiver(t, 0)
	h.register(key, rc)
	var ids []string
	for i := range 6 {
		r := req{method: "POST", path: "/v1/rentals", key: key, body: map[string]any{"gpu_count": 1}, replica: i % 2}
		a := h.do(r)
		if a.Status != http.StatusCreated {
			t.Fatalf("create: %d %s", a.Status, a.Body)
		}
		var out struct {
			ID string `json:"rental_id"`
		}
		a.json(t, &out)
		ids = append(ids, out.ID)
	}
	rc.states(len(ids))
	for _, id := range ids {
		h.projected(key, id)
		h.reject("acme", id)
	}
	rc.states(2 * len(ids))
	// Anything more would have come by the time a further rental's
	// deliveries have.
	last := h.create(key)
	testkit.Eventually(t, 10*time.Second, func() error {
		for _, d := range rc.deliveries() {
			if d.Rental.ID == last {
				return nil
			}
		}
		return fmt.Errorf("no delivery of %s yet", last)
	})
	seen := map[string]int{}
	for _, d := range rc.deliveries() {
		seen[d.ID]++
		if seen[d.ID] > 1 {
			t.Errorf("delivery %s (%s of %s) came %d times", d.ID, d.Type, d.Rental.ID, seen[d.ID])
		}
	}
	if len(seen) != 2*len(ids)+1 {
		t.Fatalf("%d distinct deliveries, want %d", len(seen), 2*len(ids)+1)
	}
}

// A delivery its receiver keeps refusing is given up after the retry
// time, and the webhook's later deliveries still arrive.
func TestWebhookDeliveriesAreGivenUpAfterTheRetryTime(t *testing.T) {
	t.Parallel()
	o := webhookOptions()
	o.WebhookRetryFor = 300 * time.Millisecond
	h := newHarness(t, 1, o)
	key := h.tenant("acme", identity.ReadWrite)
	rc := newReceiver(t, 0)
	// The first rental it hears of is refused (refuse runs under rc.mu).
	var doomed string
	rc.refuse = func(d delivery) bool {
		if doomed == "" {
			doomed = d.Rental.ID
		}
		return d.Rental.ID == doomed
	}
	h.register(key, rc)
	id := h.create(key)
	testkit.Eventually(t, 10*time.Second, func() error {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		if rc.refused < 2 {
			return fmt.Errorf("%d refused attempts, want a retry", rc.refused)
		}
		return nil
	})
	rc.mu.Lock()
	if doomed != id {
		t.Fatalf("refused %q, want the first rental %s", doomed, id)
	}
	rc.mu.Unlock()
	next := h.create(key)
	got := rc.states(1)
	for _, d := range rc.deliveries() {
		if d.Rental.ID != next {
			t.Fatalf("deliveries %v: want only %s's (the refused one given up)", got, next)
		}
	}
}
