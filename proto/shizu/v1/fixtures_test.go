package shizuv1

import (
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Fixture builders: each returns a fresh, valid event that a test changes
// in one place.

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// at is t0 plus d as a Timestamp.
func at(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(t0.Add(d)) }

func usd(micros int64) *Money { return &Money{Micros: micros, Currency: "USD"} }

// with applies mutate to m and returns it, so table cases read as
// "the valid default, with this one change".
func with[T any](m T, mutate func(T)) T {
	mutate(m)
	return m
}

func validMeta() *EventMeta {
	return &EventMeta{
		EventId:       "0193a6c2-7f1e-7c3a-9b2d-5e4f3a2b1c0d",
		OccurredAt:    at(0),
		Source:        "scheduler",
		CorrelationId: "r-42",
	}
}

// validSpec is one whole GPU, on demand.
func validSpec() *RentalSpec {
	return &RentalSpec{
		GpuCount: 1,
		MilliGpu: 1000,
		Plan:     Plan_PLAN_ON_DEMAND,
	}
}

func validRentalRequested() *RentalRequested {
	return &RentalRequested{Meta: validMeta(), RentalId: "r-42", TenantId: "acme", Spec: validSpec()}
}

func validRentalScheduled() *RentalScheduled {
	return &RentalScheduled{
		Meta:      validMeta(),
		RentalId:  "r-42",
		TenantId:  "acme",
		NodeId:    "gpu-node-17",
		NodeEpoch: 3,
		Gpus: []*GpuAssignment{
			{GpuIndex: 0, GpuUuid: "GPU-5f2b7c1e-93a4-6b8d-0e1f-2a3b4c5d6e7f", MilliGpu: 1000, VramMib: 81559},
		},
		CpuMilli:  8000,
		MemoryMib: 65536,
		Spec:      validSpec(),
		GpuModel:  "H100-SXM5-80GB",
		Zone:      "eu-west-1a",
		Attempt:   1,
	}
}

func validRentalPending() *RentalPending {
	return &RentalPending{
		Meta:     validMeta(),
		RentalId: "r-42",
		TenantId: "acme",
		Reason:   PendingReason_PENDING_REASON_NO_CAPACITY,
		Missing:  &ResourceVector{GpuCount: 1, MilliGpu: 1000, Market: Market_MARKET_ON_DEMAND},
		Deadline: at(10 * time.Minute),
	}
}

func validRentalRejected() *RentalRejected {
	return &RentalRejected{
		Meta:     validMeta(),
		RentalId: "r-42",
		TenantId: "acme",
		Reason:   RejectReason_REJECT_REASON_PENDING_TIMEOUT,
		Message:  "no H100 free in eu-west-1a for 10m",
	}
}

func validRentalStarted() *RentalStarted {
	return &RentalStarted{
		Meta:      validMeta(),
		RentalId:  "r-42",
		TenantId:  "acme",
		NodeId:    "gpu-node-17",
		NodeEpoch: 3,
		StartedAt: at(time.Second),
		GpuUuids:  []string{"GPU-5f2b7c1e-93a4-6b8d-0e1f-2a3b4c5d6e7f"},
		Attempt:   1,
	}
}

func validRentalStopped() *RentalStopped {
	return &RentalStopped{
		Meta:       validMeta(),
		RentalId:   "r-42",
		TenantId:   "acme",
		NodeId:     "gpu-node-17",
		NodeEpoch:  3,
		StartedAt:  at(time.Second),
		StoppedAt:  at(time.Hour),
		ExitReason: ExitReason_EXIT_REASON_COMPLETED,
		Attempt:    1,
	}
}

func validRentalPreempted() *RentalPreempted {
	return &RentalPreempted{
		Meta:               validMeta(),
		RentalId:           "r-42",
		TenantId:           "acme",
		NodeId:             "gpu-node-17",
		NodeEpoch:          3,
		NoticeDeadline:     at(30 * time.Second),
		Reason:             PreemptReason_PREEMPT_REASON_HIGHER_PRIORITY,
		PreemptingRentalId: "r-43",
	}
}

func validRentalMigrating() *RentalMigrating {
	return &RentalMigrating{
		Meta:            validMeta(),
		RentalId:        "r-42",
		TenantId:        "acme",
		FromNodeId:      "gpu-node-17",
		FromNodeEpoch:   3,
		Reason:          MigrationReason_MIGRATION_REASON_NODE_LOST,
		LastHeartbeatAt: at(-5 * time.Second),
		CheckpointUri:   "s3://acme-ckpt/run-7/",
		Spec:            validSpec(),
		FromAttempt:     1,
		NextAttempt:     2,
	}
}

func validRentalMigrated() *RentalMigrated {
	return &RentalMigrated{
		Meta:          validMeta(),
		RentalId:      "r-42",
		TenantId:      "acme",
		FromNodeId:    "gpu-node-17",
		ToNodeId:      "gpu-node-18",
		ToNodeEpoch:   1,
		Downtime:      durationpb.New(4 * time.Second),
		CheckpointUri: "s3://acme-ckpt/run-7/",
	}
}

func validRentalCancelRequested() *RentalCancelRequested {
	return &RentalCancelRequested{
		Meta:        validMeta(),
		RentalId:    "r-42",
		TenantId:    "acme",
		RequestedBy: "user-7",
	}
}

// validNodeRegistered is a two-GPU on-demand node whose GPUs share one
// NVLink domain.
func validNodeRegistered() *NodeRegistered {
	return &NodeRegistered{
		Meta:            validMeta(),
		NodeId:          "gpu-node-17",
		Epoch:           3,
		Zone:            "eu-west-1a",
		Market:          Market_MARKET_ON_DEMAND,
		PricePerGpuHour: usd(2_490_000),
		CpuMilli:        96_000,
		MemoryMib:       1 << 20,
		Gpus: []*Gpu{
			{
				Index: 0, Uuid: "GPU-00000000-0000-0000-0000-000000000000", Model: "H100-SXM5-80GB",
				ProductName: "NVIDIA H100 80GB HBM3", VramMib: 81559, PciBusId: "00000000:3B:00.0",
				MigCapable: true, NvlinkPeers: []int32{1}, Capabilities: []string{"fp8"},
			},
			{
				Index: 1, Uuid: "GPU-11111111-1111-1111-1111-111111111111", Model: "H100-SXM5-80GB",
				ProductName: "NVIDIA H100 80GB HBM3", VramMib: 81559, PciBusId: "00000000:5D:00.0",
				MigCapable: true, NvlinkPeers: []int32{0}, Capabilities: []string{"fp8"},
				MigEnabled: true, MigInstances: []*MigInstance{
					{Uuid: "MIG-22222222-2222-2222-2222-222222222222", Profile: "3g.40gb", GpuInstanceId: 2, ComputeInstanceId: 0, VramMib: 40192},
					{Uuid: "MIG-33333333-3333-3333-3333-333333333333", Profile: "1g.10gb", GpuInstanceId: 9, ComputeInstanceId: 0, VramMib: 9856},
				},
			},
		},
		NvlinkDomains: []*NVLinkDomain{{GpuIndexes: []int32{0, 1}}},
		InstanceType:  "p5.48xlarge",
	}
}

func validNodeTelemetry() *NodeTelemetry {
	return &NodeTelemetry{
		Meta:   validMeta(),
		NodeId: "gpu-node-17",
		Epoch:  3,
		Gpus: []*GpuTelemetry{
			{GpuIndex: 0, UtilizationPercent: 97, VramUsedMib: 70000, TemperatureC: 71, PowerMw: 650_000},
			{GpuIndex: 1, UtilizationPercent: 0, VramUsedMib: 0, TemperatureC: 34, PowerMw: 70_000},
		},
	}
}

func validNodeHealthChanged() *NodeHealthChanged {
	return &NodeHealthChanged{
		Meta:           validMeta(),
		NodeId:         "gpu-node-17",
		Epoch:          3,
		GpuIndex:       1,
		PreviousHealth: Health_HEALTH_HEALTHY,
		Health:         Health_HEALTH_FAILED,
		Xid:            79,
		Reason:         "GPU has fallen off the bus",
	}
}

func validNodeInterruptionNoticed() *NodeInterruptionNoticed {
	return &NodeInterruptionNoticed{Meta: validMeta(), NodeId: "gpu-node-17", Epoch: 3, Deadline: at(2 * time.Minute)}
}

func validNodeLost() *NodeLost {
	return &NodeLost{
		Meta:            validMeta(),
		NodeId:          "gpu-node-17",
		FencedEpoch:     3,
		Reason:          NodeLostReason_NODE_LOST_REASON_HEARTBEAT_EXPIRED,
		LastHeartbeatAt: at(-5 * time.Second),
	}
}

func validNodeDrained() *NodeDrained {
	return &NodeDrained{Meta: validMeta(), NodeId: "gpu-node-17", Epoch: 3, DrainStartedAt: at(-time.Hour), Reason: "scale-in"}
}

func validTrafficSampled() *TrafficSampled {
	return &TrafficSampled{
		Meta:               validMeta(),
		PoolId:             "llama-70b",
		ConcurrentRequests: 120,
		RequestsPerSecond:  35.5,
		P99Latency:         durationpb.New(850 * time.Millisecond),
		Window:             durationpb.New(10 * time.Second),
	}
}

func validScalingDecided() *ScalingDecided {
	return &ScalingDecided{
		Meta:          validMeta(),
		PoolId:        "llama-70b",
		FromReplicas:  2,
		ToReplicas:    3,
		Rule:          "rps-high",
		Metric:        "requests_per_second",
		ObservedValue: 35.5,
		Threshold:     30,
	}
}

func validCapacityShortage() *CapacityShortage {
	return &CapacityShortage{
		Meta:      validMeta(),
		Missing:   &ResourceVector{GpuCount: 8, MilliGpu: 1000, Models: []string{"H100-SXM5-80GB"}, Interconnect: Interconnect_INTERCONNECT_NVLINK},
		RentalIds: []string{"r-42"},
	}
}

func validNodeProvisionRequested() *NodeProvisionRequested {
	return &NodeProvisionRequested{
		Meta:         validMeta(),
		PoolId:       "fleet",
		InstanceType: "p5.48xlarge",
		Market:       Market_MARKET_SPOT,
		Zone:         "eu-west-1a",
		Count:        1,
	}
}

func validNodeReleaseRequested() *NodeReleaseRequested {
	return &NodeReleaseRequested{Meta: validMeta(), PoolId: "fleet", NodeId: "gpu-node-17"}
}

// validUsageRecorded is one whole GPU for one minute at 2.49 USD per
// GPU-hour.
func validUsageRecorded() *UsageRecorded {
	return &UsageRecorded{
		Meta:                validMeta(),
		RentalId:            "r-42",
		TenantId:            "acme",
		NodeId:              "gpu-node-17",
		Plan:                Plan_PLAN_ON_DEMAND,
		Model:               "H100-SXM5-80GB",
		IntervalStart:       at(0),
		IntervalEnd:         at(time.Minute),
		Seconds:             60,
		MilliGpu:            1000,
		GpuCount:            1,
		UnitPricePerGpuHour: usd(2_490_000),
		Amount:              usd(41_500),
		Labels:              map[string]string{"team": "vision"},
	}
}

func validInvoiceClosed() *InvoiceClosed {
	return &InvoiceClosed{
		Meta:        validMeta(),
		InvoiceId:   "inv-acme-2026-11",
		TenantId:    "acme",
		PeriodStart: timestamppb.New(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)),
		PeriodEnd:   timestamppb.New(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)),
		LineItems: []*InvoiceLineItem{
			{Plan: Plan_PLAN_ON_DEMAND, Model: "H100-SXM5-80GB", MilliGpuSeconds: 3_600_000, Amount: usd(2_490_000)},
			{Plan: Plan_PLAN_SPOT, Model: "H100-SXM5-80GB", MilliGpuSeconds: 1_800_000, Amount: usd(600_000)},
		},
		Total: usd(3_090_000),
	}
}

// validBudgetThresholdCrossed is acme's 80 % threshold of a 1,000 USD
// budget for November 2026, crossed at 812.50 USD.
func validBudgetThresholdCrossed() *BudgetThresholdCrossed {
	return &BudgetThresholdCrossed{
		Meta:             validMeta(),
		TenantId:         "acme",
		BudgetId:         "monthly",
		PeriodStart:      timestamppb.New(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)),
		PeriodEnd:        timestamppb.New(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)),
		Threshold:        usd(800_000_000),
		ThresholdPercent: 80,
		BudgetAmount:     usd(1_000_000_000),
		Spent:            usd(812_500_000),
	}
}

func validSpotPriceChanged() *SpotPriceChanged {
	return &SpotPriceChanged{
		Meta:                    validMeta(),
		Model:                   "H100-SXM5-80GB",
		Zone:                    "eu-west-1a",
		PricePerGpuHour:         usd(1_200_000),
		PreviousPricePerGpuHour: usd(1_100_000),
		EffectiveAt:             at(0),
	}
}

func validStartRental() *StartRental {
	return &StartRental{Meta: validMeta(), Scheduled: validRentalScheduled()}
}

func validStopRental() *StopRental {
	return &StopRental{
		Meta:        validMeta(),
		RentalId:    "r-42",
		TenantId:    "acme",
		NodeId:      "gpu-node-17",
		Attempt:     1,
		Reason:      ExitReason_EXIT_REASON_CANCELLED,
		GracePeriod: durationpb.New(30 * time.Second),
	}
}

func validDrainNode() *DrainNode {
	return &DrainNode{Meta: validMeta(), NodeId: "gpu-node-17", Epoch: 3, Deadline: at(2 * time.Minute)}
}
