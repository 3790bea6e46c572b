package app

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"slices"

	"github.com/shizu-gpu/shizu/shared/gpumodel"
)

func modelRoutes(g *Gateway) []route {
	return []route{{method: http.MethodGet, path: "/v1/models", access: tenantRead, handle: g.listModels}}
}

// prices are the on-demand list prices of the price catalogue the gateway
// was given (Options.CataloguePath: the file metering is started with,
// services/metering/pricing's format); nil without one.
type prices struct {
	Currency string
	PerHour  map[string]int64
}

// loadPrices reads the currency and each instance type's list price from
// a price catalogue file; other fields are metering's and ignored here.
func loadPrices(path string) (*prices, error) {
	if path == "" {
		return nil, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("gateway.catalogue: %w", err)
	}
	var f struct {
		Currency      string `json:"currency"`
		InstanceTypes []struct {
			Model string `json:"model"`
			Price int64  `json:"price_per_gpu_hour_micros"`
		} `json:"instance_types"`
	}
	if err := json.NewDecoder(bytes.NewReader(data)).Decode(&f); err != nil {
		return nil, fmt.Errorf("gateway.catalogue %s: %w", path, err)
	}
	var errs []error
	if len(f.Currency) != 3 {
		errs = append(errs, fmt.Errorf("gateway.catalogue %s: currency %q is not an ISO 4217 code", path, f.Currency))
	}
	p := &prices{Currency: f.Currency, PerHour: map[string]int64{}}
	for i, it := range f.InstanceTypes {
		if _, ok := gpumodel.Lookup(it.Model); !ok {
			errs = append(errs, fmt.Errorf("gateway.catalogue %s: instance_types[%d].model %q is not a known GPU model", path, i, it.Model))
		}
		if it.Price <= 0 {
			errs = append(errs, fmt.Errorf("gateway.catalogue %s: instance_types[%d].price_per_gpu_hour_micros %d must be positive", path, i, it.Price))
		}
		p.PerHour[it.Model] = it.Price
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return p, nil
}

// modelBody is the API's GPUModel.
type modelBody struct {
	Model               string     `json:"model"`
	VRAMMiB             int64      `json:"vram_mib"`
	BF16TFLOPS          float64    `json:"bf16_tflops"`
	FP32TFLOPS          float64    `json:"fp32_tflops"`
	MemoryBandwidthGBps int        `json:"memory_bandwidth_gbps"`
	Interconnect        string     `json:"interconnect"`
	NVLink              bool       `json:"nvlink"`
	MIG                 bool       `json:"mig"`
	TEE                 bool       `json:"tee"`
	Capabilities        []string   `json:"capabilities"`
	Price               *priceBody `json:"on_demand_price,omitempty"`
}

// priceBody is the API's ModelPrice: micro-units of currency.
type priceBody struct {
	Currency    string  `json:"currency"`
	PerGPUHour  int64   `json:"per_gpu_hour_micros"`
	PerGPUSec   float64 `json:"per_gpu_second_micros"`
	PerTFLOPSHr float64 `json:"per_bf16_tflops_hour_micros"`
}

// listModels answers the GPU catalogue (shared/gpumodel), with each
// model's on-demand list price and price per BF16 TFLOPS-hour when the
// gateway was given the price catalogue.
func (g *Gateway) listModels(w http.ResponseWriter, _ *http.Request, _ *call) {
	out := struct {
		Models []modelBody `json:"models"`
	}{Models: []modelBody{}}
	for _, m := range gpumodel.All() {
		b := modelBody{Model: m.Token, VRAMMiB: m.VRAMMiB, BF16TFLOPS: m.BF16TFLOPS, FP32TFLOPS: m.FP32TFLOPS,
			MemoryBandwidthGBps: m.MemoryBandwidthGBps, Interconnect: m.Interconnect, NVLink: m.Has("nvlink"),
			MIG: m.Has("mig"), TEE: m.Has("cc"), Capabilities: slices.Clone(m.Capabilities)}
		if g.prices != nil {
			if per, ok := g.prices.PerHour[m.Token]; ok {
				b.Price = &priceBody{Currency: g.prices.Currency, PerGPUHour: per, PerGPUSec: round(float64(per) / 3600),
					PerTFLOPSHr: round(float64(per) / m.BF16TFLOPS)}
			}
		}
		out.Models = append(out.Models, b)
	}
	writeJSON(w, http.StatusOK, out)
}

// round keeps three decimals of a micro-unit amount.
func round(v float64) float64 { return math.Round(v*1000) / 1000 }
