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
	got    []delivery
	bad    []string
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
