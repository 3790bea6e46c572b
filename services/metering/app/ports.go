package app

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/services/metering/redisstore"
	"github.com/shizu-gpu/shizu/shared/bus"
)

// SegmentStore is what the meter needs of its segment state: merging rental
// events into segments (ledger.Merge, atomically per batch), advancing
// their cursors (ledger.Advance.Apply), the due list, losses, attempts and
// the spot price history. redisstore.Store is the real one; every call is
// idempotent.
type SegmentStore interface {
	// MergeSegments merges events into their segments and returns the state
	// of each segment after its events, in the order the segments first
	// appear; an event with ChangeNone only loads its segment.
	MergeSegments(ctx context.Context, events []ledger.SegmentEvent) ([]ledger.SegmentState, error)
	// AdvanceAll applies advances.
	AdvanceAll(ctx context.Context, as []ledger.Advance) error
	// Due lists up to limit segments whose next closing is at or before t
	// (to the second).
	Due(ctx context.Context, t time.Time, limit int64) ([]ledger.SegmentRef, error)
	// Lost records the last heartbeat of the node a placement was lost on
	// (ledger.EarliestLoss).
	Lost(ctx context.Context, rental string, attempt int32, lastHeartbeat time.Time) error
	// Attempts lists the placements known of a rental (those a schedule or
	// a start was merged for).
	Attempts(ctx context.Context, rental string) ([]int32, error)
	// DropParked removes a segment that is still unscheduled (its start
	// or stop, parked until its RentalScheduled came) and takes it off the
	// due list; false when a schedule was merged meanwhile (nothing is
	// removed then).
	DropParked(ctx context.Context, ref ledger.SegmentRef) (bool, error)
	// SpotPrice records a spot price of a zone and model from an instant on.
	SpotPrice(ctx context.Context, zone, model string, p ledger.PricePoint) error
	// SpotPrices is the spot history of a zone and model up to until (all
	// of it when until is zero).
	SpotPrices(ctx context.Context, zone, model string, until time.Time) ([]ledger.PricePoint, error)
}

// UsageStore is what the meter needs of the usage aggregates and budget
// alerts. redisstore.Store is the real one.
type UsageStore interface {
	// ApplyAll folds usage records into the aggregates of generation gen
	// ("" for the current), each once per record id, and says per record
	// whether it was new and the tenant's month spend around it.
	ApplyAll(ctx context.Context, gen string, rs []*shizuv1.UsageRecorded) ([]redisstore.Applied, error)
	// Alerts lists the thresholds (micros) alerted for a tenant in a month
	// (YYYY-MM), ascending.
	Alerts(ctx context.Context, tenant, month string) ([]int64, error)
	// Alert marks a threshold alerted; true the first time only.
	Alert(ctx context.Context, tenant, month string, threshold int64) (bool, error)
}

// Store is all the meter keeps: segments and usage.
type Store interface {
	SegmentStore
	UsageStore
}

// Publisher publishes events in async batches, and dead letters of what
// metering gave up on. NewBusPublisher is the real one.
type Publisher interface {
	NewBatch() PublishBatch
	// DeadLetter stores dl on the dead-letter subject, once per dl.ID.
	DeadLetter(ctx context.Context, dl DeadLetter) error
}

// DeadLetter is a copy of something metering cannot bill and gives up on,
// with the reason, as the bus's own dead letters carry it
// (bus.HeaderDLQReason and the other Shizu-Dlq-* headers).
type DeadLetter struct {
	// Subject is the dead-letter subject (subject.DeadLetter of the
	// stream and durable that consumed it).
	Subject string
	// ID is the copy's Nats-Msg-Id, deterministic so a retry stores it once.
	ID string
	// Event is what metering knew of the events it gives up on.
	Event proto.Message
	// Stream and Consumer are where the events were consumed.
	Stream, Consumer string
	Reason           string
}

// PublishBatch queues events and waits until the stream has stored all of
// them. An event's deterministic id (its EventMeta.event_id) makes a
// repeated publish a no-op on the stream.
type PublishBatch interface {
	// Publish queues one event; it fails only when the event cannot be
	// encoded.
	Publish(ctx context.Context, subject string, ev proto.Message) error
	// Len is the number of queued events.
	Len() int
	// Wait returns once every queued event is stored, or the first error.
	Wait(ctx context.Context) error
}

// NewBusPublisher publishes on conn.
func NewBusPublisher(conn *bus.Conn) Publisher { return busPublisher{conn} }

type busPublisher struct{ conn *bus.Conn }

func (p busPublisher) NewBatch() PublishBatch { return busBatch{p.conn.NewBatch()} }

func (p busPublisher) DeadLetter(ctx context.Context, dl DeadLetter) error {
	data, err := proto.Marshal(dl.Event)
	if err != nil {
		return fmt.Errorf("dead letter %s: %w", dl.ID, err)
	}
	msg := nats.NewMsg(dl.Subject)
	msg.Data = data
	msg.Header.Set(bus.HeaderMsgID, dl.ID)
	msg.Header.Set(bus.HeaderEvent, bus.EventName(dl.Event))
	msg.Header.Set(bus.HeaderDLQReason, dl.Reason)
	msg.Header.Set(bus.HeaderDLQStream, dl.Stream)
	msg.Header.Set(bus.HeaderDLQConsumer, dl.Consumer)
	_, err = p.conn.PublishMsg(ctx, msg)
	return err
}

type busBatch struct{ *bus.Batch }

func (b busBatch) Wait(ctx context.Context) error {
	_, err := b.Batch.Wait(ctx)
	return err
}
