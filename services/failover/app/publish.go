package app

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/failover/detect"
	"github.com/shizu-gpu/shizu/services/failover/migrate"
	"github.com/shizu-gpu/shizu/shared/bus"
)

// eventBatch is what failover needs of the bus to publish: events queued
// together and acknowledged together (the NodeLost of a tick with the
// hand-over of its moves). Every event has a fixed id, so a retried batch
// is deduplicated. Its contract suite is failovertest.RunEventBatchContract.
type eventBatch interface {
	// Publish queues ev; it fails only when ev can never be published
	// (fault.Invalid: no event id, cannot be encoded).
	Publish(ctx context.Context, subject string, ev proto.Message) error
	// Len is the number of queued events.
	Len() int
	// Wait returns once every queued event is acknowledged, or with the
	// first failure; the batch is empty after it.
	Wait(ctx context.Context) error
}

// busBatch is an eventBatch on the bus (an async publish batch).
type busBatch struct{ b *bus.Batch }

func newBusBatch(c *bus.Conn) eventBatch { return busBatch{b: c.NewBatch()} }

func (b busBatch) Publish(ctx context.Context, subject string, ev proto.Message) error {
	return b.b.Publish(ctx, subject, ev)
}

func (b busBatch) Len() int { return b.b.Len() }

func (b busBatch) Wait(ctx context.Context) error {
	_, err := b.b.Wait(ctx)
	return err
}

// The events failover publishes; source names the replica.

func lostReason(r detect.Reason) shizuv1.NodeLostReason {
	switch r {
	case detect.ReasonFatalHealth:
		return shizuv1.NodeLostReason_NODE_LOST_REASON_FATAL_HEALTH
	case detect.ReasonDisconnected:
		return shizuv1.NodeLostReason_NODE_LOST_REASON_AGENT_DISCONNECTED
	case detect.ReasonDeadlinePassed:
		return shizuv1.NodeLostReason_NODE_LOST_REASON_DEADLINE_PASSED
	}
	return shizuv1.NodeLostReason_NODE_LOST_REASON_HEARTBEAT_EXPIRED
}

// nodeLostID is the event id of a node's loss at epoch (also the cause of
// the moves the sweep finds orphaned there).
func nodeLostID(node string, epoch uint64) string { return fmt.Sprintf("node:%s:lost:%d", node, epoch) }

func nodeLost(l detect.Loss, epoch uint64, rentals int, source string) *shizuv1.NodeLost {
	return &shizuv1.NodeLost{
		Meta:            shizuv1.NewMeta(nodeLostID(l.Node, epoch), source, "", l.Node, l.ConfirmedAt),
		NodeId:          l.Node,
		FencedEpoch:     int64(epoch),
		Reason:          lostReason(l.Reason),
		Message:         fmt.Sprintf("%s; %d rentals move", l.Reason, rentals),
		LastHeartbeatAt: tsOrNil(l.LastBeat),
	}
}

// rentalMigrating hands m to the scheduler; the spec comes from the
// rental's placement (the same for every attempt), when failover saw it,
// with at least the GPU memory it ran with (migrate.ReplacementSpec), and
// the GPU model it ran on, for the scheduler to prefer.
func rentalMigrating(m migrate.Record, pl migrate.Placement, known bool, source string) *shizuv1.RentalMigrating {
	id := fmt.Sprintf("rental:%s:migrating:%d", m.Rental, m.NextAttempt)
	if m.NextAttempt == 0 {
		id = fmt.Sprintf("rental:%s:migrating:%s:%d", m.Rental, m.FromNode, m.FromEpoch)
	}
	ev := &shizuv1.RentalMigrating{
		Meta:     shizuv1.NewMeta(id, source, m.Cause, m.Rental, m.DecidedAt),
		RentalId: m.Rental, TenantId: m.Tenant, FromNodeId: m.FromNode, FromNodeEpoch: int64(m.FromEpoch),
		Reason: shizuv1.MigrationReason(m.Reason), LastHeartbeatAt: tsOrNil(m.LastBeat),
		FromAttempt: m.FromAttempt, NextAttempt: m.NextAttempt,
	}
	if known {
		ev.Spec = migrate.ReplacementSpec(pl)
		ev.CheckpointUri = pl.Spec.GetCheckpointUri()
		ev.FromGpuModel = pl.Model
	}
	return ev
}

// stopRental tells the old node's agent to stop m's old run.
func stopRental(m migrate.Record, reason shizuv1.ExitReason, grace time.Duration, at time.Time, source string) *shizuv1.StopRental {
	return &shizuv1.StopRental{
		Meta:     shizuv1.NewMeta(fmt.Sprintf("cmd:stop:%s:%d", m.Rental, m.FromAttempt), source, m.Cause, m.Rental, at),
		RentalId: m.Rental, TenantId: m.Tenant, NodeId: m.FromNode, Attempt: m.FromAttempt,
		Reason: reason, GracePeriod: durationpb.New(grace),
	}
}

// rentalMigrated completes m: its next attempt started.
func rentalMigrated(m migrate.Record, started *shizuv1.RentalStarted, down time.Duration, checkpoint, cause, source string,
	at time.Time) *shizuv1.RentalMigrated {
	return &shizuv1.RentalMigrated{
		Meta:     shizuv1.NewMeta(fmt.Sprintf("rental:%s:migrated:%d", m.Rental, started.GetAttempt()), source, cause, m.Rental, at),
		RentalId: m.Rental, TenantId: m.Tenant, FromNodeId: m.FromNode, ToNodeId: started.GetNodeId(),
		ToNodeEpoch: started.GetNodeEpoch(), Downtime: durationpb.New(down), CheckpointUri: checkpoint,
	}
}

func tsOrNil(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}
