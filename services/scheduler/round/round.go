// Package round decides one scheduling round of the scheduler: which
// requests are answered at once (admission), in which order a batch is
// tried, where each one is placed on the loop's view, and what becomes of
// the ones that fit nowhere (pending with a deadline, a preemption of spot
// rentals, a rejection once the deadline passed), and whether a reservation
// stays once its outcome is claimed. It is pure: it imports neither NATS,
// Redis nor the OTel SDK, and takes the time and the view as values, so
// [Plan] with the same input (and the same answers from its Commit) always
// gives the same plan. The scheduler's loop runs Plan for every round; its
// app commits (through Plan's Commit), records and publishes what it
// decides.
package round

import (
	"errors"
	"fmt"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/queue"
	"github.com/shizu-gpu/shizu/services/scheduler/view"
	"github.com/shizu-gpu/shizu/shared/fault"
)

// Config is what the decisions depend on besides the view and the time.
type Config struct {
	// Placer places and plans preemptions (it carries the policy).
	Placer *placement.Placer
	// AgingStep is the wait worth one priority point (level one).
	AgingStep time.Duration
	// PendingTimeout: a request not placed this long after it was made is
	// rejected.
	PendingTimeout time.Duration
	// PreemptionNotice is the time a preempted spot rental gets to stop.
	PreemptionNotice time.Duration
	// Commitments are the tenants' reserved commitments (Admit).
	Commitments Commitments
	// MaxPendingTimeout is the longest pending timeout a request may
	// choose (RentalSpec.pending_timeout; Admit); 0 means PendingTimeout.
	MaxPendingTimeout time.Duration
	// Offers are the instance types the autoscaler may provision; a
	// request no node and no offer could ever hold is rejected as
	// unsatisfiable (Judge).
	Offers []placement.Offer
	// JudgeFrom: before it no request is rejected as unsatisfiable (the
	// scheduler started moments ago, nodes may still be registering).
	JudgeFrom time.Time
}

// Job is one request in a round.
type Job struct {
	Event   *shizuv1.RentalRequested
	Request placement.Request
	// Attempt is the placement number: 1 for a new request, n+1 for a
	// rental failover moves off its node after attempt n.
	Attempt  int32
	Enqueued time.Time
	Deadline time.Time
	// FromPending: the request already waits in the pending set, with
	// Reason and PreemptUntil as said then.
	FromPending  bool
	Reason       shizuv1.PendingReason
	PreemptUntil time.Time
	// Decided: an outcome is recorded for this attempt already (a
	// duplicate of a request decided meanwhile); filled in by the caller
	// (Commit.Decided) before DecideNoFit.
	Decided bool
	// Placed is where Place put the request.
	Placed placement.Placement
	// OverQuota, when set, is why the tenant's quota holds the request
	// back, in people's words: the store refused its reservation over
	// quota (Commit.Settle), or the caller found the tenant's usage too
	// high for it before the no-fit decisions (Commit.Decided). It then
	// waits with PENDING_REASON_QUOTA. Place clears it.
	OverQuota string
}

// NewJob is a job for a request made at its meta's occurred_at; it waits
// at most its spec's pending_timeout when set, else cfg.PendingTimeout.
func NewJob(ev *shizuv1.RentalRequested, r placement.Request, attempt int32, cfg Config) Job {
	enq := ev.GetMeta().GetOccurredAt().AsTime()
	return Job{Event: ev, Request: r, Attempt: attempt, Enqueued: enq, Deadline: enq.Add(PendingTimeout(ev, cfg))}
}

// Planning is the job itself; the caller's own job types embed Job and so
// satisfy [Planned].
func (j *Job) Planning() *Job { return j }

// Planned is anything that carries a Job.
type Planned interface{ Planning() *Job }

// FirstOfEach splits a batch into the first job of each placement (rental
// and attempt) and the repeats: a rental asked for twice in one round (a
// redelivery) is placed once, its copies follow in a round of their own.
func FirstOfEach[J Planned](batch []J) (first, again []J) {
	type key struct {
		rental  string
		attempt int32
	}
	seen := make(map[key]bool, len(batch))
	first = batch[:0:len(batch)]
	for _, j := range batch {
		p := j.Planning()
		k := key{p.Request.ID, max(p.Attempt, 1)}
		if seen[k] {
			again = append(again, j)
			continue
		}
		seen[k] = true
		first = append(first, j)
	}
	return first, again
}

// Order sorts a batch by the level-one queue order at now (class, then
// priority with aging, then age, with the per-tenant penalty), and then
// puts the re-placements (attempt > 1: rentals failover moved off their
// node) at the head of their class: each class keeps the places the queue
// order gave it, filled first by its moved rentals, then by its new
// requests, each in queue order. A moved rental already ran; a new
// request of its class, however old or urgent, does not take its room.
func Order[J Planned](batch []J, now time.Time, cfg Config) {
	items := make([]queue.Item, len(batch))
	for i, j := range batch {
		p := j.Planning()
		items[i] = queue.Item{ID: p.Request.ID, Tenant: p.Request.Tenant, Class: p.Request.Class, Priority: p.Request.Priority,
			Enqueued: p.Enqueued, Value: j}
	}
	queue.Order(items, now, queue.Options{AgingStep: cfg.AgingStep})
	byClass := map[placement.Class][]J{}
	for _, it := range items {
		if j := it.Value.(J); j.Planning().Attempt > 1 {
			byClass[it.Class] = append(byClass[it.Class], j)
		}
	}
	for _, it := range items {
		if j := it.Value.(J); j.Planning().Attempt <= 1 {
			byClass[it.Class] = append(byClass[it.Class], j)
		}
	}
	for i, it := range items {
		batch[i] = byClass[it.Class][0]
		byClass[it.Class] = byClass[it.Class][1:]
	}
}

// ErrNoFit is Place's answer for a request that fits on no node of the view.
var ErrNoFit = placement.ErrNoFit

// Place places a job on the view and books it there (j.Placed), or returns
// an error: [ErrNoFit] when no node has room, any other when the request
// cannot be placed at all.
func Place(v *view.View, j *Job, at time.Time, cfg Config) error {
	j.OverQuota = ""
	p, err := cfg.Placer.Place(v.Cluster(), &j.Request)
	if err != nil {
		return err
	}
	j.Placed = p
	v.Apply(&j.Request, p, at)
	return nil
}

// Pending is a request that found no room and waits.
type Pending[J Planned] struct {
	Job          J
	Reason       shizuv1.PendingReason
	PreemptUntil time.Time
	// Preempt is the preemption started for it this round (nil: none).
	Preempt *Preempt
	// Missing is what the fleet lacks for it.
	Missing placement.Missing
	// Note is added to the message (see Unsatisfiable.Note).
	Note string
}

// Shortage reports whether the wait is reported as a capacity shortage:
// it waits for capacity, not for a preemption.
func (p Pending[J]) Shortage() bool {
	return p.Reason == shizuv1.PendingReason_PENDING_REASON_NO_CAPACITY
}

// Message is what the tenant is told about the wait.
func (p Pending[J]) Message() string {
	r := &p.Job.Planning().Request
	switch p.Reason {
	case shizuv1.PendingReason_PENDING_REASON_AWAITING_PREEMPTION:
		return "waiting for spot rentals to be preempted: " + Describe(r)
	case shizuv1.PendingReason_PENDING_REASON_QUOTA:
		return "waiting for room in the tenant's quota: " + p.Job.Planning().OverQuota
	case shizuv1.PendingReason_PENDING_REASON_SPOT_PRICE_ABOVE_MAX:
		return fmt.Sprintf("waiting for a spot price at most the maximum of %s per GPU-hour: every node with room for %s prices above it",
			formatPrice(r.MaxSpotPrice), Describe(r))
	}
	msg := "waiting for capacity: " + Describe(&p.Job.Planning().Request)
	if p.Note != "" {
		msg += " (" + p.Note + ")"
	}
	return msg
}

// Preempt is the eviction of spot rentals from one node.
type Preempt struct {
	NodeID    string
	NodeEpoch uint64
	Victims   []placement.Allocation
	// NoticeDeadline is when the victims must have stopped.
	NoticeDeadline time.Time
}

// Reject is a request that ends rejected.
type Reject[J Planned] struct {
	Job     J
	Reason  shizuv1.RejectReason
	Message string
}

// Failure is a request the round could not decide; it is tried again.
type Failure[J Planned] struct {
	Job J
	Err error
}

// NoFit is what becomes of the requests that fit nowhere.
type NoFit[J Planned] struct {
	// Jobs are all the requests decided, in order (a decided one is in
	// none of the lists below).
	Jobs    []J
	Pending []Pending[J]
	Reject  []Reject[J]
	Failed  []Failure[J]
	// NextDeadline is the earliest deadline of the requests that wait
	// (zero when none).
	NextDeadline time.Time
}

// DecideNoFit decides for requests that fit nowhere, in their order:
// decided ones say nothing; past the deadline, rejected; a spot request
// kept out only by its maximum price waits for the price (no shortage);
// waiting for a preemption started earlier, still waiting; an on-demand or reserved
// request that evicting spot rentals makes fit starts a preemption and
// waits; otherwise it waits with a capacity shortage. A request from the
// pending set with nothing new to say is left out.
func DecideNoFit[J Planned](v *view.View, jobs []J, now time.Time, cfg Config) NoFit[J] {
	out := NoFit[J]{Jobs: jobs}
	for _, jj := range jobs {
		j := jj.Planning()
		if j.Decided {
			continue
		}
		u := Judge(v, &j.Request, now, cfg)
		if u.Reject {
			out.Reject = append(out.Reject, Reject[J]{Job: jj, Reason: shizuv1.RejectReason_REJECT_REASON_UNSATISFIABLE,
				Message: "no node could ever hold this request: " + u.Why})
			continue
		}
		if now.After(j.Deadline) {
			wait := j.Deadline.Sub(j.Enqueued)
			msg := fmt.Sprintf("no capacity for %s within %s", Describe(&j.Request), wait)
			if j.OverQuota != "" {
				msg = fmt.Sprintf("no room in the tenant's quota for %s within %s: %s", Describe(&j.Request), wait, j.OverQuota)
			} else if PriceOnly(v, &j.Request, cfg) {
				msg = fmt.Sprintf("the spot price stayed above the maximum of %s per GPU-hour for %s within %s",
					formatPrice(j.Request.MaxSpotPrice), Describe(&j.Request), wait)
			}
			out.Reject = append(out.Reject, Reject[J]{Job: jj, Reason: shizuv1.RejectReason_REJECT_REASON_PENDING_TIMEOUT, Message: msg})
			continue
		}
		p := Pending[J]{Job: jj, Reason: shizuv1.PendingReason_PENDING_REASON_NO_CAPACITY, PreemptUntil: j.PreemptUntil, Note: u.Note}
		if j.OverQuota != "" {
			// No preemption and no shortage: more capacity would not
			// place it, a stop of the tenant's own rentals will.
			p.Reason, p.PreemptUntil = shizuv1.PendingReason_PENDING_REASON_QUOTA, time.Time{}
		} else if PriceOnly(v, &j.Request, cfg) {
			p.Reason = shizuv1.PendingReason_PENDING_REASON_SPOT_PRICE_ABOVE_MAX
		} else if now.Before(j.PreemptUntil) {
			p.Reason = shizuv1.PendingReason_PENDING_REASON_AWAITING_PREEMPTION
		} else if plan, ok := cfg.Placer.PlanPreemption(v.Cluster(), &j.Request, now); ok {
			node, ok := v.Node(plan.NodeID)
			if !ok {
				out.Failed = append(out.Failed, Failure[J]{Job: jj, Err: fault.Unavailable("node %s left the view", plan.NodeID)})
				continue
			}
			p.Preempt = &Preempt{NodeID: node.ID, NodeEpoch: node.Epoch, Victims: plan.Victims,
				NoticeDeadline: now.Add(cfg.PreemptionNotice)}
			p.Reason = shizuv1.PendingReason_PENDING_REASON_AWAITING_PREEMPTION
			p.PreemptUntil = now.Add(2 * cfg.PreemptionNotice)
		}
		if j.FromPending && p.Reason == j.Reason && p.PreemptUntil.Equal(j.PreemptUntil) {
			continue // nothing new to say
		}
		if out.NextDeadline.IsZero() || j.Deadline.Before(out.NextDeadline) {
			out.NextDeadline = j.Deadline
		}
		if u.Why != "" && cfg.JudgeFrom.Before(out.NextDeadline) {
			out.NextDeadline = cfg.JudgeFrom // judged again once the grace ends
		}
		if p.Reason != shizuv1.PendingReason_PENDING_REASON_QUOTA {
			p.Missing = cfg.Placer.Shortage(v.Cluster(), &j.Request)
		}
		out.Pending = append(out.Pending, p)
	}
	return out
}

// RoundPlan is what one round decides.
type RoundPlan[J Planned] struct {
	// Order is the first job of each placement, in the order tried: each
	// one ends in exactly one of Reserve, Invalid, Refused or the no-fit
	// decisions (a no-fit job already decided is in none of those lists).
	Order []J
	// Reserve are the jobs placed on the view (each one's Placed) whose
	// reservation stands, in the order they were reserved.
	Reserve []J
	// Again are the repeats of a placement, left to a round of their own.
	Again []J
	// Invalid are the jobs no node could ever take.
	Invalid []Failure[J]
	// Refused are the jobs whose reservation the store still refused after
	// MaxPasses placements (only with a Commit).
	Refused []J
	NoFit[J]
}

// MaxPasses bounds how often one round places a request whose reservation
// the store refused (another replica took the capacity first).
const MaxPasses = 4

// Commit is the caller's side of a round whose reservations a store may
// refuse: Plan decides, the caller reserves and reads the store. A nil
// Commit grants every reservation, refreshes nothing and takes each job's
// Decided as given.
type Commit[J Planned] interface {
	// Reserve is handed each job as soon as it is placed, in round order;
	// it may reserve it in the background.
	Reserve(j J)
	// Settle waits until every job handed to Reserve since the last Settle
	// is reserved or failed, and returns the ones the store refused: Plan
	// takes them out of the view, marks their nodes stale and places them
	// again in the next pass, except those refused over quota (OverQuota
	// set), which fit nowhere for now.
	Settle() (refused []J)
	// Refresh ends a pass: the caller re-reads the stale nodes into the
	// view. With whole set, every job that fits nowhere and nothing is
	// left to place: the caller may re-read the whole view when the store
	// moved, and says whether it did; then those jobs get one more pass.
	Refresh(whole bool) (refreshed bool)
	// Decided fills in Decided of the jobs that fit nowhere before they
	// are decided; an error fails them all.
	Decided(jobs []J) error
}

// Plan decides a round over jobs on the view at now: first of each, in
// queue order; the new requests' shapes join the view's recent workload,
// which the placer then scores against; each is placed on the view (which
// then holds the reservations) and handed to commit; the refused ones are
// placed again, up to MaxPasses times, and the requests that fit nowhere
// are decided after every placement. The scheduler's loop runs exactly
// this; the commit's I/O is the only part that is not Plan's.
func Plan[J Planned](v *view.View, jobs []J, now time.Time, cfg Config, commit Commit[J]) RoundPlan[J] {
	var out RoundPlan[J]
	first, again := FirstOfEach(jobs)
	Order(first, now, cfg)
	out.Order, out.Again = first, again
	for _, j := range first {
		if p := j.Planning(); !p.FromPending {
			v.Observe(&p.Request)
		}
	}
	w := v.Workload()
	cfg.Placer.SetWorkload(&w)

	todo := first
	var noFit []J
	tried := false
	for pass := 0; pass < MaxPasses && len(todo) > 0; pass++ {
		var none []J
		todo, none = out.pass(v, todo, now, cfg, commit, pass == MaxPasses-1)
		noFit = append(noFit, none...)
		if commit == nil {
			break
		}
		// Requests that found no room while the store moved get one more
		// pass on a fresh view.
		whole := len(todo) == 0 && len(noFit) > 0 && !tried && pass < MaxPasses-1
		tried = tried || whole
		if commit.Refresh(whole) && whole {
			todo, noFit = noFit, nil
		}
	}
	out.Refused = todo
	if commit != nil && len(noFit) > 0 {
		if err := commit.Decided(noFit); err != nil {
			out.NoFit.Jobs = noFit
			for _, j := range noFit {
				out.Failed = append(out.Failed, Failure[J]{Job: j, Err: err})
			}
			return out
		}
	}
	out.NoFit = DecideNoFit(v, noFit, now, cfg)
	return out
}

// pass places todo on the view, hands each placed job to commit and
// takes the refused ones out of the view again. It returns the refused
// and the ones that fit nowhere. When the store refused some over quota,
// the ones that fit nowhere are placed again too (unless this is the
// last pass): they were tried while the view still held the refused
// ones' bookings.
func (out *RoundPlan[J]) pass(v *view.View, todo []J, now time.Time, cfg Config, commit Commit[J], last bool) (refused, noFit []J) {
	var placed []J
	for _, j := range todo {
		switch err := Place(v, j.Planning(), now, cfg); {
		case err == nil:
			placed = append(placed, j)
			if commit != nil {
				commit.Reserve(j)
			}
		case errors.Is(err, ErrNoFit):
			noFit = append(noFit, j)
		default:
			out.Invalid = append(out.Invalid, Failure[J]{Job: j, Err: err})
		}
	}
	if commit == nil {
		out.Reserve = append(out.Reserve, placed...)
		return nil, noFit
	}
	refused = commit.Settle()
	if len(refused) == 0 {
		out.Reserve = append(out.Reserve, placed...)
		return nil, noFit
	}
	gone := make(map[*Job]bool, len(refused))
	again := refused[:0:0]
	var overQuota []J
	for _, j := range refused {
		p := j.Planning()
		gone[p] = true
		v.Remove(p.Placed.NodeID, p.Request.ID)
		if p.OverQuota != "" {
			overQuota = append(overQuota, j) // the node had room: it stays fresh
			continue
		}
		v.MarkStale(p.Placed.NodeID)
		again = append(again, j)
	}
	if len(overQuota) > 0 && !last {
		again, noFit = append(again, noFit...), nil
	}
	noFit = append(noFit, overQuota...)
	for _, j := range placed {
		if !gone[j.Planning()] {
			out.Reserve = append(out.Reserve, j)
		}
	}
	return again, noFit
}

// Describe is a request's shape in words.
func Describe(r *placement.Request) string {
	s := fmt.Sprintf("%d GPU(s) of %d milli", r.GPUCount, r.MilliPerGPU)
	if r.NVLink {
		s += " over NVLink"
	}
	if r.MIGProfile != "" {
		s += " as MIG " + r.MIGProfile
	}
	if len(r.Models) > 0 {
		s += fmt.Sprintf(" of %v", r.Models)
	}
	return s
}

// Outcomes a rental request ends with. Exactly one is recorded per
// placement attempt: the replica that records it acts on it, any other
// replica that reserved capacity for the same attempt gives it back.
const (
	OutcomeScheduled = "scheduled"
	OutcomeRejected  = "rejected"
	OutcomeCancelled = "cancelled"
)

// Claim is the outcome recorded for an attempt, whether this claim
// recorded it, and for a scheduled outcome the allocation it announced.
type Claim struct {
	Outcome string
	Won     bool
	// Alloc is the token of the allocation announced; "" when none was
	// named.
	Alloc string
}

// KeepReservation says whether a reservation stays after its outcome
// claim. token names the reservation (its node and creation instant) and
// existing says the store handed back one it held already. It is given
// back when another outcome was recorded first (a cancel, a timeout), and
// when this is a redelivery of a rental scheduled before whose allocation
// is gone (it ran and stopped): the new reservation must not outlive it.
// A scheduled outcome that names this very allocation is another replica's
// announcement of it (that replica got this reservation back as existing
// and recorded first): it stays, it is the one the rental runs on.
func KeepReservation(c Claim, token string, existing bool) bool {
	switch {
	case c.Outcome != OutcomeScheduled:
		return false
	case c.Won:
		return true
	case c.Alloc == "": // recorded before outcomes named their allocation
		return existing
	default:
		// An existing allocation carries the stored creation time, so a
		// true redelivery matches; one reserved after the announced
		// allocation was released does not, existing or not.
		return c.Alloc == token
	}
}
