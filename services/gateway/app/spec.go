package app

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/gpumodel"
	"github.com/shizu-gpu/shizu/shared/rent"
)

// specBody is RentalSpec as the API takes it (api/openapi.json's
// RentalSpec): snake_case, people's words for enums. The tenant, the
// rental id and the request time are not in it: they are the platform's.
type specBody struct {
	GPUCount       *int32            `json:"gpu_count"`
	MilliGPU       *int32            `json:"milli_gpu"`
	VRAMMiB        int64             `json:"vram_mib"`
	AllowedModels  []string          `json:"allowed_models"`
	Interconnect   string            `json:"interconnect"`
	MIGProfile     string            `json:"mig_profile"`
	TEERequired    bool              `json:"tee_required"`
	Zone           string            `json:"zone"`
	Plan           string            `json:"plan"`
	MaxSpotPrice   *moneyBody        `json:"max_spot_price_per_gpu_hour"`
	Priority       int32             `json:"priority"`
	CPUMilli       int64             `json:"cpu_milli"`
	MemoryMiB      int64             `json:"memory_mib"`
	Capabilities   []string          `json:"required_capabilities"`
	Image          string            `json:"image"`
	Command        []string          `json:"command"`
	CheckpointURI  string            `json:"checkpoint_uri"`
	Labels         map[string]string `json:"labels"`
	PendingTimeout string            `json:"pending_timeout"`
}

type moneyBody struct {
	Micros   int64  `json:"micros"`
	Currency string `json:"currency"`
}

// proto turns the body into the event contract's spec, checking what the
// schema cannot say (in people's words) and the platform's bounds, then
// the contract's own validation.
func (b specBody) proto(maxPriority int32) (*shizuv1.RentalSpec, []fieldError) {
	var errs []fieldError
	bad := func(field, format string, args ...any) {
		errs = append(errs, fieldError{Field: field, Reason: fmt.Sprintf(format, args...)})
	}
	s := &shizuv1.RentalSpec{GpuCount: 1, MilliGpu: 1000, VramMib: b.VRAMMiB, AllowedModels: b.AllowedModels,
		MigProfile: b.MIGProfile, TeeRequired: b.TEERequired, Zone: b.Zone, Priority: b.Priority,
		CpuMilli: b.CPUMilli, MemoryMib: b.MemoryMiB, RequiredCapabilities: b.Capabilities, Image: b.Image,
		Command: b.Command, CheckpointUri: b.CheckpointURI, Labels: b.Labels, Plan: shizuv1.Plan_PLAN_ON_DEMAND}
	if b.GPUCount != nil {
		s.GpuCount = *b.GPUCount
	}
	if b.MilliGPU != nil {
		s.MilliGpu = *b.MilliGPU
	}
	if b.Plan != "" {
		p, err := rent.ParsePlan(b.Plan)
		if err != nil {
			bad("plan", "want on-demand, reserved or spot")
		}
		s.Plan = p
	}
	switch b.Interconnect {
	case "", "any":
		s.Interconnect = shizuv1.Interconnect_INTERCONNECT_ANY
	case "nvlink":
		s.Interconnect = shizuv1.Interconnect_INTERCONNECT_NVLINK
		if s.GpuCount < 2 {
			bad("interconnect", "nvlink links two GPUs or more; ask for gpu_count >= 2 (got %d)", s.GpuCount)
		}
	}
	for i, m := range b.AllowedModels {
		if _, ok := gpumodel.Lookup(m); !ok {
			bad(fmt.Sprintf("allowed_models.%d", i), "%q is not a GPU model this platform rents", m)
		}
	}
	if s.MilliGpu < 1000 && s.VramMib == 0 {
		bad("vram_mib", "required with a fraction of a GPU (milli_gpu %d): fractions share the GPU's memory, so say how much", s.MilliGpu)
	}
	if s.MilliGpu < 1000 && s.GpuCount != 1 {
		bad("milli_gpu", "a fraction of a GPU is for gpu_count 1 (got %d)", s.GpuCount)
	}
	if s.Plan == shizuv1.Plan_PLAN_RESERVED && len(s.AllowedModels) == 0 {
		bad("allowed_models", "a reserved rental runs against the tenant's commitment for a model: name it (e.g. [\"H100-SXM5-80GB\"]), or rent on-demand")
	}
	if b.MaxSpotPrice != nil {
		if s.Plan != shizuv1.Plan_PLAN_SPOT {
			bad("max_spot_price_per_gpu_hour", "a maximum price is only for plan spot")
		}
		s.MaxSpotPricePerGpuHour = &shizuv1.Money{Micros: b.MaxSpotPrice.Micros, Currency: b.MaxSpotPrice.Currency}
	}
	if s.Priority > maxPriority {
		bad("priority", "at most %d on this platform (got %d)", maxPriority, s.Priority)
	}
	if b.PendingTimeout != "" {
		d, err := time.ParseDuration(b.PendingTimeout)
		if err != nil || d <= 0 {
			bad("pending_timeout", "want a positive duration such as 30m or 90s")
		} else {
			s.PendingTimeout = durationpb.New(d)
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return s, contractErrors(s.Validate())
}

// enumWords puts the contract's enum names in people's words.
var enumWords = strings.NewReplacer("INTERCONNECT_NVLINK", "nvlink", "INTERCONNECT_ANY", "any",
	"PLAN_SPOT", "spot", "PLAN_ON_DEMAND", "on-demand", "PLAN_RESERVED", "reserved", "PLAN_UNSPECIFIED", "no plan")

// contractErrors lists the event contract's validation problems.
func contractErrors(err error) []fieldError {
	if err == nil {
		return nil
	}
	var out []fieldError
	var walk func(error)
	walk = func(err error) {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
			return
		}
		var fe *shizuv1.FieldError
		if errors.As(err, &fe) {
			out = append(out, fieldError{Field: fe.Path, Reason: enumWords.Replace(fe.Problem)})
			return
		}
		out = append(out, fieldError{Field: "body", Reason: enumWords.Replace(err.Error())})
	}
	walk(err)
	return out
}
