package app_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/gateway/identity"
	"github.com/shizu-gpu/shizu/shared/topology"
)

type poolDoc struct {
	Pool      string         `json:"pool"`
	PoolID    string         `json:"pool_id"`
	State     string         `json:"state"`
	Policy    map[string]any `json:"policy"`
	Replicas  *int32         `json:"replicas"`
	Decisions []struct {
		To   int32  `json:"to_replicas"`
		Rule string `json:"rule"`
	} `json:"decisions"`
}

func chatPool() map[string]any {
	return map[string]any{"pool": "chat", "rental": map[string]any{"gpu_count": 1, "milli_gpu": 1000}, "min_replicas": 1, "max_replicas": 4,
		"max_step_out": 2, "max_step_in": 1, "scale_out_cooldown": "30s", "scale_in_cooldown": "2m",
		"thresholds": []any{map[string]any{"name": "rps-high", "metric": "requests_per_second_per_replica", "scale_out_above": 100, "scale_in_below": 20, "step": 1}}}
}

func (h *harness) pools(key string) []poolDoc {
	h.t.Helper()
	a := h.do(req{method: "GET", path: "/v1/pools", key: key})
	if a.Status != http.StatusOK {
		h.t.Fatalf("list pools: %d %s", a.Status, a.Body)
	}
	var l struct{ Pools []poolDoc }
	a.json(h.t, &l)
	return l.Pools
}

func TestPoolsAreDeclaredListedSampledAndWithdrawnInTheTenantsNamespaceOnly(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1, testOptions())
	a := h.tenant("acme", identity.ReadWrite)
	b := h.tenant("bravo", identity.ReadWrite)
	got := h.do(req{method: "POST", path: "/v1/pools", key: a, body: chatPool()})
	if got.Status != http.StatusAccepted {
		t.Fatalf("declare: %d %s", got.Status, got.Body)
	}
	var ev shizuv1.PoolDeclared
	h.last(topology.StreamScaling, "scale.acme_chat.declared", &ev)
	var policy map[string]any
	if err := json.Unmarshal(ev.GetPolicyJson(), &policy); err != nil {
		t.Fatal(err)
	}
	if ev.GetTenantId() != "acme" || ev.GetPoolId() != "acme_chat" || policy["id"] != "acme_chat" || policy["tenant"] != "acme" || policy["pool"] != nil {
		t.Fatalf("declared %+v with policy %v; want acme's pool acme_chat", &ev, policy)
	}
	// Bravo declares a pool of the same name: its own, not acme's.
	if got := h.do(req{method: "POST", path: "/v1/pools", key: b, body: chatPool()}); got.Status != http.StatusAccepted {
		t.Fatalf("bravo declares: %d %s", got.Status, got.Body)
	}
	h.publish("scale.%s.decided", "acme_chat", &shizuv1.ScalingDecided{Meta: shizuv1.NewMeta("d1", "autoscaler", "", "acme_chat", time.Now()),
		PoolId: "acme_chat", FromReplicas: 1, ToReplicas: 3, Rule: "rps-high", Metric: "requests_per_second_per_replica", ObservedValue: 240, Threshold: 100})
	ps := h.pools(a)
	if len(ps) != 1 || ps[0].Pool != "chat" || ps[0].PoolID != "acme_chat" || ps[0].Replicas == nil || *ps[0].Replicas != 3 ||
		len(ps[0].Decisions) != 1 || ps[0].Decisions[0].Rule != "rps-high" || ps[0].Policy["max_replicas"] != 4.0 {
		t.Fatalf("acme's pools: %+v", ps)
	}
	if ps := h.pools(b); len(ps) != 1 || ps[0].PoolID != "bravo_chat" || len(ps[0].Decisions) != 0 {
		t.Fatalf("bravo's pools: %+v, want its own chat without acme's decision", ps)
	}

	sample := map[string]any{"requests_per_second": 2400, "concurrent_requests": 600, "p99_latency": "85ms"}
	if got := h.do(req{method: "POST", path: "/v1/pools/chat/traffic", key: a, body: sample}); got.Status != http.StatusAccepted {
		t.Fatalf("traffic: %d %s", got.Status, got.Body)
	}
	var ts shizuv1.TrafficSampled
	h.last(topology.StreamTraffic, "traffic.acme_chat.sample", &ts)
	if ts.GetPoolId() != "acme_chat" || ts.GetRequestsPerSecond() != 2400 || ts.GetP99Latency().AsDuration() != 85*time.Millisecond || ts.GetWindow().AsDuration() != 10*time.Second {
		t.Fatalf("sample %+v", &ts)
	}
	for _, r := range []req{{method: "POST", path: "/v1/pools/other/traffic", key: a, body: sample}, {method: "DELETE", path: "/v1/pools/other", key: a}} {
		if got := h.do(r); got.Status != http.StatusNotFound {
			t.Fatalf("%s %s of a pool never declared: %d %s, want 404", r.method, r.path, got.Status, got.Body)
		}
	}
	if got := h.do(req{method: "DELETE", path: "/v1/pools/chat", key: a}); got.Status != http.StatusAccepted {
		t.Fatalf("withdraw: %d %s", got.Status, got.Body)
	}
	h.last(topology.StreamScaling, "scale.acme_chat.declared", &ev)
	if !ev.GetWithdrawn() || ev.GetTenantId() != "acme" {
		t.Fatalf("withdrawal %+v", &ev)
	}
	if ps := h.pools(a); len(ps) != 0 {
		t.Fatalf("after the withdrawal: %+v", ps)
	}
	if got := h.do(req{method: "DELETE", path: "/v1/pools/chat", key: a}); got.Status != http.StatusNotFound {
		t.Fatalf("withdraw twice: %d, want 404", got.Status)
	}
	if ps := h.pools(b); len(ps) != 1 {
		t.Fatalf("acme's withdrawal touched bravo's pool: %+v", ps)
	}
}

func TestPoolCallsCheckTheBodyTheKeyAndReplayAnIdempotencyKey(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1, testOptions())
	rw := h.tenant("acme", identity.ReadWrite)
	ro := h.key("acme", identity.ReadOnly)
	op := h.key("", identity.Operator)
	bad := chatPool()
	bad["tenant"] = "victim"
	if got := h.do(req{method: "POST", path: "/v1/pools", key: rw, body: bad}); got.Status != http.StatusBadRequest || !got.problem(t).names("tenant") {
		t.Fatalf("a body naming a tenant: %d %s, want 400 naming tenant", got.Status, got.Body)
	}
	if got := h.do(req{method: "POST", path: "/v1/pools", key: ro, body: chatPool()}); got.Status != http.StatusForbidden {
		t.Fatalf("a read-only key: %d, want 403", got.Status)
	}
	if got := h.do(req{method: "GET", path: "/v1/pools", key: op}); got.Status != http.StatusForbidden {
		t.Fatalf("an operator key: %d, want 403", got.Status)
	}
	if got := h.do(req{method: "POST", path: "/v1/pools", key: rw, body: chatPool()}); got.Status != http.StatusAccepted {
		t.Fatalf("declare: %d %s", got.Status, got.Body)
	}
	if got := h.do(req{method: "POST", path: "/v1/pools/chat/traffic", key: rw, body: map[string]any{"requests_per_second": 1, "window": "soon"}}); got.Status != http.StatusBadRequest || !got.problem(t).names("window") {
		t.Fatalf("a bad window: %d %s, want 400 naming the window", got.Status, got.Body)
	}
	idem := map[string]string{"Idempotency-Key": "sample-1"}
	for range 2 {
		if got := h.do(req{method: "POST", path: "/v1/pools/chat/traffic", key: rw, body: map[string]any{"requests_per_second": 5}, header: idem}); got.Status != http.StatusAccepted {
			t.Fatalf("traffic: %d %s", got.Status, got.Body)
		}
	}
	if n := h.count(topology.StreamTraffic, "traffic.acme_chat.sample"); n != 1 {
		t.Fatalf("%d samples after a replay, want 1", n)
	}
}
