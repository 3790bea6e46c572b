package app_test

import (
	"encoding/json"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/shizu-gpu/shizu/services/gateway/identity"
)

func TestTheServedDocumentIsTheCommittedFile(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1, testOptions())
	a := h.do(req{method: "GET", path: "/v1/openapi.json"})
	want, err := os.ReadFile("../api/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	if a.Status != http.StatusOK || string(a.Body) != string(want) {
		t.Fatalf("GET /v1/openapi.json: %d, %d bytes; want the committed file (%d bytes) byte for byte", a.Status, len(a.Body), len(want))
	}
}

func TestEveryRouteServedIsDocumentedAndEveryDocumentedRouteIsServed(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1, testOptions())
	var documented []string
	for path, item := range h.doc.Paths.Map() {
		for method := range item.Operations() {
			documented = append(documented, method+" "+path)
		}
	}
	served := h.gws[0].RouteKeys()
	slices.Sort(documented)
	slices.Sort(served)
	if !slices.Equal(documented, served) {
		t.Fatalf("documented %v\nserved     %v", documented, served)
	}
}

// The validator the other tests run every answer through refuses an
// answer with a field the document does not have, and one without a
// required field.
func TestTheResponseValidatorRefusesAnExtraAndAMissingField(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1, testOptions())
	key := h.tenant("acme", identity.ReadWrite)
	id := h.create(key)
	h.projected(key, id)
	good := h.do(req{method: "GET", path: "/v1/rentals/" + id, key: key})
	if good.Status != http.StatusOK {
		t.Fatalf("get: %d %s", good.Status, good.Body)
	}
	var doc map[string]any
	good.json(t, &doc)
	mutate := func(f func(map[string]any)) answer {
		m := map[string]any{}
		for k, v := range doc {
			m[k] = v
		}
		f(m)
		b, _ := json.Marshal(m)
		return answer{Status: good.Status, Header: good.Header, Body: b}
	}
	if err := h.validate("GET", "/v1/rentals/"+id, mutate(func(map[string]any) {})); err != nil {
		t.Fatalf("the unchanged answer fails validation: %v", err)
	}
	extra := mutate(func(m map[string]any) { m["seq"] = 7 })
	if err := h.validate("GET", "/v1/rentals/"+id, extra); err == nil || !strings.Contains(err.Error(), "seq") {
		t.Errorf("an answer with an extra field passed validation: %v", err)
	}
	if err := h.validate("GET", "/v1/rentals/"+id, answer{Status: good.Status, Header: good.Header}); err == nil {
		t.Error("an empty answer passed validation")
	}
	missing := mutate(func(m map[string]any) { delete(m, "state") })
	if err := h.validate("GET", "/v1/rentals/"+id, missing); err == nil || !strings.Contains(err.Error(), "state") {
		t.Errorf("an answer without a required field passed validation: %v", err)
	}
	p := h.do(req{method: "GET", path: "/v1/rentals/nope", key: key})
	var prob map[string]any
	p.json(t, &prob)
	prob["trace"] = "x"
	b, _ := json.Marshal(prob)
	if err := h.validate("GET", "/v1/rentals/nope", answer{Status: p.Status, Header: p.Header, Body: b}); err == nil {
		t.Error("a problem with an extra field passed validation")
	}
}

func TestRequestIdsAreEchoedAndInEveryProblemAndLogLine(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1, testOptions())
	a := h.do(req{method: "GET", path: "/v1/rentals", header: map[string]string{"X-Request-Id": "client-42"}})
	p := a.problem(t)
	if a.Status != http.StatusUnauthorized || a.Header.Get("X-Request-Id") != "client-42" || p.RequestID != "client-42" {
		t.Fatalf("%d, header %q, problem %+v", a.Status, a.Header.Get("X-Request-Id"), p)
	}
	a = h.do(req{method: "GET", path: "/v1/rentals"})
	if id := a.Header.Get("X-Request-Id"); !strings.HasPrefix(id, "req-") || a.problem(t).RequestID != id {
		t.Fatalf("generated request id %q, problem %s", id, a.Body)
	}
	if !strings.Contains(h.logs.String(), `"request_id":"client-42"`) {
		t.Fatalf("no log line names the request id: %s", h.logs.String())
	}
}

func TestBadInputGetsAProblemNamingTheField(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1, testOptions())
	key := h.tenant("acme", identity.ReadWrite)
	for _, c := range []struct {
		name  string
		body  any
		field string
	}{
		{"a tenant in the body", map[string]any{"gpu_count": 1, "tenant_id": "victim"}, "tenant_id"},
		{"a rental id in the body", map[string]any{"rental_id": "r-mine"}, "rental_id"},
		{"a request time in the body", map[string]any{"occurred_at": "2026-01-01T00:00:00Z"}, "occurred_at"},
		{"too many GPUs", map[string]any{"gpu_count": 65}, "gpu_count"},
		{"a plan that does not exist", map[string]any{"plan": "free"}, "plan"},
		{"a priority above the platform's bound", map[string]any{"priority": 500}, "priority"},
		{"nvlink with one GPU", map[string]any{"interconnect": "nvlink"}, "interconnect"},
		{"a fraction without memory", map[string]any{"milli_gpu": 250}, "vram_mib"},
		{"reserved without its model", map[string]any{"plan": "reserved"}, "allowed_models"},
		{"an unknown model", map[string]any{"allowed_models": []string{"Z9000"}}, "allowed_models.0"},
		{"a max price on demand", map[string]any{"max_spot_price_per_gpu_hour": map[string]any{"micros": 1, "currency": "USD"}}, "max_spot_price_per_gpu_hour"},
		{"a label value of the wrong type", map[string]any{"labels": map[string]any{"team": 7}}, "labels.team"},
	} {
		a := h.do(req{method: "POST", path: "/v1/rentals", key: key, body: c.body})
		p := a.problem(t)
		if a.Status != http.StatusBadRequest || !p.names(c.field) {
			t.Errorf("%s: %d %s; want 400 naming %s", c.name, a.Status, a.Body, c.field)
		}
		if strings.Contains(string(a.Body), "PLAN_") || strings.Contains(string(a.Body), "INTERCONNECT_") {
			t.Errorf("%s: the problem speaks in enum names: %s", c.name, a.Body)
		}
	}
	a := h.do(req{method: "POST", path: "/v1/rentals", key: key})
	if a.Status != http.StatusBadRequest || !a.problem(t).names("body") {
		t.Errorf("no body: %d %s", a.Status, a.Body)
	}
	a = h.do(req{method: "GET", path: "/v1/rentals", header: map[string]string{"Authorization": "bearer " + key}})
	if a.Status != http.StatusOK {
		t.Errorf("the scheme in lower case: %d %s", a.Status, a.Body)
	}
	a = h.do(req{method: "GET", path: "/v1/rentals?limit=5000", key: key})
	if p := a.problem(t); a.Status != http.StatusBadRequest || !p.names("query limit") {
		t.Errorf("limit 5000: %d %s", a.Status, a.Body)
	}
	a = h.do(req{method: "GET", path: "/v1/rentals?cursor=zz%20", key: key})
	if p := a.problem(t); a.Status != http.StatusBadRequest || !p.names("query cursor") {
		t.Errorf("a made-up cursor: %d %s", a.Status, a.Body)
	}
	a = h.do(req{method: "POST", path: "/v1/rentals", key: key, body: "gpu_count=1", header: map[string]string{"Content-Type": "text/plain"}})
	if a.Status != http.StatusUnsupportedMediaType {
		t.Errorf("a text body: %d %s", a.Status, a.Body)
	}
	a = h.do(req{method: "POST", path: "/v1/rentals", key: key, body: "{not json"})
	if a.Status != http.StatusBadRequest {
		t.Errorf("malformed JSON: %d %s", a.Status, a.Body)
	}
	if n := h.count("RENTALS", "rental.acme.requested"); n != 0 {
		t.Fatalf("bad requests published %d rental requests", n)
	}
}
