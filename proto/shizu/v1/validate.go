package shizuv1

// Hand-written validation of the event contract. A consumer calls Validate
// on every decoded event and terminates (dead-letters) the message when it
// fails; a publisher calls it before publishing. Validate is pure: it looks
// only at the message, never at the clock or at other events, so the same
// message is valid or invalid everywhere.
//
// Every Validate collects all problems (errors.Join of *FieldError), each
// named by its field path from the message validated, for example
// "spec.milli_gpu: 1500 is out of range 1..1000" or "gpus[2].uuid: missing".

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Limits the validation enforces. They are sanity bounds that catch unit
// mistakes (bytes for MiB) and abuse, not hardware facts.
const (
	// MaxTokenBytes is the longest subject token (tenant, node, pool, zone,
	// model id).
	MaxTokenBytes = 128
	// MaxEventIDBytes is the longest event id (Nats-Msg-Id).
	MaxEventIDBytes = 256
	// MaxGPUCount is the most GPUs one rental or one node may have.
	MaxGPUCount = 64
	// MilliGPUWhole is a whole GPU in milli-GPU.
	MilliGPUWhole = 1000
	// MaxVRAMMiB is the most GPU memory per GPU (1 TiB).
	MaxVRAMMiB = 1 << 20
	// MaxPriority is the highest RentalSpec.priority.
	MaxPriority = 1000
	// MaxLabels is the most labels a rental may carry.
	MaxLabels = 64
	// MaxLabelKeyBytes and MaxLabelValueBytes bound one label.
	MaxLabelKeyBytes   = 63
	MaxLabelValueBytes = 256
	// MaxURIBytes bounds image and checkpoint URIs.
	MaxURIBytes = 2048
)

// FieldError is one problem with one field of a message.
type FieldError struct {
	// Path is the field's path from the message validated, in proto field
	// names: "spec.milli_gpu", "gpus[2].uuid", "labels[\"team\"]". Empty for
	// the message itself.
	Path string
	// Problem says what is wrong, for example "1500 is out of range 1..1000".
	Problem string
}

func (e *FieldError) Error() string {
	if e.Path == "" {
		return e.Problem
	}
	return e.Path + ": " + e.Problem
}

// ValidToken reports whether s can stand as one NATS subject token, which is
// what tenant, node, pool, zone and model ids become (rental.<tenant>.…,
// node.<node>.…, spot.<zone>.<model>.price): non-empty, at most
// MaxTokenBytes bytes, printable ASCII without '.', '*', '>' or whitespace.
// ASCII only because these ids also name Redis keys, metrics and files; a
// token like "a.b" or "*" would widen a subscription or escape a permission.
func ValidToken(s string) error {
	if s == "" {
		return errors.New("missing")
	}
	if len(s) > MaxTokenBytes {
		return fmt.Errorf("%.20q... is %d bytes, the limit is %d", s, len(s), MaxTokenBytes)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || c == '.' || c == '*' || c == '>' {
			return fmt.Errorf("%q contains %q; a subject token is printable ASCII without '.', '*', '>' or whitespace", s, string(c))
		}
	}
	return nil
}

// validID checks an id that is not a subject token but travels in headers
// and logs (event, causation and correlation ids, sources, invoice ids):
// non-empty printable ASCII without whitespace, at most limit bytes. ':' and
// '.' are allowed ("usage:r-1:2026-11-30T12:00:00Z").
func validID(s string, limit int) error {
	if s == "" {
		return errors.New("missing")
	}
	if len(s) > limit {
		return fmt.Errorf("%.20q... is %d bytes, the limit is %d", s, len(s), limit)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f {
			return fmt.Errorf("%q contains %q; use printable ASCII without whitespace", s, string(c))
		}
	}
	return nil
}

// Validate checks the envelope: event_id, occurred_at and source are
// required; causation_id and correlation_id are optional.
func (m *EventMeta) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.check("event_id", validID(m.GetEventId(), MaxEventIDBytes))
	p.timestamp("occurred_at", m.GetOccurredAt())
	p.check("source", validID(m.GetSource(), MaxTokenBytes))
	if m.GetCausationId() != "" {
		p.check("causation_id", validID(m.GetCausationId(), MaxEventIDBytes))
	}
	if m.GetCorrelationId() != "" {
		p.check("correlation_id", validID(m.GetCorrelationId(), MaxEventIDBytes))
	}
	return p.err()
}

// Validate checks that micros is not negative (events carry prices and
// charges, never credits) and currency is three uppercase ASCII letters. It
// does not check the code against the ISO 4217 list.
func (m *Money) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	if m.GetMicros() < 0 {
		p.addf("micros", "%d is negative", m.GetMicros())
	}
	if c := m.GetCurrency(); !isCurrencyCode(c) {
		p.addf("currency", "%q is not an ISO 4217 code (three uppercase letters, e.g. \"USD\")", c)
	}
	return p.err()
}

func isCurrencyCode(c string) bool {
	if len(c) != 3 {
		return false
	}
	for i := 0; i < 3; i++ {
		if c[i] < 'A' || c[i] > 'Z' {
			return false
		}
	}
	return true
}

// migProfile matches NVIDIA MIG profile names: "1g.10gb", "3g.40gb",
// "1g.10gb+me".
var migProfile = regexp.MustCompile(`^[1-8]g\.[1-9][0-9]*gb(\+[a-z]+)*$`)

// Validate checks a MIG instance: uuid and profile are required.
func (m *MigInstance) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.check("uuid", validID(m.GetUuid(), MaxTokenBytes))
	p.migProfile("profile", m.GetProfile(), true)
	p.nonNegative("gpu_instance_id", int64(m.GetGpuInstanceId()))
	p.nonNegative("compute_instance_id", int64(m.GetComputeInstanceId()))
	p.inRange("vram_mib", m.GetVramMib(), 0, MaxVRAMMiB)
	return p.err()
}

// Validate checks a resource vector, in which zero means "none missing" or
// "no constraint": amounts are within their ranges, lists hold tokens.
func (m *ResourceVector) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.inRange("gpu_count", int64(m.GetGpuCount()), 0, MaxGPUCount)
	p.inRange("milli_gpu", int64(m.GetMilliGpu()), 0, MilliGPUWhole)
	p.inRange("vram_mib", m.GetVramMib(), 0, MaxVRAMMiB)
	p.nonNegative("cpu_milli", m.GetCpuMilli())
	p.nonNegative("memory_mib", m.GetMemoryMib())
	p.tokens("models", m.GetModels())
	p.optToken("zone", m.GetZone())
	p.enum("market", m.GetMarket(), false)
	p.enum("interconnect", interconnectOrAny(m.GetInterconnect()), false)
	p.migProfile("mig_profile", m.GetMigProfile(), false)
	return p.err()
}

// interconnectOrAny reads INTERCONNECT_UNSPECIFIED as INTERCONNECT_ANY, as
// the schema documents.
func interconnectOrAny(i Interconnect) Interconnect {
	if i == Interconnect_INTERCONNECT_UNSPECIFIED {
		return Interconnect_INTERCONNECT_ANY
	}
	return i
}

// Validate checks a rental spec:
//   - gpu_count 1..64; milli_gpu 1..1000, below 1000 only with gpu_count 1;
//   - vram_mib 0..1 TiB, and > 0 for a fraction (fractions share memory);
//   - INTERCONNECT_NVLINK needs gpu_count >= 2 (unspecified reads as ANY);
//   - mig_profile, when set, is a MIG profile name and needs gpu_count 1,
//     milli_gpu 1000 and no NVLink;
//   - plan is set; max_spot_price_per_gpu_hour only with PLAN_SPOT;
//   - priority 0..1000; cpu_milli and memory_mib not negative;
//   - allowed_models, required_capabilities and zone are subject tokens,
//     without duplicates;
//   - image has no whitespace; checkpoint_uri is an absolute URI;
//   - at most 64 labels, keys 1..63 bytes without whitespace, values at most
//     256 bytes;
//   - pending_timeout, when set, is positive.
func (m *RentalSpec) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	count, milli := m.GetGpuCount(), m.GetMilliGpu()
	p.inRange("gpu_count", int64(count), 1, MaxGPUCount)
	p.inRange("milli_gpu", int64(milli), 1, MilliGPUWhole)
	if milli >= 1 && milli < MilliGPUWhole && count != 1 {
		p.addf("milli_gpu", "%d is a fraction of a GPU, allowed only with gpu_count 1 (got %d)", milli, count)
	}
	p.inRange("vram_mib", m.GetVramMib(), 0, MaxVRAMMiB)
	if milli >= 1 && milli < MilliGPUWhole && m.GetVramMib() == 0 {
		p.addf("vram_mib", "missing: a fraction of a GPU (milli_gpu %d) must say how much GPU memory it needs", milli)
	}
	p.tokens("allowed_models", m.GetAllowedModels())
	interconnect := interconnectOrAny(m.GetInterconnect())
	p.enum("interconnect", interconnect, false)
	if interconnect == Interconnect_INTERCONNECT_NVLINK && count < 2 {
		p.addf("interconnect", "INTERCONNECT_NVLINK needs gpu_count >= 2 (got %d)", count)
	}
	if mig := m.GetMigProfile(); mig != "" {
		p.migProfile("mig_profile", mig, false)
		if count != 1 || milli != MilliGPUWhole || interconnect == Interconnect_INTERCONNECT_NVLINK {
			p.addf("mig_profile", "%q is one whole MIG instance: needs gpu_count 1, milli_gpu 1000 and no NVLink (got gpu_count %d, milli_gpu %d, %s)",
				mig, count, milli, interconnect)
		}
	}
	p.optToken("zone", m.GetZone())
	p.enum("plan", m.GetPlan(), true)
	if maxPrice := m.GetMaxSpotPricePerGpuHour(); maxPrice != nil {
		if m.GetPlan() != Plan_PLAN_SPOT {
			p.addf("max_spot_price_per_gpu_hour", "set, but plan is %s; a maximum spot price is only for PLAN_SPOT", m.GetPlan())
		}
		p.nest("max_spot_price_per_gpu_hour", maxPrice.Validate())
	}
	p.inRange("priority", int64(m.GetPriority()), 0, MaxPriority)
	p.nonNegative("cpu_milli", m.GetCpuMilli())
	p.nonNegative("memory_mib", m.GetMemoryMib())
	p.tokens("required_capabilities", m.GetRequiredCapabilities())
	if img := m.GetImage(); img != "" {
		p.check("image", validID(img, MaxURIBytes))
	}
	p.uri("checkpoint_uri", m.GetCheckpointUri())
	p.labels("labels", m.GetLabels())
	if d := m.GetPendingTimeout(); d != nil {
		if err := d.CheckValid(); err != nil {
			p.addf("pending_timeout", "%v", err)
		} else if d.AsDuration() <= 0 {
			p.addf("pending_timeout", "%s; must be positive when set", d.AsDuration())
		}
	}
	return p.err()
}

// Validate checks a GPU assignment: index, uuid, a milli share 1..1000 and a
// valid MIG instance if one is given.
func (m *GpuAssignment) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.inRange("gpu_index", int64(m.GetGpuIndex()), 0, MaxGPUCount-1)
	p.check("gpu_uuid", validID(m.GetGpuUuid(), MaxTokenBytes))
	p.inRange("milli_gpu", int64(m.GetMilliGpu()), 1, MilliGPUWhole)
	p.inRange("vram_mib", m.GetVramMib(), 0, MaxVRAMMiB)
	if mig := m.GetMigInstance(); mig != nil {
		p.nest("mig_instance", mig.Validate())
	}
	return p.err()
}

// Validate checks a rental request: meta, rental and tenant ids (subject
// tokens: the tenant routes rental.<tenant>.*, the rental id names keys and
// dedup ids) and the spec.
func (m *RentalRequested) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.rentalHeader(m.GetMeta(), m.GetRentalId(), m.GetTenantId())
	p.nest("spec", m.GetSpec().Validate())
	return p.err()
}

// Validate checks a placement: node and epoch, the spec it was made for, one
// assignment per requested GPU on distinct GPUs, each with the requested
// milli share and, for a MIG spec, a MIG instance of the requested profile
// (and none otherwise), and an attempt >= 1.
func (m *RentalScheduled) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.rentalHeader(m.GetMeta(), m.GetRentalId(), m.GetTenantId())
	p.token("node_id", m.GetNodeId())
	p.epoch("node_epoch", m.GetNodeEpoch())
	gpus := m.GetGpus()
	if len(gpus) == 0 {
		p.addf("gpus", "missing: a placement assigns at least one GPU")
	}
	seen := make(map[int32]bool, len(gpus))
	for i, g := range gpus {
		path := fmt.Sprintf("gpus[%d]", i)
		p.nest(path, g.Validate())
		if seen[g.GetGpuIndex()] {
			p.addf(path+".gpu_index", "%d is assigned twice", g.GetGpuIndex())
		}
		seen[g.GetGpuIndex()] = true
	}
	p.nonNegative("cpu_milli", m.GetCpuMilli())
	p.nonNegative("memory_mib", m.GetMemoryMib())
	spec := m.GetSpec()
	p.nest("spec", spec.Validate())
	if spec != nil && len(gpus) > 0 {
		if int(spec.GetGpuCount()) != len(gpus) {
			p.addf("gpus", "%d assignments for spec.gpu_count %d", len(gpus), spec.GetGpuCount())
		}
		for i, g := range gpus {
			if g.GetMilliGpu() != spec.GetMilliGpu() {
				p.addf(fmt.Sprintf("gpus[%d].milli_gpu", i), "%d differs from spec.milli_gpu %d", g.GetMilliGpu(), spec.GetMilliGpu())
			}
		}
	}
	if spec != nil && spec.GetMigProfile() != "" {
		for i, g := range gpus {
			if mig := g.GetMigInstance(); mig == nil || mig.GetProfile() != spec.GetMigProfile() {
				p.addf(fmt.Sprintf("gpus[%d].mig_instance", i), "want a %q instance, as spec.mig_profile asks (got %v)", spec.GetMigProfile(), mig.GetProfile())
			}
		}
	} else {
		for i, g := range gpus {
			if g.GetMigInstance() != nil {
				p.addf(fmt.Sprintf("gpus[%d].mig_instance", i), "set, but spec.mig_profile is empty")
			}
		}
	}
	p.token("gpu_model", m.GetGpuModel())
	p.token("zone", m.GetZone())
	p.attempt(m.GetAttempt())
	return p.err()
}

// Validate checks a pending notice: a reason, and the missing vector and
// deadline when given.
func (m *RentalPending) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.rentalHeader(m.GetMeta(), m.GetRentalId(), m.GetTenantId())
	p.enum("reason", m.GetReason(), true)
	if v := m.GetMissing(); v != nil {
		p.nest("missing", v.Validate())
	}
	p.optTimestamp("deadline", m.GetDeadline())
	return p.err()
}

// Validate checks a rejection: a reason is required.
func (m *RentalRejected) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.rentalHeader(m.GetMeta(), m.GetRentalId(), m.GetTenantId())
	p.enum("reason", m.GetReason(), true)
	return p.err()
}

// Validate checks a start: node, epoch, attempt and the node-agent's
// started_at are required (billing starts there).
func (m *RentalStarted) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.rentalHeader(m.GetMeta(), m.GetRentalId(), m.GetTenantId())
	p.token("node_id", m.GetNodeId())
	p.epoch("node_epoch", m.GetNodeEpoch())
	p.timestamp("started_at", m.GetStartedAt())
	for i, u := range m.GetGpuUuids() {
		p.check(fmt.Sprintf("gpu_uuids[%d]", i), validID(u, MaxTokenBytes))
	}
	p.attempt(m.GetAttempt())
	return p.err()
}

// Validate checks a stop: node, epoch, both node-agent timestamps with
// stopped_at not before started_at (billing covers the span between), an
// exit reason, exit_code 0 when the reason is EXIT_REASON_COMPLETED, and an
// attempt >= 1.
func (m *RentalStopped) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.rentalHeader(m.GetMeta(), m.GetRentalId(), m.GetTenantId())
	p.token("node_id", m.GetNodeId())
	p.epoch("node_epoch", m.GetNodeEpoch())
	startOK := p.timestamp("started_at", m.GetStartedAt())
	stopOK := p.timestamp("stopped_at", m.GetStoppedAt())
	if startOK && stopOK && m.GetStoppedAt().AsTime().Before(m.GetStartedAt().AsTime()) {
		p.addf("stopped_at", "%s is before started_at %s", fmtTime(m.GetStoppedAt()), fmtTime(m.GetStartedAt()))
	}
	p.enum("exit_reason", m.GetExitReason(), true)
	if m.GetExitReason() == ExitReason_EXIT_REASON_COMPLETED && m.GetExitCode() != 0 {
		p.addf("exit_code", "%d with EXIT_REASON_COMPLETED, which means the workload exited with 0", m.GetExitCode())
	}
	p.attempt(m.GetAttempt())
	return p.err()
}

// Validate checks a preemption: node, epoch, a notice deadline, a reason,
// and preempting_rental_id only with PREEMPT_REASON_HIGHER_PRIORITY.
func (m *RentalPreempted) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.rentalHeader(m.GetMeta(), m.GetRentalId(), m.GetTenantId())
	p.token("node_id", m.GetNodeId())
	p.epoch("node_epoch", m.GetNodeEpoch())
	p.timestamp("notice_deadline", m.GetNoticeDeadline())
	p.enum("reason", m.GetReason(), true)
	if id := m.GetPreemptingRentalId(); id != "" {
		p.token("preempting_rental_id", id)
		if m.GetReason() != PreemptReason_PREEMPT_REASON_HIGHER_PRIORITY {
			p.addf("preempting_rental_id", "set, but reason is %s; only PREEMPT_REASON_HIGHER_PRIORITY has a preempting rental", m.GetReason())
		}
	}
	return p.err()
}

// Validate checks a migration start: the node left, its epoch and a reason.
func (m *RentalMigrating) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.rentalHeader(m.GetMeta(), m.GetRentalId(), m.GetTenantId())
	p.token("from_node_id", m.GetFromNodeId())
	p.epoch("from_node_epoch", m.GetFromNodeEpoch())
	p.enum("reason", m.GetReason(), true)
	p.optTimestamp("last_heartbeat_at", m.GetLastHeartbeatAt())
	p.uri("checkpoint_uri", m.GetCheckpointUri())
	if m.GetSpec() != nil {
		p.nest("spec", m.GetSpec().Validate())
	}
	if m.GetFromAttempt() < 0 {
		p.addf("from_attempt", "%d, want >= 0 (0: unknown)", m.GetFromAttempt())
	}
	if m.GetNextAttempt() < 0 || (m.GetNextAttempt() > 0 && m.GetNextAttempt() <= m.GetFromAttempt()) {
		p.addf("next_attempt", "%d, want 0 (unknown) or more than from_attempt %d", m.GetNextAttempt(), m.GetFromAttempt())
	}
	return p.err()
}

// Validate checks a finished migration: both nodes, the new epoch and a
// non-negative downtime.
func (m *RentalMigrated) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.rentalHeader(m.GetMeta(), m.GetRentalId(), m.GetTenantId())
	p.token("from_node_id", m.GetFromNodeId())
	p.token("to_node_id", m.GetToNodeId())
	p.epoch("to_node_epoch", m.GetToNodeEpoch())
	p.duration("downtime", m.GetDowntime(), true)
	p.uri("checkpoint_uri", m.GetCheckpointUri())
	return p.err()
}

// Validate checks a cancel request: requested_by is required for audit.
func (m *RentalCancelRequested) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.rentalHeader(m.GetMeta(), m.GetRentalId(), m.GetTenantId())
	p.check("requested_by", validID(m.GetRequestedBy(), MaxTokenBytes))
	return p.err()
}

// Validate checks one GPU of a registration (indexes are checked by the
// caller, which knows the other GPUs).
func (m *Gpu) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.inRange("index", int64(m.GetIndex()), 0, MaxGPUCount-1)
	p.check("uuid", validID(m.GetUuid(), MaxTokenBytes))
	p.token("model", m.GetModel())
	p.inRange("vram_mib", m.GetVramMib(), 1, MaxVRAMMiB)
	if m.GetPciBusId() == "" {
		p.addf("pci_bus_id", "missing")
	}
	if m.GetMigEnabled() && !m.GetMigCapable() {
		p.addf("mig_enabled", "MIG mode on a GPU that is not mig_capable")
	}
	if !m.GetMigCapable() && len(m.GetMigInstances()) > 0 {
		p.addf("mig_instances", "%d instances on a GPU that is not mig_capable", len(m.GetMigInstances()))
	}
	if n := len(m.GetMigInstances()); n > 7 {
		p.addf("mig_instances", "%d instances; a GPU has at most 7 (one per compute slice)", n)
	}
	for i, mig := range m.GetMigInstances() {
		p.nest(fmt.Sprintf("mig_instances[%d]", i), mig.Validate())
	}
	for i, peer := range m.GetNvlinkPeers() {
		if peer == m.GetIndex() {
			p.addf(fmt.Sprintf("nvlink_peers[%d]", i), "%d is the GPU itself", peer)
		}
	}
	p.tokens("capabilities", m.GetCapabilities())
	return p.err()
}

// Validate checks a registration: node id and zone (subject tokens), epoch
// >= 1, market set, a valid on-demand price, positive host CPU and memory,
// 1..64 GPUs with distinct indexes and uuids, NVLink peers that exist and
// link both ways, and NVLink domains of at least two existing GPUs, each GPU
// in at most one domain.
func (m *NodeRegistered) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.nest("meta", m.GetMeta().Validate())
	p.token("node_id", m.GetNodeId())
	p.epoch("epoch", m.GetEpoch())
	p.token("zone", m.GetZone())
	p.enum("market", m.GetMarket(), true)
	p.nest("price_per_gpu_hour", m.GetPricePerGpuHour().Validate())
	p.inRange("cpu_milli", m.GetCpuMilli(), 1, math.MaxInt64)
	p.inRange("memory_mib", m.GetMemoryMib(), 1, math.MaxInt64)

	gpus := m.GetGpus()
	p.inRange("gpus", int64(len(gpus)), 1, MaxGPUCount)
	byIndex := make(map[int32]*Gpu, len(gpus))
	uuids := make(map[string]bool, len(gpus))
	for i, g := range gpus {
		path := fmt.Sprintf("gpus[%d]", i)
		p.nest(path, g.Validate())
		if byIndex[g.GetIndex()] != nil {
			p.addf(path+".index", "%d is used by another GPU", g.GetIndex())
		}
		byIndex[g.GetIndex()] = g
		if g.GetUuid() != "" && uuids[g.GetUuid()] {
			p.addf(path+".uuid", "%q is used by another GPU", g.GetUuid())
		}
		uuids[g.GetUuid()] = true
	}
	for i, g := range gpus {
		for j, peer := range g.GetNvlinkPeers() {
			path := fmt.Sprintf("gpus[%d].nvlink_peers[%d]", i, j)
			other := byIndex[peer]
			switch {
			case other == nil:
				p.addf(path, "%d is not a GPU of this node", peer)
			case peer != g.GetIndex() && !slices.Contains(other.GetNvlinkPeers(), g.GetIndex()):
				p.addf(path, "GPU %d lists %d as a peer but not the other way round", g.GetIndex(), peer)
			}
		}
	}
	inDomain := make(map[int32]int)
	for i, d := range m.GetNvlinkDomains() {
		path := fmt.Sprintf("nvlink_domains[%d].gpu_indexes", i)
		if len(d.GetGpuIndexes()) < 2 {
			p.addf(path, "%d GPUs; a domain has at least 2", len(d.GetGpuIndexes()))
		}
		for j, idx := range d.GetGpuIndexes() {
			if byIndex[idx] == nil {
				p.addf(fmt.Sprintf("%s[%d]", path, j), "%d is not a GPU of this node", idx)
				continue
			}
			if prev, ok := inDomain[idx]; ok {
				p.addf(fmt.Sprintf("%s[%d]", path, j), "GPU %d is already in nvlink_domains[%d]", idx, prev)
				continue
			}
			inDomain[idx] = i
		}
	}
	return p.err()
}

// Validate checks a telemetry sample: each GPU once, utilization 0..100,
// counters and throughputs not negative.
func (m *NodeTelemetry) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.nest("meta", m.GetMeta().Validate())
	p.token("node_id", m.GetNodeId())
	p.epoch("epoch", m.GetEpoch())
	seen := make(map[int32]bool)
	for i, g := range m.GetGpus() {
		path := fmt.Sprintf("gpus[%d]", i)
		p.inRange(path+".gpu_index", int64(g.GetGpuIndex()), 0, MaxGPUCount-1)
		if seen[g.GetGpuIndex()] {
			p.addf(path+".gpu_index", "%d is reported twice", g.GetGpuIndex())
		}
		seen[g.GetGpuIndex()] = true
		p.inRange(path+".utilization_percent", int64(g.GetUtilizationPercent()), 0, 100)
		p.inRange(path+".vram_used_mib", g.GetVramUsedMib(), 0, MaxVRAMMiB)
		p.nonNegative(path+".power_mw", g.GetPowerMw())
		p.nonNegative(path+".ecc_corrected", g.GetEccCorrected())
		p.nonNegative(path+".ecc_uncorrected", g.GetEccUncorrected())
		p.nonNegative(path+".pcie_rx_bytes_per_second", g.GetPcieRxBytesPerSecond())
		p.nonNegative(path+".pcie_tx_bytes_per_second", g.GetPcieTxBytesPerSecond())
		p.nonNegative(path+".nvlink_rx_bytes_per_second", g.GetNvlinkRxBytesPerSecond())
		p.nonNegative(path+".nvlink_tx_bytes_per_second", g.GetNvlinkTxBytesPerSecond())
	}
	return p.err()
}

// Validate checks a health change: gpu_index -1 (node) or a GPU index, a
// health that is set and differs from the previous one, counters not
// negative.
func (m *NodeHealthChanged) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.nest("meta", m.GetMeta().Validate())
	p.token("node_id", m.GetNodeId())
	p.epoch("epoch", m.GetEpoch())
	p.inRange("gpu_index", int64(m.GetGpuIndex()), -1, MaxGPUCount-1)
	p.enum("previous_health", m.GetPreviousHealth(), false)
	p.enum("health", m.GetHealth(), true)
	if m.GetHealth() != Health_HEALTH_UNSPECIFIED && m.GetHealth() == m.GetPreviousHealth() {
		p.addf("health", "%s equals previous_health; nothing changed", m.GetHealth())
	}
	p.nonNegative("xid", int64(m.GetXid()))
	p.nonNegative("ecc_corrected", m.GetEccCorrected())
	p.nonNegative("ecc_uncorrected", m.GetEccUncorrected())
	return p.err()
}

// Validate checks an interruption notice: the deadline is required.
func (m *NodeInterruptionNoticed) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.nest("meta", m.GetMeta().Validate())
	p.token("node_id", m.GetNodeId())
	p.epoch("epoch", m.GetEpoch())
	p.timestamp("deadline", m.GetDeadline())
	return p.err()
}

// Validate checks a node loss: the fenced epoch and a reason are required.
func (m *NodeLost) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.nest("meta", m.GetMeta().Validate())
	p.token("node_id", m.GetNodeId())
	p.epoch("fenced_epoch", m.GetFencedEpoch())
	p.enum("reason", m.GetReason(), true)
	p.optTimestamp("last_heartbeat_at", m.GetLastHeartbeatAt())
	return p.err()
}

// Validate checks a drained node: drain_started_at is required.
func (m *NodeDrained) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.nest("meta", m.GetMeta().Validate())
	p.token("node_id", m.GetNodeId())
	p.epoch("epoch", m.GetEpoch())
	p.timestamp("drain_started_at", m.GetDrainStartedAt())
	return p.err()
}

// Validate checks a traffic sample: the pool (a subject token), counts and
// rates not negative and finite, a positive window, and a non-negative p99
// latency when present.
func (m *TrafficSampled) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.nest("meta", m.GetMeta().Validate())
	p.token("pool_id", m.GetPoolId())
	p.nonNegative("concurrent_requests", m.GetConcurrentRequests())
	p.finite("requests_per_second", m.GetRequestsPerSecond(), true)
	if m.GetP99Latency() != nil {
		p.duration("p99_latency", m.GetP99Latency(), false)
	}
	if p.duration("window", m.GetWindow(), true) && m.GetWindow().AsDuration() == 0 {
		p.addf("window", "zero; a sample covers a window > 0")
	}
	return p.err()
}

// Validate checks a scaling decision: the pool, replica counts not negative,
// a rule and a metric, finite values.
func (m *ScalingDecided) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.nest("meta", m.GetMeta().Validate())
	p.token("pool_id", m.GetPoolId())
	p.nonNegative("from_replicas", int64(m.GetFromReplicas()))
	p.nonNegative("to_replicas", int64(m.GetToReplicas()))
	p.check("rule", validID(m.GetRule(), MaxTokenBytes))
	p.check("metric", validID(m.GetMetric(), MaxTokenBytes))
	p.finite("observed_value", m.GetObservedValue(), false)
	p.finite("threshold", m.GetThreshold(), false)
	return p.err()
}

// Validate checks a shortage: a valid missing vector asking for at least one
// GPU, and at least one waiting rental.
func (m *CapacityShortage) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.nest("meta", m.GetMeta().Validate())
	p.nest("missing", m.GetMissing().Validate())
	if v := m.GetMissing(); v != nil && v.GetGpuCount() < 1 {
		p.addf("missing.gpu_count", "%d; a shortage misses at least one GPU", v.GetGpuCount())
	}
	if len(m.GetRentalIds()) == 0 {
		p.addf("rental_ids", "missing: a shortage is reported for at least one waiting rental")
	}
	p.tokens("rental_ids", m.GetRentalIds())
	return p.err()
}

// Validate checks a provisioning request: pool, instance type, market,
// zone and a count >= 1.
func (m *NodeProvisionRequested) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.nest("meta", m.GetMeta().Validate())
	p.token("pool_id", m.GetPoolId())
	p.check("instance_type", validID(m.GetInstanceType(), MaxTokenBytes))
	p.enum("market", m.GetMarket(), true)
	p.token("zone", m.GetZone())
	p.inRange("count", int64(m.GetCount()), 1, math.MaxInt32)
	return p.err()
}

// Validate checks a release request: pool and node.
func (m *NodeReleaseRequested) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.nest("meta", m.GetMeta().Validate())
	p.token("pool_id", m.GetPoolId())
	p.token("node_id", m.GetNodeId())
	return p.err()
}

// Validate checks a ledger entry: ids, plan and model; an interval with
// interval_end after interval_start; seconds >= 1 and at most the
// interval's length rounded up; milli_gpu 1..1000, below 1000 only with
// gpu_count 1; a unit price and an amount in the same currency; labels as
// in RentalSpec. It does not recompute the amount: rounding is metering's
// rule.
func (m *UsageRecorded) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.rentalHeader(m.GetMeta(), m.GetRentalId(), m.GetTenantId())
	p.token("node_id", m.GetNodeId())
	p.enum("plan", m.GetPlan(), true)
	p.token("model", m.GetModel())
	startOK := p.timestamp("interval_start", m.GetIntervalStart())
	endOK := p.timestamp("interval_end", m.GetIntervalEnd())
	if startOK && endOK {
		length := m.GetIntervalEnd().AsTime().Sub(m.GetIntervalStart().AsTime())
		if length <= 0 {
			p.addf("interval_end", "%s is not after interval_start %s", fmtTime(m.GetIntervalEnd()), fmtTime(m.GetIntervalStart()))
		} else {
			maxSeconds := int64(math.Ceil(length.Seconds()))
			p.inRange("seconds", m.GetSeconds(), 1, maxSeconds)
		}
	} else {
		p.inRange("seconds", m.GetSeconds(), 1, math.MaxInt64)
	}
	count, milli := m.GetGpuCount(), m.GetMilliGpu()
	p.inRange("gpu_count", int64(count), 1, MaxGPUCount)
	p.inRange("milli_gpu", int64(milli), 1, MilliGPUWhole)
	if milli >= 1 && milli < MilliGPUWhole && count != 1 {
		p.addf("milli_gpu", "%d is a fraction of a GPU, allowed only with gpu_count 1 (got %d)", milli, count)
	}
	price, amount := m.GetUnitPricePerGpuHour(), m.GetAmount()
	p.nest("unit_price_per_gpu_hour", price.Validate())
	p.nest("amount", amount.Validate())
	if price != nil && amount != nil && price.GetCurrency() != amount.GetCurrency() {
		p.addf("amount.currency", "%q differs from unit_price_per_gpu_hour.currency %q", amount.GetCurrency(), price.GetCurrency())
	}
	p.labels("labels", m.GetLabels())
	return p.err()
}

// Validate checks an invoice: ids, a period with period_end after
// period_start, line items with a plan, a model, a non-negative quantity and
// an amount, and a total in the same currency equal to the sum of the line
// amounts (money is conserved).
func (m *InvoiceClosed) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.nest("meta", m.GetMeta().Validate())
	p.check("invoice_id", validID(m.GetInvoiceId(), MaxTokenBytes))
	p.token("tenant_id", m.GetTenantId())
	startOK := p.timestamp("period_start", m.GetPeriodStart())
	endOK := p.timestamp("period_end", m.GetPeriodEnd())
	if startOK && endOK && !m.GetPeriodEnd().AsTime().After(m.GetPeriodStart().AsTime()) {
		p.addf("period_end", "%s is not after period_start %s", fmtTime(m.GetPeriodEnd()), fmtTime(m.GetPeriodStart()))
	}
	total := m.GetTotal()
	p.nest("total", total.Validate())
	var sum int64
	sumOK := true
	for i, li := range m.GetLineItems() {
		path := fmt.Sprintf("line_items[%d]", i)
		p.enum(path+".plan", li.GetPlan(), true)
		p.token(path+".model", li.GetModel())
		p.nonNegative(path+".milli_gpu_seconds", li.GetMilliGpuSeconds())
		p.nest(path+".amount", li.GetAmount().Validate())
		if total != nil && li.GetAmount() != nil && li.GetAmount().GetCurrency() != total.GetCurrency() {
			p.addf(path+".amount.currency", "%q differs from total.currency %q", li.GetAmount().GetCurrency(), total.GetCurrency())
		}
		next := sum + li.GetAmount().GetMicros()
		if (li.GetAmount().GetMicros() > 0 && next < sum) || (li.GetAmount().GetMicros() < 0 && next > sum) {
			p.addf(path+".amount.micros", "the sum of the line amounts overflows int64")
			sumOK = false
		}
		sum = next
	}
	if sumOK && total != nil && total.GetMicros() != sum {
		p.addf("total.micros", "%d differs from the sum of the line amounts %d", total.GetMicros(), sum)
	}
	return p.err()
}

// Validate checks a spot price change: model and zone (subject tokens of
// spot.<zone>.<model>.price), a valid price, a previous price in the same
// currency when present, and effective_at.
func (m *SpotPriceChanged) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.nest("meta", m.GetMeta().Validate())
	p.token("model", m.GetModel())
	p.token("zone", m.GetZone())
	price := m.GetPricePerGpuHour()
	p.nest("price_per_gpu_hour", price.Validate())
	if prev := m.GetPreviousPricePerGpuHour(); prev != nil {
		p.nest("previous_price_per_gpu_hour", prev.Validate())
		if price != nil && prev.GetCurrency() != price.GetCurrency() {
			p.addf("previous_price_per_gpu_hour.currency", "%q differs from price_per_gpu_hour.currency %q", prev.GetCurrency(), price.GetCurrency())
		}
	}
	p.timestamp("effective_at", m.GetEffectiveAt())
	return p.err()
}

// errMissing is what Validate of a nil message returns; nest prefixes it
// with the field's path ("spec: missing").
func errMissing() error {
	return &FieldError{Problem: "missing"}
}

// problems collects FieldErrors; err joins them.
type problems []error

func (p *problems) addf(path, format string, args ...any) {
	*p = append(*p, &FieldError{Path: path, Problem: fmt.Sprintf(format, args...)})
}

// check adds err, if any, as the problem of path.
func (p *problems) check(path string, err error) {
	if err != nil {
		p.addf(path, "%s", err.Error())
	}
}

// nest adds the problems a nested message's Validate found, under path.
func (p *problems) nest(path string, err error) {
	for _, e := range flatten(err) {
		var fe *FieldError
		if !errors.As(e, &fe) {
			p.check(path, e)
			continue
		}
		sub := fe.Path
		switch {
		case sub == "":
			sub = path
		case strings.HasPrefix(sub, "["):
			sub = path + sub
		default:
			sub = path + "." + sub
		}
		*p = append(*p, &FieldError{Path: sub, Problem: fe.Problem})
	}
}

func (p problems) err() error {
	return errors.Join(p...)
}

// flatten unpacks errors.Join trees into their leaves.
func flatten(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	return []error{err}
}

// rentalHeader checks what every rental event starts with.
func (p *problems) rentalHeader(meta *EventMeta, rentalID, tenantID string) {
	p.nest("meta", meta.Validate())
	p.token("rental_id", rentalID)
	p.token("tenant_id", tenantID)
}

func (p *problems) token(path, s string) {
	p.check(path, ValidToken(s))
}

func (p *problems) optToken(path, s string) {
	if s != "" {
		p.token(path, s)
	}
}

// tokens checks a list of subject tokens without duplicates.
func (p *problems) tokens(path string, list []string) {
	seen := make(map[string]bool, len(list))
	for i, s := range list {
		ip := fmt.Sprintf("%s[%d]", path, i)
		p.token(ip, s)
		if seen[s] {
			p.addf(ip, "%q is listed twice", s)
		}
		seen[s] = true
	}
}

// epoch checks a node registration epoch: epochs start at 1, so 0 means
// "not set".
func (p *problems) epoch(path string, e int64) {
	if e < 1 {
		p.addf(path, "%d; epochs start at 1", e)
	}
}

// attempt checks a placement number: attempts start at 1.
func (p *problems) attempt(a int32) {
	if a < 1 {
		p.addf("attempt", "%d; attempts start at 1", a)
	}
}

func (p *problems) inRange(path string, v, lo, hi int64) {
	if v < lo || v > hi {
		p.addf(path, "%d is out of range %d..%d", v, lo, hi)
	}
}

func (p *problems) nonNegative(path string, v int64) {
	if v < 0 {
		p.addf(path, "%d is negative", v)
	}
}

func (p *problems) finite(path string, v float64, nonNegative bool) {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		p.addf(path, "%v is not a finite number", v)
	case nonNegative && v < 0:
		p.addf(path, "%v is negative", v)
	}
}

// enum checks that v is a value the schema defines and, if required, that it
// is not the *_UNSPECIFIED zero value.
func (p *problems) enum(path string, v protoreflect.Enum, required bool) {
	values := v.Descriptor().Values()
	if values.ByNumber(v.Number()) == nil {
		p.addf(path, "%d is not a defined %s value", v.Number(), v.Descriptor().Name())
		return
	}
	if required && v.Number() == 0 {
		p.addf(path, "missing (%s)", values.ByNumber(0).Name())
	}
}

// timestamp checks a required timestamp and reports whether it is usable.
// The zero time (1970-01-01T00:00:00Z) counts as missing: no Shizu event
// happened then, and it is what an unset clock value encodes to.
func (p *problems) timestamp(path string, ts *timestamppb.Timestamp) bool {
	if ts == nil || (ts.GetSeconds() == 0 && ts.GetNanos() == 0) {
		p.addf(path, "missing")
		return false
	}
	if err := ts.CheckValid(); err != nil {
		p.addf(path, "invalid: %v", err)
		return false
	}
	return true
}

func (p *problems) optTimestamp(path string, ts *timestamppb.Timestamp) {
	if ts != nil {
		p.timestamp(path, ts)
	}
}

// duration checks a non-negative duration (required: present) and reports
// whether it is usable.
func (p *problems) duration(path string, d *durationpb.Duration, required bool) bool {
	if d == nil {
		if required {
			p.addf(path, "missing")
		}
		return false
	}
	if err := d.CheckValid(); err != nil {
		p.addf(path, "invalid: %v", err)
		return false
	}
	if d.AsDuration() < 0 {
		p.addf(path, "%s is negative", d.AsDuration())
		return false
	}
	return true
}

func (p *problems) migProfile(path, s string, required bool) {
	switch {
	case s == "" && required:
		p.addf(path, "missing")
	case s != "" && !migProfile.MatchString(s):
		p.addf(path, "%q is not a MIG profile name like \"1g.10gb\"", s)
	}
}

// uri checks an optional absolute URI ("s3://bucket/run-7/").
func (p *problems) uri(path, s string) {
	if s == "" {
		return
	}
	if len(s) > MaxURIBytes {
		p.addf(path, "%d bytes, the limit is %d", len(s), MaxURIBytes)
		return
	}
	u, err := url.Parse(s)
	if err != nil {
		p.addf(path, "%q is not a URI: %v", s, err)
		return
	}
	if u.Scheme == "" {
		p.addf(path, "%q has no scheme; use an absolute URI like \"s3://bucket/path/\"", s)
	}
}

func (p *problems) labels(path string, labels map[string]string) {
	if len(labels) > MaxLabels {
		p.addf(path, "%d labels, the limit is %d", len(labels), MaxLabels)
	}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	slices.Sort(keys) // stable error order
	for _, k := range keys {
		kp := fmt.Sprintf("%s[%q]", path, k)
		if k == "" {
			p.addf(kp, "empty key")
		} else {
			p.check(kp, validID(k, MaxLabelKeyBytes))
		}
		if v := labels[k]; len(v) > MaxLabelValueBytes || !utf8.ValidString(v) {
			p.addf(kp, "value is %d bytes or not UTF-8; the limit is %d bytes of UTF-8", len(v), MaxLabelValueBytes)
		}
	}
}

func fmtTime(ts *timestamppb.Timestamp) string {
	return ts.AsTime().Format("2006-01-02T15:04:05.999999999Z07:00")
}

// Validate checks a start command: the embedded placement must itself be a
// valid RentalScheduled.
func (m *StartRental) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.nest("meta", m.GetMeta().Validate())
	p.nest("scheduled", m.GetScheduled().Validate())
	return p.err()
}

// Validate checks a stop command: ids, an attempt, a reason, and a
// non-negative grace period when given.
func (m *StopRental) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.rentalHeader(m.GetMeta(), m.GetRentalId(), m.GetTenantId())
	p.token("node_id", m.GetNodeId())
	p.attempt(m.GetAttempt())
	p.enum("reason", m.GetReason(), true)
	p.duration("grace_period", m.GetGracePeriod(), false)
	return p.err()
}

// Validate checks a drain command: node, epoch and deadline are required.
func (m *DrainNode) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.nest("meta", m.GetMeta().Validate())
	p.token("node_id", m.GetNodeId())
	p.epoch("epoch", m.GetEpoch())
	p.timestamp("deadline", m.GetDeadline())
	return p.err()
}
