package placement

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/shizu-gpu/shizu/shared/gpumodel"
	"github.com/shizu-gpu/shizu/shared/rent"
)

// Model is what the scheduler knows about a GPU model.
type Model struct {
	Name    string
	VRAMMiB int64
	// Capabilities are tokens a request may require ("fp8", "rt-cores",
	// "tf32", "mig", ...).
	Capabilities []string
	// MemoryBandwidthGBps is matched by a required capability
	// "membw-<GB/s>" (at least that much).
	MemoryBandwidthGBps int
}

// Catalogue maps model names to what they can do.
type Catalogue map[string]Model

// DefaultCatalogue lists the models Shizu rents (shared/gpumodel, the
// tokens node agents report) and the models of the Alibaba GPU trace (G2,
// G3, T4, P100, V100M16, V100M32, A10).
func DefaultCatalogue() Catalogue {
	c := Catalogue{}
	for _, m := range gpumodel.All() {
		c[m.Token] = Model{Name: m.Token, VRAMMiB: m.VRAMMiB, Capabilities: m.Capabilities, MemoryBandwidthGBps: m.MemoryBandwidthGBps}
	}
	for _, m := range []Model{
		{"A10", 24 * 1024, []string{"tf32", "bf16", "rt-cores"}, 600},
		{"T4", 16 * 1024, []string{"rt-cores"}, 320},
		{"V100M16", 16 * 1024, []string{"nvlink"}, 900},
		{"V100M32", 32 * 1024, []string{"nvlink"}, 900},
		{"P100", 16 * 1024, []string{"nvlink"}, 732},
		{"G2", 32 * 1024, []string{"tf32"}, 900},
		{"G3", 32 * 1024, []string{"tf32"}, 900},
	} {
		c[m.Name] = m
	}
	return c
}

// MaxVRAMMiB is the most VRAM any catalogued model has.
func (c Catalogue) MaxVRAMMiB() int64 {
	var v int64
	for _, m := range c {
		v = max(v, m.VRAMMiB)
	}
	return v
}

// Has reports whether model m has capability cap.
func (c Catalogue) Has(model, capability string) bool {
	m, ok := c[model]
	if !ok {
		return false
	}
	if bw, ok := strings.CutPrefix(capability, "membw-"); ok {
		want, err := strconv.Atoi(bw)
		return err == nil && m.MemoryBandwidthGBps >= want
	}
	return slices.Contains(m.Capabilities, capability)
}

// knownCapability reports whether any model could satisfy capability.
func (c Catalogue) knownCapability(capability string) bool {
	for name := range c {
		if c.Has(name, capability) {
			return true
		}
	}
	return false
}

// MIGProfile is a Multi-Instance GPU slice: compute slices out of 7 and
// memory.
type MIGProfile struct {
	Name    string
	Slices  int
	VRAMMiB int64
}

// MIGSlicesPerGPU is the number of compute slices of a MIG-capable GPU.
const MIGSlicesPerGPU = 7

// ParseMIGProfile reads "<n>g.<m>gb" (n in 1, 2, 3, 4, 7).
func ParseMIGProfile(name string) (MIGProfile, bool) {
	g, mem, ok := strings.Cut(name, "g.")
	if !ok || !strings.HasSuffix(mem, "gb") {
		return MIGProfile{}, false
	}
	slices, err1 := strconv.Atoi(g)
	gb, err2 := strconv.Atoi(strings.TrimSuffix(mem, "gb"))
	if err1 != nil || err2 != nil || gb <= 0 {
		return MIGProfile{}, false
	}
	switch slices {
	case 1, 2, 3, 4, 7:
	default:
		return MIGProfile{}, false
	}
	return MIGProfile{Name: name, Slices: slices, VRAMMiB: int64(gb) * 1024}, true
}

// Milli is the milli-GPU a MIG slice takes in the capacity books: its share
// of the 7 compute slices, rounded down so 7 one-slice instances fit.
func (p MIGProfile) Milli() int64 {
	if p.Slices >= MIGSlicesPerGPU {
		return MilliPerGPU
	}
	return int64(p.Slices) * MilliPerGPU / MIGSlicesPerGPU
}

// Problem is one reason a request is invalid.
type Problem struct {
	Field, Message string
}

func (p Problem) String() string { return p.Field + ": " + p.Message }

// InvalidError lists every problem with a request; such a request is
// rejected at once.
type InvalidError struct{ Problems []Problem }

func (e *InvalidError) Error() string {
	parts := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		parts[i] = p.String()
	}
	return "invalid request: " + strings.Join(parts, "; ")
}

// Validate checks a request against the catalogue: it must ask for
// something, in range, of models and capabilities that exist. A request
// with no GPU but some CPU is a CPU-only task: rentals always ask for GPUs,
// but the trace replay places CPU-only tasks too, since they take host CPU
// and count in the fragmentation measure. It returns an
// *InvalidError naming every problem, or nil.
func (r *Request) Validate(c Catalogue) error {
	var ps []Problem
	add := func(field, format string, args ...any) {
		ps = append(ps, Problem{field, fmt.Sprintf(format, args...)})
	}
	if r.ID == "" {
		add("id", "missing")
	}
	if r.Class < rent.ClassSpot || r.Class > rent.ClassReserved {
		add("class", "unknown class %d", r.Class)
	}
	switch {
	case r.GPUCount < 0:
		add("gpu_count", "must not be negative, got %d", r.GPUCount)
	case r.GPUCount == 0 && r.CPUMilli <= 0:
		add("gpu_count", "asks for no GPU and no CPU; a rental must ask for something")
	case r.GPUCount == 0 && (r.MilliPerGPU != 0 || r.VRAMMiB != 0 || r.NVLink || r.MIGProfile != ""):
		add("gpu_count", "a CPU-only task (no GPU) cannot ask for milli-GPU, VRAM, NVLink or MIG")
	case r.GPUCount == 0:
		// a CPU-only task
	case r.MilliPerGPU <= 0 || r.MilliPerGPU > MilliPerGPU:
		add("milli_gpu", "%d is out of range 1..%d", r.MilliPerGPU, MilliPerGPU)
	case r.MilliPerGPU < MilliPerGPU && r.GPUCount > 1:
		add("milli_gpu", "%d is a fraction of a GPU, allowed only with one GPU (got %d)", r.MilliPerGPU, r.GPUCount)
	}
	for _, q := range []struct {
		field string
		v     int64
	}{{"vram_mib", r.VRAMMiB}, {"cpu_milli", r.CPUMilli}, {"memory_mib", r.MemoryMiB}} {
		if q.v < 0 {
			add(q.field, "must not be negative, got %d", q.v)
		}
	}
	if r.Priority < 0 {
		add("priority", "must not be negative, got %d", r.Priority)
	}
	maxVRAM := c.MaxVRAMMiB()
	if len(r.Models) > 0 {
		maxVRAM = 0
		for _, m := range r.Models {
			mod, ok := c[m]
			if !ok {
				add("allowed_models", "unknown model %q", m)
				continue
			}
			maxVRAM = max(maxVRAM, mod.VRAMMiB)
		}
	}
	if r.VRAMMiB > maxVRAM && maxVRAM > 0 {
		add("vram_mib", "%d MiB per GPU is more than any allowed model has (%d MiB)", r.VRAMMiB, maxVRAM)
	}
	for _, capability := range r.Capabilities {
		if !c.knownCapability(capability) {
			add("required_capabilities", "no model has %q", capability)
		}
	}
	if r.MIGProfile != "" {
		prof, ok := ParseMIGProfile(r.MIGProfile)
		switch {
		case !ok:
			add("mig_profile", "%q is not a MIG profile like 1g.10gb", r.MIGProfile)
		case r.GPUCount != 1 || r.MilliPerGPU != MilliPerGPU || r.NVLink:
			add("mig_profile", "a MIG rental is one whole MIG instance: one GPU, milli_gpu 1000, no NVLink")
		case prof.VRAMMiB > maxVRAM && maxVRAM > 0:
			add("mig_profile", "%q needs %d MiB, more than any allowed model has", r.MIGProfile, prof.VRAMMiB)
		}
	}
	if r.MaxSpotPrice.Known() && r.Class != rent.ClassSpot {
		add("max_spot_price", "set on a %s request; a maximum spot price is only for spot", r.Class)
	}
	if r.MaxSpotPrice.Micros < 0 {
		add("max_spot_price", "must not be negative, got %d", r.MaxSpotPrice.Micros)
	}
	if r.NVLink && r.GPUCount < 2 {
		add("interconnect", "NVLink needs at least two GPUs (got %d)", r.GPUCount)
	}
	if len(ps) == 0 {
		return nil
	}
	return &InvalidError{Problems: ps}
}
