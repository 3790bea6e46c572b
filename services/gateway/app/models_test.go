package app_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shizu-gpu/shizu/services/gateway/app"
	"github.com/shizu-gpu/shizu/services/gateway/identity"
	"github.com/shizu-gpu/shizu/shared/gpumodel"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

type modelDoc struct {
	Model  string  `json:"model"`
	TFLOPS float64 `json:"bf16_tflops"`
	NVLink bool    `json:"nvlink"`
	TEE    bool    `json:"tee"`
	Price  *struct {
		Currency string  `json:"currency"`
		PerHour  int64   `json:"per_gpu_hour_micros"`
		PerSec   float64 `json:"per_gpu_second_micros"`
		PerPerf  float64 `json:"per_bf16_tflops_hour_micros"`
	} `json:"on_demand_price"`
}

func models(t *testing.T, h *harness, key string) map[string]modelDoc {
	t.Helper()
	a := h.do(req{method: "GET", path: "/v1/models", key: key})
	if a.Status != http.StatusOK {
		t.Fatalf("models: %d %s", a.Status, a.Body)
	}
	var l struct{ Models []modelDoc }
	a.json(t, &l)
	out := map[string]modelDoc{}
	for _, m := range l.Models {
		out[m.Model] = m
	}
	return out
}

func TestModelsListTheCatalogueWithThePricesOfTheCatalogueFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "catalogue.json")
	cat := `{"currency": "USD", "reserved_discount_percent": {"month": 60},
	  "instance_types": [{"model": "H100-SXM5-80GB", "vram_mib": 81559, "price_per_gpu_hour_micros": 2490000, "bf16_tflops": 989}]}`
	if err := os.WriteFile(path, []byte(cat), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := testOptions()
	opts.CataloguePath = path
	h := newHarness(t, 1, opts)
	key := h.tenant("acme", identity.ReadOnly)
	ms := models(t, h, key)
	if len(ms) != len(gpumodel.All()) {
		t.Fatalf("%d models, want the catalogue's %d", len(ms), len(gpumodel.All()))
	}
	h100 := ms[gpumodel.H100SXM80]
	if !h100.NVLink || !h100.TEE || h100.Price == nil || h100.Price.Currency != "USD" || h100.Price.PerHour != 2490000 ||
		h100.Price.PerSec != 691.667 || h100.Price.PerPerf != 2517.695 {
		t.Fatalf("H100: %+v %+v", h100, h100.Price)
	}
	if l4 := ms[gpumodel.L424]; l4.Price != nil || l4.NVLink || l4.TEE {
		t.Fatalf("L4 (not in the file): %+v, want no price", l4)
	}
	op := h.key("", identity.Operator)
	if a := h.do(req{method: "GET", path: "/v1/models", key: op}); a.Status != http.StatusForbidden {
		t.Fatalf("an operator key: %d", a.Status)
	}
}

func TestABadCatalogueFileIsRefusedNamingTheField(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "catalogue.json")
	if err := os.WriteFile(path, []byte(`{"currency": "USD", "instance_types": [{"model": "Z9000", "price_per_gpu_hour_micros": 0}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	conn := testkit.Platform(t).Connect(t, topology.Gateway)
	opts := testOptions()
	opts.CataloguePath = path
	_, err := app.Open(t.Context(), conn, opts, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "instance_types[0].model") || !strings.Contains(err.Error(), "instance_types[0].price_per_gpu_hour_micros") {
		t.Fatalf("Open with a bad catalogue: %v", err)
	}
}
