package app

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// A start or stop merged for a placement whose RentalScheduled metering
// has not seen is parked in its segment until the schedule comes (events
// of one rental may be handled out of order by concurrent batches). Each
// is counted and logged when merged; once the park grace has passed by
// the watermark and the clock (ledger.ParkingOf) it is dead-lettered with
// the reason and dropped, so a lost RentalScheduled leaves a trace
// instead of a bill that silently never comes.

// noteParked counts and logs the merged states that wait for their
// schedule.
func (m *Meter) noteParked(ctx context.Context, states []ledger.SegmentState) {
	for _, st := range states {
		if since, parked := ledger.ParkedSince(st); parked {
			m.metrics.parked.Add(ctx, 1)
			m.log.InfoContext(ctx, "rental event parked until its RentalScheduled arrives", "rental", st.RentalID,
				"attempt", st.Attempt, "node", st.StartNode, "since", since, "grace", m.parkGrace)
		}
	}
}

// giveUp dead-letters what metering knows of a parked placement past the
// grace, then drops it. The copy goes first: if the drop fails, the next
// look publishes it again under the same id (stored once). A schedule
// merged between the two keeps the segment, which is then billed normally.
func (m *Meter) giveUp(ctx context.Context, st ledger.SegmentState) error {
	since, _ := ledger.ParkedSince(st)
	dlq, err := subject.Format(subject.DeadLetter, topology.StreamRentals, topology.Metering)
	if err != nil {
		return err
	}
	ev, what := m.parkedEvent(st)
	reason := fmt.Sprintf("rental %s attempt %d: %s, but no RentalScheduled was seen within the park grace (%s) after it: "+
		"the placement cannot be priced and is not billed; its parked events were dropped", st.RentalID, st.Attempt, what, m.parkGrace)
	if err := m.pub.DeadLetter(ctx, DeadLetter{Subject: dlq, ID: fmt.Sprintf("dlq:%s:%s:unscheduled:%s:%d", topology.StreamRentals, topology.Metering, st.RentalID, st.Attempt),
		Event: ev, Stream: topology.StreamRentals, Consumer: topology.Metering, Reason: reason}); err != nil {
		return fmt.Errorf("dead-letter unscheduled rental %s attempt %d: %w", st.RentalID, st.Attempt, err)
	}
	dropped, err := m.store.DropParked(ctx, ledger.SegmentRef{RentalID: st.RentalID, Attempt: st.Attempt})
	if err != nil {
		return err
	}
	if !dropped {
		m.log.InfoContext(ctx, "RentalScheduled arrived as a parked placement was given up: billed normally", "rental", st.RentalID, "attempt", st.Attempt)
		return nil
	}
	m.metrics.givenUp.Add(ctx, 1)
	m.log.ErrorContext(ctx, "rental events without their RentalScheduled given up: not billed, dead-lettered", "rental", st.RentalID,
		"attempt", st.Attempt, "node", st.StartNode, "since", since, "reason", reason)
	return nil
}

// parkedEvent rebuilds the lifecycle event metering knows of a parked
// placement (its stop when one came, else its start) for the dead letter,
// and says what it was. The tenant is not known without the schedule.
func (m *Meter) parkedEvent(st ledger.SegmentState) (proto.Message, string) {
	if !st.StoppedAt.IsZero() {
		return &shizuv1.RentalStopped{
			Meta:     shizuv1.NewMeta(fmt.Sprintf("rental:%s:stopped:%d", st.RentalID, st.Attempt), m.source, "", st.RentalID, st.StoppedAt),
			RentalId: st.RentalID, NodeId: st.StartNode, StartedAt: timestamppb.New(st.Start()), StoppedAt: timestamppb.New(st.StoppedAt),
			ExitReason: st.ExitReason, Attempt: st.Attempt,
		}, fmt.Sprintf("started at %s and stopped at %s", st.Start().Format(time.RFC3339Nano), st.StoppedAt.Format(time.RFC3339Nano))
	}
	return &shizuv1.RentalStarted{
		Meta:     shizuv1.NewMeta(fmt.Sprintf("rental:%s:started:%d", st.RentalID, st.Attempt), m.source, "", st.RentalID, st.StartedAt),
		RentalId: st.RentalID, NodeId: st.StartNode, StartedAt: timestamppb.New(st.StartedAt), Attempt: st.Attempt,
	}, fmt.Sprintf("started at %s on node %s", st.StartedAt.Format(time.RFC3339Nano), st.StartNode)
}
