package app

import (
	"context"

	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/fault"
)

// onStoppedRaw decodes and validates a RentalStopped as bus.On does, except
// for a stop stamped before its start: an agent whose wall clock stepped
// back during a short run stamps exactly that, and the run did end. Such a
// stop is handled as a stop at its start (the last time it can be trusted)
// and flagged (a warning and shizu.failover.clamped_stops), not
// dead-lettered: dead-lettering it would keep a handed-over allocation
// forever. Anything else invalid is dead-lettered as before.
func (f *Failover) onStoppedRaw(ctx context.Context, d bus.Delivery) error {
	ev := &shizuv1.RentalStopped{}
	if err := proto.Unmarshal(d.Data, ev); err != nil {
		return fault.Invalid("decode %s: %w", rentalStoppedName, err)
	}
	clamped := shizuv1.ClampStop(ev)
	if err := ev.Validate(); err != nil {
		return fault.Invalid("validate %s: %w", rentalStoppedName, err)
	}
	if clamped {
		f.d.Metrics.clampedStop(ctx)
		f.d.Log.WarnContext(ctx, "rental stop stamped before its start (the agent's clock stepped back); handled as a stop at its start",
			"rental", ev.GetRentalId(), "node", ev.GetNodeId(), "attempt", ev.GetAttempt(), "started_at", ev.GetStartedAt().AsTime())
	}
	return f.onStopped(ctx, ev, d)
}

var rentalStoppedName = string((&shizuv1.RentalStopped{}).ProtoReflect().Descriptor().FullName())
