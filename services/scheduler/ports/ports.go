// Package ports names what the scheduler's app asks of the world around
// it, each as a narrow interface: the capacity store's reserve
// ([Reserver]), the scheduler's own outcome records ([OutcomeRecords]) and
// the event bus ([Publisher]). The real adapters are *capacity.Store, the
// Redis records of package records and the app's bus publisher; porttest
// holds recording fakes of each and the contract suite both pass.
package ports

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/round"
	"github.com/shizu-gpu/shizu/shared/capacity"
)

// Reserver commits placements: the capacity store's atomic, idempotent
// reserve (a rental reserved again gets its allocation back, Existing) and
// its release. *capacity.Store is one.
type Reserver interface {
	// ReserveMany reserves each placement in order; result i answers ps[i].
	ReserveMany(ctx context.Context, ps []capacity.Placement) []capacity.ReserveResult
	// Release gives a rental's allocation back; false when it held none.
	Release(ctx context.Context, rentalID string) (bool, error)
	// Allocation is a rental's allocation (a not-found error when none).
	Allocation(ctx context.Context, rentalID string) (capacity.Allocation, error)
}

// Quotas are the tenants' quotas (shared/quota's watching Cache is one):
// the scheduler hands the tenant's to the store with each reservation.
type Quotas interface {
	// Quota is the tenant's quota; nil when it has none.
	Quota(tenant string) *capacity.Quota
}

// Class is what the scheduler remembers of a placed rental (for
// preemption): its class and priority, and for a capped spot rental its
// maximum price (a price rise above it interrupts the rental).
type Class struct {
	Class    placement.Class
	Priority int
	// MaxSpotPrice is the zero Price for a rental without a cap.
	MaxSpotPrice placement.Price
}

// String is "<class>:<priority>", with ":<max micros>:<currency>" for a
// capped spot rental.
func (c Class) String() string {
	if c.MaxSpotPrice.Known() {
		return fmt.Sprintf("%d:%d:%d:%s", c.Class, c.Priority, c.MaxSpotPrice.Micros, c.MaxSpotPrice.Currency)
	}
	return fmt.Sprintf("%d:%d", c.Class, c.Priority)
}

// ParseClass reads a Class written by String (records written before
// spot caps were kept have no price: the rental counts as uncapped).
func ParseClass(s string) (Class, bool) {
	parts := strings.Split(s, ":")
	if len(parts) != 2 && len(parts) != 4 {
		return Class{}, false
	}
	c, err1 := strconv.Atoi(parts[0])
	p, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return Class{}, false
	}
	out := Class{Class: placement.Class(c), Priority: p}
	if len(parts) == 4 {
		m, err := strconv.ParseInt(parts[2], 10, 64)
		if err != nil || parts[3] == "" {
			return Class{}, false
		}
		out.MaxSpotPrice = placement.Price{Micros: m, Currency: parts[3]}
	}
	return out, true
}

// SpotPrice is the spot price of one GPU model in one zone, in force from
// EffectiveAt (SpotPriceChanged).
type SpotPrice struct {
	Zone, Model string
	Price       placement.Price
	EffectiveAt time.Time
}

// SpotMarket keeps the spot price in force per zone and model, shared by
// every replica: whichever replica a price change is delivered to records
// it, the others read it.
type SpotMarket interface {
	// SetSpotPrice records p unless a price with a later EffectiveAt is
	// recorded for its zone and model; it returns the price in force after.
	SetSpotPrice(ctx context.Context, p SpotPrice) (SpotPrice, error)
	// SpotPrices reads every recorded price.
	SpotPrices(ctx context.Context) ([]SpotPrice, error)
}

// PendingEntry is a request waiting for capacity.
type PendingEntry struct {
	Event  *shizuv1.RentalRequested
	Reason shizuv1.PendingReason
	// PreemptUntil: a preemption was started for this request; no other is
	// started before then.
	PreemptUntil time.Time
	// Attempt is the placement number (0 or 1 for a new request).
	Attempt int32
	// PreferredModels are the GPU models the placement prefers (a moved
	// rental's original model; see placement.Request.PreferredModels):
	// not part of the request event, so kept beside it.
	PreferredModels []string
}

// Preemption is the durable decision to evict one spot rental (Victim) for
// another (Preemptor): decided once per victim, it is announced
// (RentalPreempted) when claimed, the victim's node is told to stop it
// once Notice passed (StopSent then), and it ends when the victim's stop
// is handled.
type Preemption struct {
	Victim, Tenant, Preemptor string
	NodeID                    string
	NodeEpoch                 uint64
	// Notice is the deadline the victim was given to stop by.
	Notice   time.Time
	StopSent bool
}

// AttemptKey names the outcome record of one placement attempt of a
// rental: the rental id for the first, "<rental>.<attempt>" after a
// migration ('.' cannot occur in a rental id, which is a subject token).
func AttemptKey(rental string, attempt int32) string {
	if attempt <= 1 {
		return rental
	}
	return fmt.Sprintf("%s.%d", rental, attempt)
}

// RentalOfKey is the rental an attempt key belongs to.
func RentalOfKey(key string) string {
	rental, _, _ := strings.Cut(key, ".")
	return rental
}

// OutcomeRecords are the scheduler's own records beside the capacity
// store: one outcome per placement attempt (claimed once, by whoever
// records it first), the class of each placed rental, and the pending set.
type OutcomeRecords interface {
	// Claim records outcome want for each attempt key that has none and
	// returns the outcome recorded for each. A scheduled claim names the
	// allocation it announces (allocs[i]; nil for other outcomes); placed
	// rentals get their class recorded (classes, nil for other outcomes)
	// and every claimed rental leaves the pending set.
	Claim(ctx context.Context, keys []string, want string, allocs []string, classes []Class) ([]round.Claim, error)
	// Decided reports, for each attempt key, whether an outcome is recorded.
	Decided(ctx context.Context, keys []string) ([]bool, error)
	// PlacedAfter reports whether an attempt later than attempt has an
	// outcome recorded (the rental was moved and placed again).
	PlacedAfter(ctx context.Context, rental string, attempt int32) (bool, error)
	// CurrentAttempt is the latest attempt with a recorded outcome (1 when
	// the rental never moved).
	CurrentAttempt(ctx context.Context, rental string) (int32, error)
	// Classes reads the class records of rentals (missing ones are absent).
	Classes(ctx context.Context, rentals []string) (map[string]Class, error)
	// Placed reports whether a rental has a class record: it was placed and
	// its stop has not been handled.
	Placed(ctx context.Context, rental string) (bool, error)
	// Forget drops a released rental's class record (and its preemption
	// record, when it was a victim).
	Forget(ctx context.Context, rental string) error
	// ClaimPreemption records the preemption of each victim in ps (one
	// preemptor, one node) for that preemptor, all or nothing: a victim
	// already preempted for another rental is not taken again. It returns
	// the victims held for another preemptor (none: the claim stands, or
	// stood already for this preemptor).
	ClaimPreemption(ctx context.Context, ps []Preemption) (taken []string, err error)
	// Preemptions reads every recorded preemption.
	Preemptions(ctx context.Context) ([]Preemption, error)
	// StopSent marks a victim's stop command sent (nothing when the
	// victim's record is gone).
	StopSent(ctx context.Context, victim string) error
	// DropPreemption removes the preemption records of victims (stopped,
	// or gone from the node they were preempted on).
	DropPreemption(ctx context.Context, victims ...string) error
	// PutPending stores (or replaces) pending entries by rental.
	PutPending(ctx context.Context, entries []PendingEntry) error
	// DropPending removes pending entries by rental.
	DropPending(ctx context.Context, rentals ...string) error
	// Pending reads every pending entry; entries that do not decode are
	// returned by rental, for the caller to drop.
	Pending(ctx context.Context) (entries []PendingEntry, bad []string, err error)
}

// Publisher sends the scheduler's events.
type Publisher interface {
	NewBatch() Batch
}

// Batch publishes many events and waits for their acks once. The event's
// meta.event_id identifies it: a repeat is stored once.
type Batch interface {
	// Publish queues one event; it fails only when the event cannot be sent
	// at all (it does not encode, the subject is unusable).
	Publish(ctx context.Context, subject string, ev proto.Message) error
	// Wait returns once every queued event is acknowledged, or the first
	// error.
	Wait(ctx context.Context) error
}

// AllocToken names one allocation of a rental: the node and the instant
// the store created it. Two replicas that announce the same allocation (one
// reserved it, the other got it back as Existing) hold the same token; a
// fresh reservation after the rental's earlier allocation was released has
// another.
func AllocToken(a capacity.Allocation) string {
	return a.NodeID + "@" + strconv.FormatInt(a.CreatedAt.UnixNano(), 10)
}
