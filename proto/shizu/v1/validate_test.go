package shizuv1

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

type validator interface {
	proto.Message
	Validate() error
}

// validEvents is one valid default per event message; TestEveryEvent...
// checks that no event is missing from it.
func validEvents() []validator {
	return []validator{
		validRentalRequested(), validRentalScheduled(), validRentalPending(), validRentalRejected(),
		validRentalStarted(), validRentalStopped(), validRentalPreempted(), validRentalMigrating(),
		validRentalMigrated(), validRentalCancelRequested(),
		validNodeRegistered(), validNodeTelemetry(), validNodeHealthChanged(),
		validNodeInterruptionNoticed(), validNodeLost(), validNodeDrained(),
		validTrafficSampled(), validScalingDecided(), validCapacityShortage(),
		validNodeProvisionRequested(), validNodeReleaseRequested(), validPoolDeclared(),
		validUsageRecorded(), validInvoiceClosed(), validBudgetThresholdCrossed(),
		validSpotPriceChanged(),
		validStartRental(), validStopRental(), validDrainNode(),
		validRentalLogBatch(),
	}
}

func TestTheValidDefaultOfEveryEventPasses(t *testing.T) {
	for _, m := range validEvents() {
		name := string(m.ProtoReflect().Descriptor().Name())
		t.Run("a valid "+name+" passes", func(t *testing.T) {
			if err := m.Validate(); err != nil {
				t.Fatalf("Validate() = %v, want nil", err)
			}
		})
	}
}

func TestANilEventIsReportedMissing(t *testing.T) {
	var m *RentalRequested
	if err := m.Validate(); err == nil || err.Error() != "missing" {
		t.Fatalf("Validate() of a nil event = %v, want \"missing\"", err)
	}
}

// wantProblem asserts that err holds a FieldError whose message starts with
// want (a field path, often followed by the start of the problem).
func wantProblem(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil {
		t.Fatalf("Validate() = nil, want a problem starting with %q", want)
	}
	for _, e := range flatten(err) {
		var fe *FieldError
		if !errors.As(e, &fe) {
			t.Fatalf("Validate() returned %T %v, want only *FieldError", e, e)
		}
		if strings.HasPrefix(fe.Error(), want) {
			return
		}
	}
	t.Fatalf("Validate() = %v\nwant a problem starting with %q", err, want)
}

func TestRentalSpecAcceptsWhatTheContractAllows(t *testing.T) {
	tests := []struct {
		name string
		spec *RentalSpec
	}{
		{"a quarter of one GPU with its memory is accepted", with(validSpec(), func(s *RentalSpec) {
			s.MilliGpu, s.VramMib = 250, 20480
		})},
		{"eight NVLinked whole GPUs are accepted", with(validSpec(), func(s *RentalSpec) {
			s.GpuCount, s.Interconnect = 8, Interconnect_INTERCONNECT_NVLINK
		})},
		{"an unspecified interconnect is read as any", with(validSpec(), func(s *RentalSpec) {
			s.Interconnect = Interconnect_INTERCONNECT_UNSPECIFIED
		})},
		{"a spot rental with a maximum price is accepted", with(validSpec(), func(s *RentalSpec) {
			s.Plan, s.MaxSpotPricePerGpuHour = Plan_PLAN_SPOT, usd(1_500_000)
		})},
		{"a spot rental without a maximum price is accepted", with(validSpec(), func(s *RentalSpec) {
			s.Plan = Plan_PLAN_SPOT
		})},
		{"one MIG instance is accepted", with(validSpec(), func(s *RentalSpec) {
			s.MigProfile = "1g.10gb+me"
		})},
		{"a free price of zero micros is accepted", with(validSpec(), func(s *RentalSpec) {
			s.Plan, s.MaxSpotPricePerGpuHour = Plan_PLAN_SPOT, usd(0)
		})},
		{"the whole spec filled in is accepted", fullSpec()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.spec.Validate(); err != nil {
				t.Fatalf("Validate() = %v, want nil", err)
			}
		})
	}
}

func TestRentalRequestedRejectsABadSpecWithTheFieldPath(t *testing.T) {
	spec := func(mutate func(*RentalSpec)) *RentalRequested {
		return with(validRentalRequested(), func(m *RentalRequested) { mutate(m.Spec) })
	}
	tests := []struct {
		name string
		msg  *RentalRequested
		want string
	}{
		{"a missing spec is rejected", with(validRentalRequested(), func(m *RentalRequested) { m.Spec = nil }), "spec: missing"},
		{"zero GPUs are rejected", spec(func(s *RentalSpec) { s.GpuCount = 0 }), "spec.gpu_count: 0 is out of range 1..64"},
		{"65 GPUs are rejected", spec(func(s *RentalSpec) { s.GpuCount = 65 }), "spec.gpu_count: 65 is out of range 1..64"},
		{"1500 milli-GPU is rejected", spec(func(s *RentalSpec) { s.MilliGpu = 1500 }), "spec.milli_gpu: 1500 is out of range 1..1000"},
		{"zero milli-GPU is rejected", spec(func(s *RentalSpec) { s.MilliGpu = 0 }), "spec.milli_gpu: 0 is out of range"},
		{"a fraction of each of two GPUs is rejected", spec(func(s *RentalSpec) { s.GpuCount, s.MilliGpu, s.VramMib = 2, 500, 1024 }), "spec.milli_gpu: 500 is a fraction"},
		{"a fraction without a memory need is rejected", spec(func(s *RentalSpec) { s.MilliGpu = 500 }), "spec.vram_mib: missing"},
		{"negative GPU memory is rejected", spec(func(s *RentalSpec) { s.VramMib = -1 }), "spec.vram_mib: -1 is out of range"},
		{"GPU memory given in bytes is rejected", spec(func(s *RentalSpec) { s.VramMib = 80 << 30 }), "spec.vram_mib: 85899345920 is out of range"},
		{"NVLink for one GPU is rejected", spec(func(s *RentalSpec) { s.Interconnect = Interconnect_INTERCONNECT_NVLINK }), "spec.interconnect: INTERCONNECT_NVLINK needs gpu_count >= 2"},
		{"an interconnect the schema does not define is rejected", spec(func(s *RentalSpec) { s.Interconnect = 9 }), "spec.interconnect: 9 is not a defined Interconnect value"},
		{"a model that is not a subject token is rejected", spec(func(s *RentalSpec) { s.AllowedModels = []string{"NVIDIA H100 80GB HBM3"} }), "spec.allowed_models[0]: "},
		{"a model listed twice is rejected", spec(func(s *RentalSpec) { s.AllowedModels = []string{"A100", "A100"} }), "spec.allowed_models[1]: \"A100\" is listed twice"},
		{"a MIG profile that is not one is rejected", spec(func(s *RentalSpec) { s.MigProfile = "tiny" }), "spec.mig_profile: \"tiny\" is not a MIG profile"},
		{"a MIG instance on two GPUs is rejected", spec(func(s *RentalSpec) { s.MigProfile, s.GpuCount = "1g.10gb", 2 }), "spec.mig_profile: \"1g.10gb\" is one whole MIG instance"},
		{"a MIG instance shared by milli-GPU is rejected", spec(func(s *RentalSpec) { s.MigProfile, s.MilliGpu, s.VramMib = "1g.10gb", 500, 1024 }), "spec.mig_profile: \"1g.10gb\" is one whole MIG instance"},
		{"a zone with a dot is rejected", spec(func(s *RentalSpec) { s.Zone = "eu.west" }), "spec.zone: \"eu.west\" contains \".\""},
		{"an unspecified plan is rejected", spec(func(s *RentalSpec) { s.Plan = Plan_PLAN_UNSPECIFIED }), "spec.plan: missing (PLAN_UNSPECIFIED)"},
		{"a maximum spot price on demand is rejected", spec(func(s *RentalSpec) { s.MaxSpotPricePerGpuHour = usd(1) }), "spec.max_spot_price_per_gpu_hour: set, but plan is PLAN_ON_DEMAND"},
		{"a maximum spot price on a reserved plan is rejected", spec(func(s *RentalSpec) { s.Plan, s.MaxSpotPricePerGpuHour = Plan_PLAN_RESERVED, usd(1) }), "spec.max_spot_price_per_gpu_hour: set, but plan is PLAN_RESERVED"},
		{"a negative maximum spot price is rejected", spec(func(s *RentalSpec) { s.Plan, s.MaxSpotPricePerGpuHour = Plan_PLAN_SPOT, usd(-1) }), "spec.max_spot_price_per_gpu_hour.micros: -1 is negative"},
		{"a lowercase currency is rejected", spec(func(s *RentalSpec) {
			s.Plan, s.MaxSpotPricePerGpuHour = Plan_PLAN_SPOT, &Money{Micros: 1, Currency: "usd"}
		}), "spec.max_spot_price_per_gpu_hour.currency: \"usd\" is not an ISO 4217 code"},
		{"a missing currency is rejected", spec(func(s *RentalSpec) {
			s.Plan, s.MaxSpotPricePerGpuHour = Plan_PLAN_SPOT, &Money{Micros: 1}
		}), "spec.max_spot_price_per_gpu_hour.currency: \"\" is not an ISO 4217 code"},
		{"a negative priority is rejected", spec(func(s *RentalSpec) { s.Priority = -1 }), "spec.priority: -1 is out of range 0..1000"},
		{"a zero pending timeout is rejected", spec(func(s *RentalSpec) { s.PendingTimeout = durationpb.New(0) }), "spec.pending_timeout: 0s; must be positive when set"},
		{"a negative pending timeout is rejected", spec(func(s *RentalSpec) { s.PendingTimeout = durationpb.New(-time.Minute) }), "spec.pending_timeout: -1m0s; must be positive when set"},
		{"a priority above 1000 is rejected", spec(func(s *RentalSpec) { s.Priority = 1001 }), "spec.priority: 1001 is out of range 0..1000"},
		{"negative host CPU is rejected", spec(func(s *RentalSpec) { s.CpuMilli = -1000 }), "spec.cpu_milli: -1000 is negative"},
		{"negative host memory is rejected", spec(func(s *RentalSpec) { s.MemoryMib = -1 }), "spec.memory_mib: -1 is negative"},
		{"an empty capability is rejected", spec(func(s *RentalSpec) { s.RequiredCapabilities = []string{"fp8", ""} }), "spec.required_capabilities[1]: missing"},
		{"an image with a space is rejected", spec(func(s *RentalSpec) { s.Image = "ghcr.io/acme/trainer: 1.4" }), "spec.image: "},
		{"a relative checkpoint URI is rejected", spec(func(s *RentalSpec) { s.CheckpointUri = "ckpt/run-7" }), "spec.checkpoint_uri: \"ckpt/run-7\" has no scheme"},
		{"a label key with a space is rejected", spec(func(s *RentalSpec) { s.Labels = map[string]string{"my team": "x"} }), "spec.labels[\"my team\"]: "},
		{"an empty label key is rejected", spec(func(s *RentalSpec) { s.Labels = map[string]string{"": "x"} }), "spec.labels[\"\"]: empty key"},
		{"a label value over 256 bytes is rejected", spec(func(s *RentalSpec) { s.Labels = map[string]string{"k": strings.Repeat("v", 257)} }), "spec.labels[\"k\"]: value is 257 bytes"},
		{"65 labels are rejected", spec(func(s *RentalSpec) {
			s.Labels = map[string]string{}
			for i := range 65 {
				s.Labels[strings.Repeat("k", i+1)] = "v"
			}
		}), "spec.labels: 65 labels, the limit is 64"},
		{"a tenant id with a wildcard is rejected", with(validRentalRequested(), func(m *RentalRequested) { m.TenantId = "*" }), "tenant_id: \"*\" contains \"*\""},
		{"a missing rental id is rejected", with(validRentalRequested(), func(m *RentalRequested) { m.RentalId = "" }), "rental_id: missing"},
		{"a missing meta is rejected", with(validRentalRequested(), func(m *RentalRequested) { m.Meta = nil }), "meta: missing"},
		{"a meta without an event id is rejected", with(validRentalRequested(), func(m *RentalRequested) { m.Meta.EventId = "" }), "meta.event_id: missing"},
		{"a meta without occurred_at is rejected", with(validRentalRequested(), func(m *RentalRequested) { m.Meta.OccurredAt = nil }), "meta.occurred_at: missing"},
		{"a meta with a zero occurred_at is rejected", with(validRentalRequested(), func(m *RentalRequested) { m.Meta.OccurredAt = &timestamppb.Timestamp{} }), "meta.occurred_at: missing"},
		{"a meta with an out-of-range occurred_at is rejected", with(validRentalRequested(), func(m *RentalRequested) {
			m.Meta.OccurredAt = &timestamppb.Timestamp{Seconds: 1, Nanos: -1}
		}), "meta.occurred_at: invalid"},
		{"a meta without a source is rejected", with(validRentalRequested(), func(m *RentalRequested) { m.Meta.Source = "" }), "meta.source: missing"},
		{"a causation id with a newline is rejected", with(validRentalRequested(), func(m *RentalRequested) { m.Meta.CausationId = "a\nb" }), "meta.causation_id: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantProblem(t, tt.msg.Validate(), tt.want)
		})
	}
}

func TestValidationReportsEveryProblemAtOnce(t *testing.T) {
	m := with(validRentalRequested(), func(m *RentalRequested) {
		m.TenantId = ""
		m.Spec.GpuCount = 0
		m.Spec.MilliGpu = 1500
		m.Spec.Plan = Plan_PLAN_UNSPECIFIED
	})
	err := m.Validate()
	for _, want := range []string{"tenant_id: ", "spec.gpu_count: ", "spec.milli_gpu: ", "spec.plan: "} {
		wantProblem(t, err, want)
	}
	if n := len(flatten(err)); n != 4 {
		t.Fatalf("got %d problems, want 4:\n%v", n, err)
	}
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Path != "tenant_id" {
		t.Fatalf("errors.As(*FieldError) = %+v, want the first problem, at tenant_id", fe)
	}
}

func TestEventValidationRejectsBadInputWithTheFieldPath(t *testing.T) {
	tests := []struct {
		name string
		msg  validator
		want string
	}{
		// RentalScheduled
		{"a placement without GPUs is rejected", with(validRentalScheduled(), func(m *RentalScheduled) { m.Gpus = nil }), "gpus: missing"},
		{"a placement with fewer GPUs than asked is rejected", with(validRentalScheduled(), func(m *RentalScheduled) { m.Spec.GpuCount = 2 }), "gpus: 1 assignments for spec.gpu_count 2"},
		{"a placement giving one GPU twice is rejected", with(validRentalScheduled(), func(m *RentalScheduled) {
			m.Spec.GpuCount = 2
			m.Gpus = append(m.Gpus, proto.CloneOf(m.Gpus[0]))
		}), "gpus[1].gpu_index: 0 is assigned twice"},
		{"a placement with another share than asked is rejected", with(validRentalScheduled(), func(m *RentalScheduled) { m.Gpus[0].MilliGpu = 500 }), "gpus[0].milli_gpu: 500 differs from spec.milli_gpu 1000"},
		{"a placement with a bad MIG instance is rejected", with(validRentalScheduled(), func(m *RentalScheduled) { m.Gpus[0].MigInstance = &MigInstance{Profile: "1g.10gb"} }), "gpus[0].mig_instance.uuid: missing"},
		{"a MIG placement without a MIG instance is rejected", with(validRentalScheduled(), func(m *RentalScheduled) { m.Spec.MigProfile = "1g.10gb" }), "gpus[0].mig_instance: want a \"1g.10gb\" instance"},
		{"a MIG instance for a spec without MIG is rejected", with(validRentalScheduled(), func(m *RentalScheduled) {
			m.Gpus[0].MigInstance = &MigInstance{Uuid: "MIG-1", Profile: "1g.10gb", VramMib: 9856}
		}), "gpus[0].mig_instance: set, but spec.mig_profile is empty"},
		{"a placement without an attempt is rejected", with(validRentalScheduled(), func(m *RentalScheduled) { m.Attempt = 0 }), "attempt: 0; attempts start at 1"},
		{"a placement against epoch 0 is rejected", with(validRentalScheduled(), func(m *RentalScheduled) { m.NodeEpoch = 0 }), "node_epoch: 0; epochs start at 1"},
		// RentalPending, RentalRejected
		{"a pending notice without a reason is rejected", with(validRentalPending(), func(m *RentalPending) { m.Reason = 0 }), "reason: missing (PENDING_REASON_UNSPECIFIED)"},
		{"a pending notice missing minus one GPU is rejected", with(validRentalPending(), func(m *RentalPending) { m.Missing.GpuCount = -1 }), "missing.gpu_count: -1 is out of range"},
		{"a rejection without a reason is rejected", with(validRentalRejected(), func(m *RentalRejected) { m.Reason = 0 }), "reason: missing"},
		// RentalStarted
		{"a start without started_at is rejected", with(validRentalStarted(), func(m *RentalStarted) { m.StartedAt = nil }), "started_at: missing"},
		{"a start on a node id with whitespace is rejected", with(validRentalStarted(), func(m *RentalStarted) { m.NodeId = "gpu node" }), "node_id: \"gpu node\" contains \" \""},
		{"a start on a node id with '>' is rejected", with(validRentalStarted(), func(m *RentalStarted) { m.NodeId = "n>" }), "node_id: \"n>\" contains \">\""},
		{"a start on a 129-byte node id is rejected", with(validRentalStarted(), func(m *RentalStarted) { m.NodeId = strings.Repeat("n", 129) }), "node_id: "},
		{"a start without an attempt is rejected", with(validRentalStarted(), func(m *RentalStarted) { m.Attempt = 0 }), "attempt: 0"},
		{"a start with an empty GPU uuid is rejected", with(validRentalStarted(), func(m *RentalStarted) { m.GpuUuids = []string{""} }), "gpu_uuids[0]: missing"},
		// RentalStopped
		{"a stop before its start is rejected", with(validRentalStopped(), func(m *RentalStopped) { m.StoppedAt = at(0) }), "stopped_at: 2026-11-30T12:00:00Z is before started_at 2026-11-30T12:00:01Z"},
		{"a stop without an attempt is rejected", with(validRentalStopped(), func(m *RentalStopped) { m.Attempt = -1 }), "attempt: -1"},
		{"a stop without stopped_at is rejected", with(validRentalStopped(), func(m *RentalStopped) { m.StoppedAt = nil }), "stopped_at: missing"},
		{"a stop without started_at is rejected", with(validRentalStopped(), func(m *RentalStopped) { m.StartedAt = nil }), "started_at: missing"},
		{"a stop without an exit reason is rejected", with(validRentalStopped(), func(m *RentalStopped) { m.ExitReason = 0 }), "exit_reason: missing (EXIT_REASON_UNSPECIFIED)"},
		{"a completed stop with a non-zero exit code is rejected", with(validRentalStopped(), func(m *RentalStopped) { m.ExitCode = 1 }), "exit_code: 1 with EXIT_REASON_COMPLETED"},
		// RentalPreempted, RentalMigrating, RentalMigrated, RentalCancelRequested
		{"a preemption without a deadline is rejected", with(validRentalPreempted(), func(m *RentalPreempted) { m.NoticeDeadline = nil }), "notice_deadline: missing"},
		{"a spot-price preemption naming a preempting rental is rejected", with(validRentalPreempted(), func(m *RentalPreempted) {
			m.Reason = PreemptReason_PREEMPT_REASON_SPOT_PRICE_ABOVE_MAX
		}), "preempting_rental_id: set, but reason is PREEMPT_REASON_SPOT_PRICE_ABOVE_MAX"},
		{"a migration without a reason is rejected", with(validRentalMigrating(), func(m *RentalMigrating) { m.Reason = 0 }), "reason: missing"},
		{"a migration whose next attempt does not follow the one it leaves is rejected", with(validRentalMigrating(), func(m *RentalMigrating) { m.NextAttempt = 1 }), "next_attempt: 1, want 0 (unknown) or more than from_attempt 1"},
		{"a migration carrying an invalid spec is rejected", with(validRentalMigrating(), func(m *RentalMigrating) { m.Spec.GpuCount = 0 }), "spec.gpu_count: 0"},
		{"a migration from an unnamed node is rejected", with(validRentalMigrating(), func(m *RentalMigrating) { m.FromNodeId = "" }), "from_node_id: missing"},
		{"a migration with negative downtime is rejected", with(validRentalMigrated(), func(m *RentalMigrated) { m.Downtime = durationpb.New(-time.Second) }), "downtime: -1s is negative"},
		{"a migration without downtime is rejected", with(validRentalMigrated(), func(m *RentalMigrated) { m.Downtime = nil }), "downtime: missing"},
		{"a cancel request by nobody is rejected", with(validRentalCancelRequested(), func(m *RentalCancelRequested) { m.RequestedBy = "" }), "requested_by: missing"},
		// NodeRegistered
		{"a registration without GPUs is rejected", with(validNodeRegistered(), func(m *NodeRegistered) { m.Gpus, m.NvlinkDomains = nil, nil }), "gpus: 0 is out of range 1..64"},
		{"a registration at epoch 0 is rejected", with(validNodeRegistered(), func(m *NodeRegistered) { m.Epoch = 0 }), "epoch: 0; epochs start at 1"},
		{"a registration without a zone is rejected", with(validNodeRegistered(), func(m *NodeRegistered) { m.Zone = "" }), "zone: missing"},
		{"a registration without a market is rejected", with(validNodeRegistered(), func(m *NodeRegistered) { m.Market = 0 }), "market: missing (MARKET_UNSPECIFIED)"},
		{"a registration without a price is rejected", with(validNodeRegistered(), func(m *NodeRegistered) { m.PricePerGpuHour = nil }), "price_per_gpu_hour: missing"},
		{"a registration without host memory is rejected", with(validNodeRegistered(), func(m *NodeRegistered) { m.MemoryMib = 0 }), "memory_mib: 0 is out of range"},
		{"two GPUs with one index are rejected", with(validNodeRegistered(), func(m *NodeRegistered) { m.Gpus[1].Index = 0 }), "gpus[1].index: 0 is used by another GPU"},
		{"two GPUs with one uuid are rejected", with(validNodeRegistered(), func(m *NodeRegistered) { m.Gpus[1].Uuid = m.Gpus[0].Uuid }), "gpus[1].uuid: "},
		{"a GPU without memory is rejected", with(validNodeRegistered(), func(m *NodeRegistered) { m.Gpus[0].VramMib = 0 }), "gpus[0].vram_mib: 0 is out of range"},
		{"a GPU model with spaces is rejected", with(validNodeRegistered(), func(m *NodeRegistered) { m.Gpus[0].Model = "NVIDIA H100" }), "gpus[0].model: "},
		{"MIG instances on a GPU without MIG are rejected", with(validNodeRegistered(), func(m *NodeRegistered) {
			m.Gpus[0].MigCapable = false
			m.Gpus[0].MigInstances = []*MigInstance{{Uuid: "MIG-1", Profile: "1g.10gb", VramMib: 9856}}
		}), "gpus[0].mig_instances: 1 instances on a GPU that is not mig_capable"},
		{"more than 7 MIG instances on a GPU are rejected", with(validNodeRegistered(), func(m *NodeRegistered) {
			m.Gpus[0].MigCapable = true
			for k := range 8 {
				m.Gpus[0].MigInstances = append(m.Gpus[0].MigInstances, &MigInstance{Uuid: fmt.Sprintf("MIG-%d", k), Profile: "1g.10gb", VramMib: 9856})
			}
		}), "gpus[0].mig_instances: 8 instances; a GPU has at most 7"},
		{"an NVLink peer that does not exist is rejected", with(validNodeRegistered(), func(m *NodeRegistered) { m.Gpus[0].NvlinkPeers = []int32{1, 7} }), "gpus[0].nvlink_peers[1]: 7 is not a GPU of this node"},
		{"a one-way NVLink peer is rejected", with(validNodeRegistered(), func(m *NodeRegistered) { m.Gpus[1].NvlinkPeers = nil }), "gpus[0].nvlink_peers[0]: GPU 0 lists 1 as a peer"},
		{"a GPU linked to itself is rejected", with(validNodeRegistered(), func(m *NodeRegistered) { m.Gpus[0].NvlinkPeers = []int32{0, 1} }), "gpus[0].nvlink_peers[0]: 0 is the GPU itself"},
		{"an NVLink domain of one GPU is rejected", with(validNodeRegistered(), func(m *NodeRegistered) { m.NvlinkDomains[0].GpuIndexes = []int32{0} }), "nvlink_domains[0].gpu_indexes: 1 GPUs; a domain has at least 2"},
		{"a GPU in two NVLink domains is rejected", with(validNodeRegistered(), func(m *NodeRegistered) {
			m.NvlinkDomains = append(m.NvlinkDomains, &NVLinkDomain{GpuIndexes: []int32{1, 0}})
		}), "nvlink_domains[1].gpu_indexes[0]: GPU 1 is already in nvlink_domains[0]"},
		{"an NVLink domain naming a missing GPU is rejected", with(validNodeRegistered(), func(m *NodeRegistered) { m.NvlinkDomains[0].GpuIndexes = []int32{0, 5} }), "nvlink_domains[0].gpu_indexes[1]: 5 is not a GPU of this node"},
		// Node telemetry and health
		{"utilization above 100 percent is rejected", with(validNodeTelemetry(), func(m *NodeTelemetry) { m.Gpus[0].UtilizationPercent = 101 }), "gpus[0].utilization_percent: 101 is out of range 0..100"},
		{"a GPU sampled twice is rejected", with(validNodeTelemetry(), func(m *NodeTelemetry) { m.Gpus[1].GpuIndex = 0 }), "gpus[1].gpu_index: 0 is reported twice"},
		{"negative power is rejected", with(validNodeTelemetry(), func(m *NodeTelemetry) { m.Gpus[0].PowerMw = -1 }), "gpus[0].power_mw: -1 is negative"},
		{"a GPU index below -1 is rejected", with(validNodeHealthChanged(), func(m *NodeHealthChanged) { m.GpuIndex = -2 }), "gpu_index: -2 is out of range -1..63"},
		{"a health change to the same health is rejected", with(validNodeHealthChanged(), func(m *NodeHealthChanged) { m.PreviousHealth = Health_HEALTH_FAILED }), "health: HEALTH_FAILED equals previous_health"},
		{"an interruption without a deadline is rejected", with(validNodeInterruptionNoticed(), func(m *NodeInterruptionNoticed) { m.Deadline = nil }), "deadline: missing"},
		{"a node loss without a reason is rejected", with(validNodeLost(), func(m *NodeLost) { m.Reason = 0 }), "reason: missing (NODE_LOST_REASON_UNSPECIFIED)"},
		{"a node loss without a fenced epoch is rejected", with(validNodeLost(), func(m *NodeLost) { m.FencedEpoch = 0 }), "fenced_epoch: 0"},
		{"a drain without its start is rejected", with(validNodeDrained(), func(m *NodeDrained) { m.DrainStartedAt = nil }), "drain_started_at: missing"},
		// TrafficSampled
		{"a sample for a pool with a dot is rejected", with(validTrafficSampled(), func(m *TrafficSampled) { m.PoolId = "llama.70b" }), "pool_id: \"llama.70b\" contains \".\""},
		{"negative concurrent requests are rejected", with(validTrafficSampled(), func(m *TrafficSampled) { m.ConcurrentRequests = -1 }), "concurrent_requests: -1 is negative"},
		{"a NaN request rate is rejected", with(validTrafficSampled(), func(m *TrafficSampled) { m.RequestsPerSecond = math.NaN() }), "requests_per_second: NaN is not a finite number"},
		{"an infinite request rate is rejected", with(validTrafficSampled(), func(m *TrafficSampled) { m.RequestsPerSecond = math.Inf(1) }), "requests_per_second: +Inf is not a finite number"},
		{"a negative request rate is rejected", with(validTrafficSampled(), func(m *TrafficSampled) { m.RequestsPerSecond = -1 }), "requests_per_second: -1 is negative"},
		{"a negative p99 latency is rejected", with(validTrafficSampled(), func(m *TrafficSampled) { m.P99Latency = durationpb.New(-time.Millisecond) }), "p99_latency: -1ms is negative"},
		{"a sample without a window is rejected", with(validTrafficSampled(), func(m *TrafficSampled) { m.Window = nil }), "window: missing"},
		{"a sample over a zero window is rejected", with(validTrafficSampled(), func(m *TrafficSampled) { m.Window = durationpb.New(0) }), "window: zero"},
		// Scaling
		{"a decision without a rule is rejected", with(validScalingDecided(), func(m *ScalingDecided) { m.Rule = "" }), "rule: missing"},
		{"a decision to negative replicas is rejected", with(validScalingDecided(), func(m *ScalingDecided) { m.ToReplicas = -1 }), "to_replicas: -1 is negative"},
		{"a shortage for no rental is rejected", with(validCapacityShortage(), func(m *CapacityShortage) { m.RentalIds = nil }), "rental_ids: missing"},
		{"a shortage of no GPU is rejected", with(validCapacityShortage(), func(m *CapacityShortage) { m.Missing.GpuCount = 0 }), "missing.gpu_count: 0; a shortage misses at least one GPU"},
		{"a shortage without a vector is rejected", with(validCapacityShortage(), func(m *CapacityShortage) { m.Missing = nil }), "missing: missing"},
		{"a provisioning request for zero nodes is rejected", with(validNodeProvisionRequested(), func(m *NodeProvisionRequested) { m.Count = 0 }), "count: 0 is out of range"},
		{"a provisioning request without a market is rejected", with(validNodeProvisionRequested(), func(m *NodeProvisionRequested) { m.Market = 0 }), "market: missing"},
		{"a release request without a node is rejected", with(validNodeReleaseRequested(), func(m *NodeReleaseRequested) { m.NodeId = "" }), "node_id: missing"},
		// UsageRecorded
		{"usage with an empty interval is rejected", with(validUsageRecorded(), func(m *UsageRecorded) { m.IntervalEnd = m.IntervalStart }), "interval_end: 2026-11-30T12:00:00Z is not after interval_start"},
		{"usage without interval_start is rejected", with(validUsageRecorded(), func(m *UsageRecorded) { m.IntervalStart = nil }), "interval_start: missing"},
		{"usage billing more seconds than its interval is rejected", with(validUsageRecorded(), func(m *UsageRecorded) { m.Seconds = 61 }), "seconds: 61 is out of range 1..60"},
		{"usage billing zero seconds is rejected", with(validUsageRecorded(), func(m *UsageRecorded) { m.Seconds = 0 }), "seconds: 0 is out of range 1..60"},
		{"usage without a plan is rejected", with(validUsageRecorded(), func(m *UsageRecorded) { m.Plan = 0 }), "plan: missing (PLAN_UNSPECIFIED)"},
		{"usage of a fraction of two GPUs is rejected", with(validUsageRecorded(), func(m *UsageRecorded) { m.GpuCount, m.MilliGpu = 2, 500 }), "milli_gpu: 500 is a fraction"},
		{"usage with a negative amount is rejected", with(validUsageRecorded(), func(m *UsageRecorded) { m.Amount.Micros = -1 }), "amount.micros: -1 is negative"},
		{"usage without a unit price is rejected", with(validUsageRecorded(), func(m *UsageRecorded) { m.UnitPricePerGpuHour = nil }), "unit_price_per_gpu_hour: missing"},
		{"usage charged in another currency than priced is rejected", with(validUsageRecorded(), func(m *UsageRecorded) { m.Amount.Currency = "EUR" }), "amount.currency: \"EUR\" differs from unit_price_per_gpu_hour.currency \"USD\""},
		{"usage for a tenant with a space is rejected", with(validUsageRecorded(), func(m *UsageRecorded) { m.TenantId = "acme corp" }), "tenant_id: "},
		// BudgetThresholdCrossed
		{"a crossing below its threshold is rejected", with(validBudgetThresholdCrossed(), func(m *BudgetThresholdCrossed) { m.Spent.Micros = 1 }), "spent.micros: 1 is below the threshold 800000000"},
		{"a crossing of a zero threshold is rejected", with(validBudgetThresholdCrossed(), func(m *BudgetThresholdCrossed) { m.Threshold.Micros = 0; m.Spent.Micros = 0 }), "threshold.micros: 0 is not positive"},
		{"a percentage threshold without the budget's amount is rejected", with(validBudgetThresholdCrossed(), func(m *BudgetThresholdCrossed) { m.BudgetAmount = nil }), "budget_amount: missing: the threshold is a percentage (80)"},
		{"a crossing spent in another currency is rejected", with(validBudgetThresholdCrossed(), func(m *BudgetThresholdCrossed) { m.Spent.Currency = "EUR" }), "spent.currency: \"EUR\" differs from threshold.currency \"USD\""},
		{"a grace without the stop-running policy is rejected", with(validBudgetThresholdCrossed(), func(m *BudgetThresholdCrossed) {
			m.Policy, m.Grace = BudgetPolicy_BUDGET_POLICY_REJECT_NEW, durationpb.New(time.Minute)
		}), "grace: set, but policy is BUDGET_POLICY_REJECT_NEW; only BUDGET_POLICY_STOP_RUNNING has a grace"},
		{"an exhausted crossing below the budget's amount is rejected", with(validBudgetThresholdCrossed(), func(m *BudgetThresholdCrossed) {
			m.Policy, m.Exhausted = BudgetPolicy_BUDGET_POLICY_STOP_RUNNING, true
		}), "exhausted: set, but the threshold is not the budget's amount (100 %)"},
		{"an exhausted crossing under the alert policy is rejected", with(validBudgetThresholdCrossed(), func(m *BudgetThresholdCrossed) {
			m.Policy, m.Exhausted, m.ThresholdPercent, m.Threshold = BudgetPolicy_BUDGET_POLICY_ALERT, true, 100, m.BudgetAmount
		}), "exhausted: set, but policy is BUDGET_POLICY_ALERT, which stops nothing"},
		{"a crossing with an empty period is rejected", with(validBudgetThresholdCrossed(), func(m *BudgetThresholdCrossed) { m.PeriodEnd = m.PeriodStart }), "period_end: 2026-11-01T00:00:00Z is not after period_start"},
		// InvoiceClosed
		{"an invoice whose total is not the sum of its lines is rejected", with(validInvoiceClosed(), func(m *InvoiceClosed) { m.Total.Micros++ }), "total.micros: 3090001 differs from the sum of the line amounts 3090000"},
		{"an invoice line in another currency is rejected", with(validInvoiceClosed(), func(m *InvoiceClosed) { m.LineItems[1].Amount.Currency = "EUR" }), "line_items[1].amount.currency: \"EUR\" differs from total.currency \"USD\""},
		{"an invoice line without a plan is rejected", with(validInvoiceClosed(), func(m *InvoiceClosed) { m.LineItems[0].Plan = 0 }), "line_items[0].plan: missing"},
		{"an invoice ending before it starts is rejected", with(validInvoiceClosed(), func(m *InvoiceClosed) { m.PeriodEnd = m.PeriodStart }), "period_end: "},
		// SpotPriceChanged
		{"a start command without its placement is rejected", with(validStartRental(), func(m *StartRental) { m.Scheduled = nil }), "scheduled: missing"},
		{"a start command with a bad placement names the nested field", with(validStartRental(), func(m *StartRental) { m.Scheduled.NodeId = "a.b" }), "scheduled.node_id: "},
		{"a stop command without a reason is rejected", with(validStopRental(), func(m *StopRental) { m.Reason = ExitReason_EXIT_REASON_UNSPECIFIED }), "reason: "},
		{"a stop command with a negative grace period is rejected", with(validStopRental(), func(m *StopRental) { m.GracePeriod = durationpb.New(-time.Second) }), "grace_period: -1s is negative"},
		{"a drain without a deadline is rejected", with(validDrainNode(), func(m *DrainNode) { m.Deadline = nil }), "deadline: missing"},
		{"a spot price without a model is rejected", with(validSpotPriceChanged(), func(m *SpotPriceChanged) { m.Model = "" }), "model: missing"},
		{"a spot price for a wildcard zone is rejected", with(validSpotPriceChanged(), func(m *SpotPriceChanged) { m.Zone = "*" }), "zone: \"*\" contains \"*\""},
		{"a negative spot price is rejected", with(validSpotPriceChanged(), func(m *SpotPriceChanged) { m.PricePerGpuHour.Micros = -5 }), "price_per_gpu_hour.micros: -5 is negative"},
		{"a spot price without a currency is rejected", with(validSpotPriceChanged(), func(m *SpotPriceChanged) { m.PricePerGpuHour.Currency = "" }), "price_per_gpu_hour.currency: "},
		{"a spot price changing currency is rejected", with(validSpotPriceChanged(), func(m *SpotPriceChanged) { m.PreviousPricePerGpuHour.Currency = "EUR" }), "previous_price_per_gpu_hour.currency: \"EUR\" differs"},
		{"a spot price without effective_at is rejected", with(validSpotPriceChanged(), func(m *SpotPriceChanged) { m.EffectiveAt = nil }), "effective_at: missing"},
		{"a spot price without meta is rejected", with(validSpotPriceChanged(), func(m *SpotPriceChanged) { m.Meta = nil }), "meta: missing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantProblem(t, tt.msg.Validate(), tt.want)
		})
	}
}

func TestValidToken(t *testing.T) {
	tests := []struct {
		name  string
		token string
		ok    bool
	}{
		{"a plain id is a token", "acme", true},
		{"dashes, underscores, colons and digits are allowed", "gpu-node_17:a", true},
		{"128 bytes are allowed", strings.Repeat("a", 128), true},
		{"an empty id is not a token", "", false},
		{"129 bytes are too long", strings.Repeat("a", 129), false},
		{"a dot would split the subject", "a.b", false},
		{"a star would widen a subscription", "*", false},
		{"a greater-than would widen a subscription", "a>", false},
		{"a space is not allowed", "a b", false},
		{"a tab is not allowed", "a\tb", false},
		{"a newline is not allowed", "a\n", false},
		{"a delete character is not allowed", "a\x7f", false},
		{"non-ASCII letters are not allowed", "ñandú", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidToken(tt.token)
			if (err == nil) != tt.ok {
				t.Fatalf("ValidToken(%q) = %v, want ok=%v", tt.token, err, tt.ok)
			}
		})
	}
}

func TestEventValidationAcceptsTheVariantsTheContractAllows(t *testing.T) {
	tests := []struct {
		name string
		msg  validator
	}{
		{"a MIG placement with an instance of the requested profile passes", with(validRentalScheduled(), func(m *RentalScheduled) {
			m.Spec.MigProfile = "1g.10gb"
			m.Gpus[0].MigInstance = &MigInstance{Uuid: "MIG-1", Profile: "1g.10gb", GpuInstanceId: 9, VramMib: 9856}
		})},
		{"a pending notice without a missing vector or deadline passes", with(validRentalPending(), func(m *RentalPending) {
			m.Reason, m.Missing, m.Deadline = PendingReason_PENDING_REASON_QUOTA, nil, nil
		})},
		{"a stop at the instant of its start passes", with(validRentalStopped(), func(m *RentalStopped) { m.StoppedAt = m.StartedAt })},
		{"a failed stop with a non-zero exit code passes", with(validRentalStopped(), func(m *RentalStopped) {
			m.ExitReason, m.ExitCode = ExitReason_EXIT_REASON_FAILED, 137
		})},
		{"a migration with zero downtime and no checkpoint passes", with(validRentalMigrated(), func(m *RentalMigrated) {
			m.Downtime, m.CheckpointUri = durationpb.New(0), ""
		})},
		{"a first health report after registration passes", with(validNodeHealthChanged(), func(m *NodeHealthChanged) {
			m.PreviousHealth = Health_HEALTH_UNSPECIFIED
		})},
		{"a health change of the whole node passes", with(validNodeHealthChanged(), func(m *NodeHealthChanged) { m.GpuIndex = -1 })},
		{"a node without NVLink passes", with(validNodeRegistered(), func(m *NodeRegistered) {
			m.NvlinkDomains = nil
			for _, g := range m.Gpus {
				g.NvlinkPeers = nil
			}
		})},
		{"a free spot node passes", with(validNodeRegistered(), func(m *NodeRegistered) {
			m.Market, m.PricePerGpuHour = Market_MARKET_SPOT, usd(0)
		})},
		{"a traffic sample in which nothing completed passes", with(validTrafficSampled(), func(m *TrafficSampled) {
			m.RequestsPerSecond, m.P99Latency = 0, nil
		})},
		{"usage of a tenth of a GPU for part of a second passes", with(validUsageRecorded(), func(m *UsageRecorded) {
			m.MilliGpu, m.IntervalEnd, m.Seconds, m.Amount = 100, at(300*time.Millisecond), 1, usd(69)
		})},
		{"the first spot price of a model and zone passes", with(validSpotPriceChanged(), func(m *SpotPriceChanged) { m.PreviousPricePerGpuHour = nil })},
		{"an empty invoice passes", with(validInvoiceClosed(), func(m *InvoiceClosed) { m.LineItems, m.Total = nil, usd(0) })},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.msg.Validate(); err != nil {
				t.Fatalf("Validate() = %v, want nil", err)
			}
		})
	}
}
