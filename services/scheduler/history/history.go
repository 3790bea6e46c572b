// Package history folds the RENTALS stream, JetStream's record of every
// rental, into what the scheduler's own Redis records must hold: which
// placement attempts are decided (scheduled, rejected, cancelled), which
// placed rentals still run, and which requests wait with no outcome. The
// scheduler rebuilds its records from it after Redis lost them
// (services/scheduler/app/rebuild.go). It imports neither NATS nor Redis.
package history

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/round"
)

// Requeued is the request of a rental that failover moves: its original
// spec, as placement attempt next_attempt, made when it was lost (the
// RentalMigrating's time), so its deadline and its place in the queue do
// not start over. The scheduler places it (onMigrating) and keeps it
// pending as this event.
func Requeued(ev *shizuv1.RentalMigrating, source string) *shizuv1.RentalRequested {
	id := ev.GetRentalId()
	return &shizuv1.RentalRequested{
		Meta: shizuv1.NewMeta(fmt.Sprintf("rental:%s:requeued:%d", id, ev.GetNextAttempt()), source,
			ev.GetMeta().GetEventId(), id, ev.GetMeta().GetOccurredAt().AsTime()),
		RentalId: id, TenantId: ev.GetTenantId(), Spec: ev.GetSpec(),
	}
}

// Fold is what the events folded so far say of each rental. Add them in
// stream order.
type Fold struct {
	source  string
	rentals map[string]*rental
	order   []string // rental ids, by first event
	// owners: the tenant of each rental's first event, as the scheduler
	// claims it (ports.Owners); another tenant's events under the id
	// were refused and change nothing.
	owners map[string]string
}

type rental struct {
	requests map[int32]*shizuv1.RentalRequested // by attempt
	prefer   map[int32]string                   // by attempt: a moved rental's model (from_gpu_model)
	latest   int32                              // the latest attempt requested
	outcomes map[int32]string                   // by attempt: round.Outcome*
	reason   shizuv1.PendingReason              // why the latest attempt waits
	stopped  int32                              // the latest attempt whose run stopped
	// cancel: the tenant asked to cancel; an attempt still undecided
	// then is cancelled.
	cancel bool
	// epoch is the node epoch of the latest placement; preempted the
	// preemption of that placement's run, if any.
	epoch     int64
	preempted *shizuv1.RentalPreempted
}

// New is an empty fold; source names the scheduler in the requests it
// derives (Requeued).
func New(source string) *Fold {
	return &Fold{source: source, rentals: map[string]*rental{}, owners: map[string]string{}}
}

func (f *Fold) rental(id string) *rental {
	r, ok := f.rentals[id]
	if !ok {
		r = &rental{requests: map[int32]*shizuv1.RentalRequested{}, outcomes: map[int32]string{}, prefer: map[int32]string{}}
		f.rentals[id] = r
		f.order = append(f.order, id)
	}
	return r
}

// decide records an attempt's outcome unless it has one: the first
// recorded stands, as the scheduler's claims do.
func (r *rental) decide(attempt int32, outcome string) {
	if _, ok := r.outcomes[attempt]; !ok {
		r.outcomes[attempt] = outcome
	}
}

// owned is what every rental event names.
type owned interface {
	GetRentalId() string
	GetTenantId() string
}

// owns reports whether tenant owns rental: it does when its event is the
// rental's first (the scheduler claims the owner on the first request or
// cancel it handles).
func (f *Fold) owns(rental, tenant string) bool {
	if tenant == "" {
		return false
	}
	owner, ok := f.owners[rental]
	if !ok {
		f.owners[rental] = tenant
		return true
	}
	return owner == tenant
}

// Add folds one event in; events of other types (started, migrated,
// preempted, ...) change nothing, and neither do events of a tenant that
// does not own the rental (history.Records.Owners).
func (f *Fold) Add(ev proto.Message) {
	if e, ok := ev.(owned); !ok || !f.owns(e.GetRentalId(), e.GetTenantId()) {
		return
	}
	switch e := ev.(type) {
	case *shizuv1.RentalRequested:
		r := f.rental(e.GetRentalId())
		if _, ok := r.requests[1]; !ok {
			r.requests[1] = e
			r.latest = max(r.latest, 1)
		}
	case *shizuv1.RentalMigrating:
		if e.GetNextAttempt() < 2 || e.GetSpec() == nil {
			return // the scheduler dead-letters it: nothing is placed
		}
		r := f.rental(e.GetRentalId())
		if _, ok := r.requests[e.GetNextAttempt()]; !ok {
			r.requests[e.GetNextAttempt()] = Requeued(e, f.source)
			if m := e.GetFromGpuModel(); m != "" {
				r.prefer[e.GetNextAttempt()] = m
			}
		}
		if e.GetNextAttempt() > r.latest {
			r.latest, r.reason = e.GetNextAttempt(), shizuv1.PendingReason_PENDING_REASON_UNSPECIFIED
		}
	case *shizuv1.RentalScheduled:
		r := f.rental(e.GetRentalId())
		if _, ok := r.outcomes[max(e.GetAttempt(), 1)]; !ok {
			r.epoch, r.preempted = e.GetNodeEpoch(), nil
		}
		r.decide(max(e.GetAttempt(), 1), round.OutcomeScheduled)
	case *shizuv1.RentalPreempted:
		if e.GetReason() == shizuv1.PreemptReason_PREEMPT_REASON_BUDGET_EXHAUSTED {
			return // a budget notice: its stop is the budget sweep's cancel, not a preemption record's
		}
		f.rental(e.GetRentalId()).preempted = e
	case *shizuv1.RentalRejected:
		r := f.rental(e.GetRentalId())
		outcome := round.OutcomeRejected
		if e.GetReason() == shizuv1.RejectReason_REJECT_REASON_CANCELLED {
			outcome = round.OutcomeCancelled
		}
		r.decide(max(r.latest, 1), outcome)
	case *shizuv1.RentalPending:
		f.rental(e.GetRentalId()).reason = e.GetReason()
	case *shizuv1.RentalCancelRequested:
		f.rental(e.GetRentalId()).cancel = true
	case *shizuv1.RentalStopped:
		r := f.rental(e.GetRentalId())
		r.stopped = max(r.stopped, max(e.GetAttempt(), 1))
	}
}

// Decided is one attempt's outcome.
type Decided struct {
	Rental  string
	Attempt int32
	Outcome string // round.OutcomeScheduled, OutcomeRejected or OutcomeCancelled
	// Running: a scheduled attempt that is the rental's latest placement
	// and has not stopped; Request is its request (for its class).
	Running bool
	Request *shizuv1.RentalRequested
}

// Pending is a request with no outcome that the scheduler reported
// pending (RentalPending), so acknowledged: the rental's latest attempt.
type Pending struct {
	Event   *shizuv1.RentalRequested
	Attempt int32
	Reason  shizuv1.PendingReason // as its RentalPending said
	// PreferredModels: a moved rental's model, as onMigrating prefers it.
	PreferredModels []string
}

// Preemption is a running spot rental preempted for another (its
// RentalPreempted), whose stop is not handled yet.
type Preemption struct {
	Victim, Tenant, Preemptor, NodeID string
	NodeEpoch                         int64
	Notice                            time.Time
}

// Owner is the tenant that owns a rental id.
type Owner struct{ Rental, Tenant string }

// Records is what the scheduler's records must hold.
type Records struct {
	Decided     []Decided    // by rental (first event order), then attempt
	Pending     []Pending    // by rental (first event order)
	Preemptions []Preemption // by victim (first event order)
	Owners      []Owner      // by rental (first event order)
}

// Records is the fold's result. A cancel asked for while the latest
// attempt was undecided decides it cancelled.
func (f *Fold) Records() Records {
	var out Records
	for _, id := range f.order {
		out.Owners = append(out.Owners, Owner{Rental: id, Tenant: f.owners[id]})
		r := f.rentals[id]
		if _, decided := r.outcomes[r.latest]; !decided && r.latest > 0 && r.cancel {
			r.outcomes[r.latest] = round.OutcomeCancelled
		}
		placed := int32(0)
		for a, o := range r.outcomes {
			if o == round.OutcomeScheduled {
				placed = max(placed, a)
			}
		}
		for _, a := range slices.Sorted(maps.Keys(r.outcomes)) {
			d := Decided{Rental: id, Attempt: a, Outcome: r.outcomes[a]}
			if a == placed && r.stopped < a {
				d.Running, d.Request = true, r.requests[a]
				if p := r.preempted; p != nil {
					out.Preemptions = append(out.Preemptions, Preemption{Victim: id, Tenant: p.GetTenantId(),
						Preemptor: p.GetPreemptingRentalId(), NodeID: p.GetNodeId(), NodeEpoch: r.epoch, Notice: p.GetNoticeDeadline().AsTime()})
				}
			}
			out.Decided = append(out.Decided, d)
		}
		// Only a request reported pending was acknowledged: one that was
		// not is still the consumer's, and is delivered (again).
		reported := r.reason != shizuv1.PendingReason_PENDING_REASON_UNSPECIFIED
		if _, decided := r.outcomes[r.latest]; !decided && reported && r.requests[r.latest] != nil {
			p := Pending{Event: r.requests[r.latest], Attempt: r.latest, Reason: r.reason}
			if m := r.prefer[r.latest]; m != "" {
				p.PreferredModels = []string{m}
			}
			out.Pending = append(out.Pending, p)
		}
	}
	return out
}
