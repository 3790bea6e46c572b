// Package pricing is Shizu's price catalogue: the instance types a tenant
// can rent, their list price per GPU-hour in integer micro-units of one
// currency, the facts tenants compare them on, and the rules that turn a
// rental's shape (whole GPUs, a milli-GPU fraction, a MIG slice) into a
// billable share. The catalogue is a declarative JSON file validated at load;
// every problem is reported with its path.
package pricing

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
)

// Money is an amount in integer micro-units of an ISO 4217 currency.
type Money struct {
	Micros   int64
	Currency string
}

func (m Money) String() string { return fmt.Sprintf("%d µ%s", m.Micros, m.Currency) }

// Proto converts m to the wire form.
func (m Money) Proto() *shizuv1.Money { return &shizuv1.Money{Micros: m.Micros, Currency: m.Currency} }

// FromProto converts the wire form; a nil message is the zero Money.
func FromProto(m *shizuv1.Money) Money {
	return Money{Micros: m.GetMicros(), Currency: m.GetCurrency()}
}

// MaxPriceMicros bounds every price per GPU-hour (10,000 currency units), so
// products of price, GPUs, milli-GPU and seconds stay inside 128-bit
// arithmetic with room to spare.
const MaxPriceMicros = 10_000_000_000

// Term is the length of a reserved commitment.
type Term string

// Commitment terms.
const (
	TermMonth Term = "month"
	TermYear  Term = "year"
)

// Reserved discounts must lie in this range (percent off list), as the
// founding text describes.
const (
	MinReservedDiscountPercent = 60
	MaxReservedDiscountPercent = 80
)

// InstanceType is one GPU model on offer.
type InstanceType struct {
	// Model is the normalized model token (Gpu.model), e.g. "H100-SXM5-80GB".
	Model   string `json:"model"`
	VRAMMiB int64  `json:"vram_mib"`
	// PricePerGPUHourMicros is the on-demand list price of one whole GPU for
	// one hour, in micro-units of the catalogue's currency.
	PricePerGPUHourMicros int64 `json:"price_per_gpu_hour_micros"`
	// SpotDefaultPerGPUHourMicros is the spot price of the model in a zone
	// before the first market price of that zone is known (1..list price);
	// 0 means the list price.
	SpotDefaultPerGPUHourMicros int64 `json:"spot_default_price_per_gpu_hour_micros,omitempty"`
	// Facts tenants compare on (not money, so plain numbers).
	BF16TFLOPS          float64 `json:"bf16_tflops"`
	FP32TFLOPS          float64 `json:"fp32_tflops"`
	MemoryBandwidthGBps int64   `json:"memory_bandwidth_gbps"`
	Interconnect        string  `json:"interconnect"`
	// MIGProfiles maps a MIG profile name to its billable share of the whole
	// GPU in milli-GPU (1..1000): "1g.10gb" on an 80 GB part is 143.
	MIGProfiles map[string]int32 `json:"mig_profiles,omitempty"`
}

// Catalogue is the validated price list.
type Catalogue struct {
	Currency string `json:"currency"`
	// ReservedDiscountPercent is the discount off list per commitment term.
	ReservedDiscountPercent map[Term]int64 `json:"reserved_discount_percent"`
	InstanceTypes           []InstanceType `json:"instance_types"`

	byModel map[string]*InstanceType
}

// Load reads and validates a catalogue file.
func Load(path string) (*Catalogue, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("price catalogue: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("price catalogue %s: %w", path, err)
	}
	return c, nil
}

// Parse decodes and validates a catalogue. Unknown fields are errors, so a
// misspelt key never silently falls back to a default.
func Parse(data []byte) (*Catalogue, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var c Catalogue
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	if err := c.init(); err != nil {
		return nil, err
	}
	return &c, nil
}

func (c *Catalogue) init() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if err := validCurrency(c.Currency); err != nil {
		add("currency: %w", err)
	}
	for _, term := range []Term{TermMonth, TermYear} {
		d, ok := c.ReservedDiscountPercent[term]
		switch {
		case !ok:
			add("reserved_discount_percent.%s: missing", term)
		case d < MinReservedDiscountPercent || d > MaxReservedDiscountPercent:
			add("reserved_discount_percent.%s: %d is outside %d..%d", term, d, MinReservedDiscountPercent, MaxReservedDiscountPercent)
		}
	}
	for term := range c.ReservedDiscountPercent {
		if term != TermMonth && term != TermYear {
			add("reserved_discount_percent.%s: unknown term (month or year)", term)
		}
	}
	if len(c.InstanceTypes) == 0 {
		add("instance_types: empty; the catalogue must offer at least one model")
	}
	c.byModel = make(map[string]*InstanceType, len(c.InstanceTypes))
	for i := range c.InstanceTypes {
		it := &c.InstanceTypes[i]
		path := fmt.Sprintf("instance_types[%d]", i)
		if err := shizuv1.ValidToken(it.Model); err != nil {
			add("%s.model: %w", path, err)
		} else if _, dup := c.byModel[it.Model]; dup {
			add("%s.model: %q is listed twice", path, it.Model)
		} else {
			c.byModel[it.Model] = it
		}
		if it.VRAMMiB <= 0 || it.VRAMMiB > shizuv1.MaxVRAMMiB {
			add("%s.vram_mib: %d is outside 1..%d", path, it.VRAMMiB, shizuv1.MaxVRAMMiB)
		}
		if it.PricePerGPUHourMicros <= 0 || it.PricePerGPUHourMicros > MaxPriceMicros {
			add("%s.price_per_gpu_hour_micros: %d is outside 1..%d", path, it.PricePerGPUHourMicros, int64(MaxPriceMicros))
		}
		if it.SpotDefaultPerGPUHourMicros < 0 || it.SpotDefaultPerGPUHourMicros > it.PricePerGPUHourMicros {
			add("%s.spot_default_price_per_gpu_hour_micros: %d is outside 1..%d (the list price)", path, it.SpotDefaultPerGPUHourMicros, it.PricePerGPUHourMicros)
		}
		if it.BF16TFLOPS < 0 || it.FP32TFLOPS < 0 || it.MemoryBandwidthGBps < 0 {
			add("%s: bf16_tflops, fp32_tflops and memory_bandwidth_gbps must not be negative", path)
		}
		for prof, milli := range it.MIGProfiles {
			if prof == "" {
				add("%s.mig_profiles: empty profile name", path)
			}
			if milli < 1 || milli > shizuv1.MilliGPUWhole {
				add("%s.mig_profiles[%q]: %d milli-GPU is outside 1..%d", path, prof, milli, shizuv1.MilliGPUWhole)
			}
		}
	}
	return errors.Join(errs...)
}

func validCurrency(s string) error {
	if len(s) != 3 {
		return fmt.Errorf("%q is not an ISO 4217 code (three uppercase letters)", s)
	}
	for _, r := range s {
		if r < 'A' || r > 'Z' {
			return fmt.Errorf("%q is not an ISO 4217 code (three uppercase letters)", s)
		}
	}
	return nil
}

// Models lists the offered models in name order.
func (c *Catalogue) Models() []string {
	out := make([]string, 0, len(c.byModel))
	for m := range c.byModel {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// ErrUnknownModel is returned for a model the catalogue does not offer.
var ErrUnknownModel = errors.New("unknown GPU model")

// Type returns the instance type of model.
func (c *Catalogue) Type(model string) (InstanceType, error) {
	it, ok := c.byModel[model]
	if !ok {
		return InstanceType{}, fmt.Errorf("%w %q (the catalogue offers %v)", ErrUnknownModel, model, c.Models())
	}
	return *it, nil
}

// OnDemand returns the list price of one whole GPU of model for one hour.
func (c *Catalogue) OnDemand(model string) (Money, error) {
	it, err := c.Type(model)
	if err != nil {
		return Money{}, err
	}
	return Money{Micros: it.PricePerGPUHourMicros, Currency: c.Currency}, nil
}

// SpotDefault returns the spot price of one whole GPU of model for one hour
// before any market price of a zone is known: the catalogue's spot default,
// or the list price when it names none.
func (c *Catalogue) SpotDefault(model string) (Money, error) {
	it, err := c.Type(model)
	if err != nil {
		return Money{}, err
	}
	if it.SpotDefaultPerGPUHourMicros > 0 {
		return Money{Micros: it.SpotDefaultPerGPUHourMicros, Currency: c.Currency}, nil
	}
	return Money{Micros: it.PricePerGPUHourMicros, Currency: c.Currency}, nil
}

// Reserved returns the reserved price per GPU-hour of model under a
// commitment term with the given discount (percent off list, within the
// allowed range; 0 means the catalogue's discount for the term). The
// discounted price is rounded half up to a whole micro-unit.
func (c *Catalogue) Reserved(model string, term Term, discountPercent int64) (Money, error) {
	list, err := c.OnDemand(model)
	if err != nil {
		return Money{}, err
	}
	if discountPercent == 0 {
		d, ok := c.ReservedDiscountPercent[term]
		if !ok {
			return Money{}, fmt.Errorf("unknown commitment term %q (month or year)", term)
		}
		discountPercent = d
	}
	if discountPercent < MinReservedDiscountPercent || discountPercent > MaxReservedDiscountPercent {
		return Money{}, fmt.Errorf("reserved discount %d%% is outside %d..%d%%", discountPercent, MinReservedDiscountPercent, MaxReservedDiscountPercent)
	}
	keep := 100 - discountPercent
	return Money{Micros: (list.Micros*keep + 50) / 100, Currency: list.Currency}, nil
}

// BillableMilli is the share of one GPU a rental is billed for: its
// milli-GPU fraction (pro rata), or for a MIG slice the profile's share as
// the catalogue lists it. A MIG profile the model does not list is an error.
func (c *Catalogue) BillableMilli(model, migProfile string, milliGPU int32) (int32, error) {
	it, err := c.Type(model)
	if err != nil {
		return 0, err
	}
	if migProfile != "" {
		share, ok := it.MIGProfiles[migProfile]
		if !ok {
			return 0, fmt.Errorf("model %q has no MIG profile %q in the catalogue", model, migProfile)
		}
		return share, nil
	}
	if milliGPU < 1 || milliGPU > shizuv1.MilliGPUWhole {
		return 0, fmt.Errorf("milli_gpu %d is outside 1..%d", milliGPU, shizuv1.MilliGPUWhole)
	}
	return milliGPU, nil
}

//go:embed catalogue.json
var shipped []byte

// ShippedFile is the shipped catalogue's file (pricing/catalogue.json), for
// a stack that hands the same prices to another process (shizu dev gives it
// to the gateway's -catalogue).
func ShippedFile() []byte { return append([]byte(nil), shipped...) }

// Shipped is the catalogue that ships with Shizu (pricing/catalogue.json),
// used when no catalogue file is configured.
func Shipped() (*Catalogue, error) {
	c, err := Parse(shipped)
	if err != nil {
		return nil, fmt.Errorf("shipped price catalogue: %w", err)
	}
	return c, nil
}
