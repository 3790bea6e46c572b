package app

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/ports"
	"github.com/shizu-gpu/shizu/services/scheduler/round"
	"github.com/shizu-gpu/shizu/services/scheduler/view"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// BusPublisher is the ports.Publisher of the real service: batches of
// bus.Conn.
type BusPublisher struct{ Conn *bus.Conn }

// NewBatch implements ports.Publisher.
func (p BusPublisher) NewBatch() ports.Batch { return busBatch{p.Conn.NewBatch()} }

type busBatch struct{ b *bus.Batch }

func (b busBatch) Publish(ctx context.Context, subj string, ev proto.Message) error {
	return b.b.Publish(ctx, subj, ev)
}

func (b busBatch) Wait(ctx context.Context) error {
	_, err := b.b.Wait(ctx)
	return err
}

// The events of the scheduler, built from what a round or a handler
// decided. Each event id is fixed by what it announces, so a repeat (a
// redelivery, another replica) is stored once.

func (s *Scheduler) publish(ctx context.Context, b ports.Batch, format string, tokens []string, ev proto.Message) error {
	subj, err := subject.Format(format, tokens...)
	if err != nil {
		return fault.Invalid("%w", err)
	}
	return b.Publish(ctx, subj, ev)
}

func (s *Scheduler) queueRejected(ctx context.Context, b ports.Batch, ev *shizuv1.RentalRequested, reason shizuv1.RejectReason, msg string) error {
	return s.publish(ctx, b, subject.RentalRejected, []string{ev.GetTenantId()}, &shizuv1.RentalRejected{
		Meta:     shizuv1.NewMeta("rental:"+ev.GetRentalId()+":rejected", s.source, ev.GetMeta().GetEventId(), ev.GetRentalId(), s.d.Now()),
		RentalId: ev.GetRentalId(), TenantId: ev.GetTenantId(), Reason: reason, Message: shizuv1.Truncate(msg, 1000),
	})
}

func (s *Scheduler) queueCancelled(ctx context.Context, b ports.Batch, ev *shizuv1.RentalCancelRequested, msg string) error {
	return s.publish(ctx, b, subject.RentalRejected, []string{ev.GetTenantId()}, &shizuv1.RentalRejected{
		Meta:     shizuv1.NewMeta("rental:"+ev.GetRentalId()+":rejected", s.source, ev.GetMeta().GetEventId(), ev.GetRentalId(), s.d.Now()),
		RentalId: ev.GetRentalId(), TenantId: ev.GetTenantId(), Reason: shizuv1.RejectReason_REJECT_REASON_CANCELLED, Message: msg,
	})
}

func (s *Scheduler) queueStop(ctx context.Context, b ports.Batch, ev *shizuv1.RentalCancelRequested, node string, attempt int32) error {
	return s.publish(ctx, b, subject.AgentCmd, []string{node, "stop"}, &shizuv1.StopRental{
		Meta:     shizuv1.NewMeta(fmt.Sprintf("cmd:stop:%s:%d", ev.GetRentalId(), attempt), s.source, ev.GetMeta().GetEventId(), ev.GetRentalId(), s.d.Now()),
		RentalId: ev.GetRentalId(), TenantId: ev.GetTenantId(), NodeId: node, Attempt: attempt,
		Reason: shizuv1.ExitReason_EXIT_REASON_CANCELLED, GracePeriod: durationpb.New(30 * time.Second),
	})
}

// queueScheduled queues a placement's RentalScheduled and its node's
// StartRental.
func (s *Scheduler) queueScheduled(ctx context.Context, b ports.Batch, sched *shizuv1.RentalScheduled) error {
	if err := s.publish(ctx, b, subject.RentalScheduled, []string{sched.GetTenantId()}, sched); err != nil {
		return err
	}
	return s.publish(ctx, b, subject.AgentCmd, []string{sched.GetNodeId(), "start"}, &shizuv1.StartRental{
		Meta: shizuv1.NewMeta(fmt.Sprintf("cmd:start:%s:%d", sched.GetRentalId(), sched.GetAttempt()), s.source,
			sched.GetMeta().GetEventId(), sched.GetRentalId(), sched.GetMeta().GetOccurredAt().AsTime()),
		Scheduled: sched,
	})
}

// queuePending queues a wait's RentalPending, and its CapacityShortage
// when it waits for capacity.
func (s *Scheduler) queuePending(ctx context.Context, b ports.Batch, p round.Pending[*job], now time.Time) error {
	j := p.Job
	vec := vectorOf(&j.Request, p.Missing)
	if err := s.publish(ctx, b, subject.RentalPending, []string{j.Event.GetTenantId()}, &shizuv1.RentalPending{
		Meta:     shizuv1.NewMeta(fmt.Sprintf("rental:%s:pending:%d", j.Request.ID, p.Reason), s.source, j.Event.GetMeta().GetEventId(), j.Request.ID, now),
		RentalId: j.Request.ID, TenantId: j.Request.Tenant, Reason: p.Reason, Missing: vec,
		Deadline: timestamppb.New(j.Deadline), Message: p.Message(),
	}); err != nil {
		return err
	}
	if !p.Shortage() {
		return nil
	}
	return b.Publish(ctx, subject.CapacityShortage, &shizuv1.CapacityShortage{
		Meta:    shizuv1.NewMeta("shortage:"+j.Request.ID, s.source, j.Event.GetMeta().GetEventId(), j.Request.ID, now),
		Missing: vec, RentalIds: []string{j.Request.ID},
	})
}

// queuePreemption queues the RentalPreempted of each victim of a
// preemption started for j.
func (s *Scheduler) queuePreemption(ctx context.Context, b ports.Batch, j *job, p *round.Preempt, now time.Time) error {
	for _, v := range p.Victims {
		if err := s.publish(ctx, b, subject.RentalPreempted, []string{v.Tenant}, &shizuv1.RentalPreempted{
			Meta:     shizuv1.NewMeta(fmt.Sprintf("rental:%s:preempted:%s", v.RentalID, j.Request.ID), s.source, j.Event.GetMeta().GetEventId(), v.RentalID, now),
			RentalId: v.RentalID, TenantId: v.Tenant, NodeId: p.NodeID, NodeEpoch: int64(p.NodeEpoch),
			NoticeDeadline: timestamppb.New(p.NoticeDeadline),
			Reason:         shizuv1.PreemptReason_PREEMPT_REASON_HIGHER_PRIORITY, PreemptingRentalId: j.Request.ID,
			Message: fmt.Sprintf("preempted for a %s rental", j.Request.Class),
		}); err != nil {
			return err
		}
		s.metrics.preempted(ctx)
	}
	return nil
}

// scheduledOf builds the RentalScheduled event of an allocation (the one
// the store recorded, which for a repeated request is the first one).
func scheduledOf(ev *shizuv1.RentalRequested, a capacity.Allocation, node *view.Facts, attempt int32, source string, now time.Time) *shizuv1.RentalScheduled {
	spec := ev.GetSpec()
	out := &shizuv1.RentalScheduled{
		Meta:     shizuv1.NewMeta(fmt.Sprintf("rental:%s:scheduled:%d", ev.GetRentalId(), attempt), source, ev.GetMeta().GetEventId(), ev.GetRentalId(), now),
		RentalId: ev.GetRentalId(), TenantId: ev.GetTenantId(), NodeId: a.NodeID, NodeEpoch: int64(a.Epoch),
		CpuMilli: a.CPUMilli, MemoryMib: a.MemoryMiB, Spec: spec, Attempt: attempt,
	}
	if node != nil {
		out.Zone = node.Zone
	}
	for _, g := range a.GPUs {
		as := &shizuv1.GpuAssignment{GpuIndex: int32(g.Index), MilliGpu: spec.GetMilliGpu(), VramMib: g.VRAMMiB}
		if node != nil && g.Index < len(node.GPUs) {
			as.GpuUuid = node.GPUs[g.Index].UUID
			out.GpuModel = node.GPUs[g.Index].Model
		}
		if g.MIGProfile != "" {
			// The instance the store gave the rental; the agent runs it there.
			as.MigInstance = &shizuv1.MigInstance{Uuid: g.MIGInstance, Profile: g.MIGProfile, VramMib: g.VRAMMiB}
		}
		out.Gpus = append(out.Gpus, as)
	}
	return out
}
