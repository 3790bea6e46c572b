// Package gpumodel is the one list of GPU models Shizu knows, keyed by the
// model token every service uses: the node agent derives it from the NVML
// product name and VRAM (services/node-agent/gpu.ModelToken), the scheduler
// matches requests against it, metering prices by it, and spot prices are
// published per model on spot.<zone>.<model>.price. A token is a NATS
// subject token: letters, digits and dashes, with the memory size.
package gpumodel

import (
	"slices"
	"sort"
)

// Tokens of the models Shizu rents.
const (
	H100SXM80  = "H100-SXM5-80GB"
	H100PCIe80 = "H100-PCIE-80GB"
	H200SXM141 = "H200-SXM5-141GB"
	A100SXM80  = "A100-SXM4-80GB"
	A100SXM40  = "A100-SXM4-40GB"
	A100PCIe40 = "A100-PCIE-40GB"
	L40S48     = "L40S-48GB"
	L424       = "L4-24GB"
	A1024      = "A10-24GB"
	RTX409024  = "RTX4090-24GB"
)

// Model is what users compare GPU models on and what placement matches.
type Model struct {
	Token   string
	VRAMMiB int64
	// Dense throughput, TFLOPS, without sparsity.
	BF16TFLOPS float64
	FP32TFLOPS float64
	// MemoryBandwidthGBps is HBM/GDDR bandwidth in GB/s.
	MemoryBandwidthGBps int
	// Interconnect between GPUs of one host, e.g. "nvlink4-900GBps", "pcie4".
	Interconnect string
	// Capabilities a rental may require: "bf16", "tf32", "fp8", "mig",
	// "rt-cores", "nvlink", "cc" (confidential computing).
	Capabilities []string
}

// Has reports whether m has capability c.
func (m Model) Has(c string) bool { return slices.Contains(m.Capabilities, c) }

var models = []Model{
	{H100SXM80, 80 * 1024, 989, 67, 3350, "nvlink4-900GBps", []string{"bf16", "tf32", "fp8", "mig", "nvlink", "cc"}},
	{H100PCIe80, 80 * 1024, 756, 51, 2000, "pcie5", []string{"bf16", "tf32", "fp8", "mig", "cc"}},
	{H200SXM141, 141 * 1024, 989, 67, 4800, "nvlink4-900GBps", []string{"bf16", "tf32", "fp8", "mig", "nvlink", "cc"}},
	{A100SXM80, 80 * 1024, 312, 19.5, 2039, "nvlink3-600GBps", []string{"bf16", "tf32", "mig", "nvlink"}},
	{A100SXM40, 40 * 1024, 312, 19.5, 1555, "nvlink3-600GBps", []string{"bf16", "tf32", "mig", "nvlink"}},
	{A100PCIe40, 40 * 1024, 312, 19.5, 1555, "nvlink3-bridge-pairs", []string{"bf16", "tf32", "mig", "nvlink"}},
	{L40S48, 48 * 1024, 362, 91.6, 864, "pcie4", []string{"bf16", "tf32", "fp8", "rt-cores"}},
	{L424, 24 * 1024, 121, 30.3, 300, "pcie4", []string{"bf16", "tf32", "fp8", "rt-cores"}},
	{A1024, 24 * 1024, 125, 31.2, 600, "pcie4", []string{"bf16", "tf32", "rt-cores"}},
	{RTX409024, 24 * 1024, 165, 82.6, 1008, "pcie4", []string{"bf16", "tf32", "fp8", "rt-cores"}},
}

// All returns every known model, sorted by token.
func All() []Model {
	out := slices.Clone(models)
	sort.Slice(out, func(i, j int) bool { return out[i].Token < out[j].Token })
	return out
}

// Lookup returns the model with the given token.
func Lookup(token string) (Model, bool) {
	for _, m := range models {
		if m.Token == token {
			return m, true
		}
	}
	return Model{}, false
}
