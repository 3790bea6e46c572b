package app

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/ports"
	"github.com/shizu-gpu/shizu/shared/budget"
	"github.com/shizu-gpu/shizu/shared/budget/budgetkv"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/service"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// The budget hard stop, the scheduler's side. Metering writes a tenant's
// budget.State in the BUDGETS bucket when its month spend reaches a budget
// whose policy stops; every replica watches the bucket into its budgets
// book. While a tenant's state is in force (its month is now's):
//   - a new request of the tenant is rejected at admission
//     (REJECT_REASON_NOT_PERMITTED, the message naming the budget and the
//     spend), and so is one already waiting (first attempts only: a
//     rental being moved is a running one);
//   - under stop-running, each running rental of the tenant gets a notice
//     (RentalPreempted, PREEMPT_REASON_BUDGET_EXHAUSTED, whose deadline
//     is ExhaustedAt + grace, the same instant on every replica), and once
//     the deadline passed the scheduler asks to cancel it
//     (RentalCancelRequested on the tenant's subject, requested_by
//     "budget:<budget>"): the path a tenant's own stop takes, so the agent
//     stops it with EXIT_REASON_CANCELLED and metering closes its bill as
//     for any stop.
// A new month, or metering lifting the state (a raised budget), ends it.
// Every replica sweeps every PendingRetry; each notice and cancel is
// published, then marked in Redis, so a repeat after a crash or by another
// replica has the same event id, which the stream stores once.

// budgetRetry is how often a replica tries to open the bucket until
// metering created it, and to watch it again after the watch ended.
const budgetRetry = time.Second

// budgetMarkTTL keeps a month's notice and cancel marks past its end.
const budgetMarkTTL = 40 * 24 * time.Hour

// budgets is the replica's copy of the BUDGETS bucket, by key.
type budgets struct {
	mu     sync.RWMutex
	states map[string]budget.State
	// sweeping: one sweep at a time.
	sweeping sync.Mutex
	// marks is the in-memory stand-in for Redis when the scheduler has
	// none (tests of the round on fakes).
	marks map[string]bool
}

// inForce is the tenant's state when it blocks new rentals at now.
func (b *budgets) inForce(tenant string, now time.Time) (budget.State, bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	st, ok := b.states[budgetkv.Key(tenant)]
	return st, ok && st.Tenant == tenant && st.InForce(now)
}

// allInForce lists the states in force at now.
func (b *budgets) allInForce(now time.Time) []budget.State {
	b.mu.RLock()
	defer b.mu.RUnlock()
	var out []budget.State
	for _, st := range b.states {
		if st.InForce(now) {
			out = append(out, st)
		}
	}
	return out
}

func (b *budgets) apply(c *budgetkv.Change) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.states == nil {
		b.states = map[string]budget.State{}
	}
	if c.Lifted {
		delete(b.states, c.Key)
		return
	}
	b.states[c.Key] = c.State
}

// refuseOverBudget rejects a new request of a tenant whose budget state
// is in force; true when it did (err decides the delivery then).
func (s *Scheduler) refuseOverBudget(ctx context.Context, ev *shizuv1.RentalRequested) (bool, error) {
	st, ok := s.budgets.inForce(ev.GetTenantId(), s.d.Now())
	if !ok {
		return false, nil
	}
	// The rejection records an outcome under the rental id, which must
	// be the tenant's own (a request under another tenant's id is refused
	// as such instead).
	if owned, err := s.ownsRequest(ctx, ev); !owned {
		return true, err
	}
	s.d.Log.InfoContext(ctx, "request refused: the tenant's budget is spent", "rental", ev.GetRentalId(), "tenant", st.Tenant,
		"budget", st.Budget, "month", st.Month)
	return true, s.rejectNow(ctx, ev, 1, shizuv1.RejectReason_REJECT_REASON_NOT_PERMITTED, st.Refusal())
}

// startBudgets watches the bucket and sweeps until the returned part is
// stopped.
func (s *Scheduler) startBudgets(ctx context.Context) service.Part {
	if s.d.Bus == nil {
		return service.PartFunc(func(context.Context) error { return nil })
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() { s.watchBudgets(ctx) })
	wg.Go(func() {
		tick := time.NewTicker(s.cfg.PendingRetry)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				s.onWholeRecords(func() { s.sweepBudgets(ctx) })
			}
		}
	})
	return service.PartFunc(func(context.Context) error {
		cancel()
		wg.Wait()
		return nil
	})
}

// watchBudgets keeps the book current: it opens the bucket once metering
// created it, then follows it, starting over when the watch ends.
func (s *Scheduler) watchBudgets(ctx context.Context) {
	warned := false
	for ctx.Err() == nil {
		err := s.followBudgets(ctx)
		if ctx.Err() != nil {
			return
		}
		if !warned || !errors.Is(err, budgetkv.ErrNoBucket) {
			s.d.Log.WarnContext(ctx, "budget states not followed yet; retrying", "err", err)
			warned = true
		}
		select {
		case <-ctx.Done():
		case <-time.After(budgetRetry):
		}
	}
}

func (s *Scheduler) followBudgets(ctx context.Context) error {
	kv, err := budgetkv.Open(ctx, s.d.Bus.JetStream())
	if err != nil {
		return err
	}
	changes, err := kv.Watch(ctx)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	initial := true
	for c := range changes {
		switch {
		case c == nil:
			// The bucket as it is now: what the previous watch held and
			// this one did not send is gone.
			s.budgets.mu.Lock()
			for k := range s.budgets.states {
				if !seen[k] {
					delete(s.budgets.states, k)
				}
			}
			s.budgets.mu.Unlock()
			initial = false
		default:
			if initial {
				seen[c.Key] = true
			}
			s.budgets.apply(c)
			if !c.Lifted {
				s.d.Log.InfoContext(ctx, "budget hard stop in force", "tenant", c.State.Tenant, "budget", c.State.Budget,
					"month", c.State.Month, "policy", string(c.State.Policy))
			}
		}
	}
	return errors.New("budget watch ended")
}

// sweepBudgets rejects the waiting first requests of every tenant whose
// state is in force, and under stop-running gives notice to and then
// cancels its running rentals.
func (s *Scheduler) sweepBudgets(ctx context.Context) {
	now := s.d.Now()
	states := s.budgets.allInForce(now)
	if len(states) == 0 || !s.budgets.sweeping.TryLock() {
		return
	}
	defer s.budgets.sweeping.Unlock()
	byTenant := make(map[string]budget.State, len(states))
	for _, st := range states {
		byTenant[st.Tenant] = st
	}
	if err := s.refuseWaiting(ctx, byTenant); err != nil {
		s.d.Log.WarnContext(ctx, "refuse waiting requests over budget", "err", err)
	}
	if err := s.stopOverBudget(ctx, byTenant, now); err != nil {
		s.d.Log.WarnContext(ctx, "stop rentals over budget", "err", err)
	}
}

// refuseWaiting rejects the pending first attempts of the tenants.
func (s *Scheduler) refuseWaiting(ctx context.Context, byTenant map[string]budget.State) error {
	entries, _, err := s.rec.Pending(ctx)
	if err != nil {
		return err
	}
	for _, e := range entries {
		st, ok := byTenant[e.Event.GetTenantId()]
		if !ok || e.Attempt > 1 {
			continue
		}
		if err := s.rejectNow(ctx, e.Event, 1, shizuv1.RejectReason_REJECT_REASON_NOT_PERMITTED, st.Refusal()); err != nil {
			return err
		}
		if err := s.rec.DropPending(ctx, e.Event.GetRentalId()); err != nil {
			return err
		}
	}
	return nil
}

// stopOverBudget gives notice to the running rentals of the stop-running
// tenants, and cancels those whose notice passed.
func (s *Scheduler) stopOverBudget(ctx context.Context, byTenant map[string]budget.State, now time.Time) error {
	stopping := false
	for _, st := range byTenant {
		stopping = stopping || st.StopsRunning(now)
	}
	if !stopping || s.d.Store == nil {
		return nil
	}
	snap, err := s.d.Store.Snapshot(ctx)
	if err != nil {
		return err
	}
	b := s.pub.NewBatch()
	var marks []string
	for i := range snap.Nodes {
		for _, a := range snap.Nodes[i].Allocations {
			st, ok := byTenant[a.Tenant]
			if !ok || !st.StopsRunning(now) || a.HandingOver {
				continue
			}
			got, err := s.overBudget(ctx, b, st, a, now)
			if err != nil {
				return err
			}
			marks = append(marks, got...)
		}
	}
	if len(marks) == 0 {
		return nil
	}
	if err := b.Wait(ctx); err != nil {
		return err
	}
	return s.markBudget(ctx, budget.Month(now), marks...)
}

// overBudget queues the notice of one running rental, and its cancel once
// the notice passed, unless marked sent; it returns the marks to set once
// they are stored.
func (s *Scheduler) overBudget(ctx context.Context, b ports.Batch, st budget.State, a capacity.Allocation, now time.Time) ([]string, error) {
	notice, cancel := budgetMark(st, a.RentalID, "notice"), budgetMark(st, a.RentalID, "cancel")
	sent, err := s.budgetMarked(ctx, st.Month, notice, cancel)
	if err != nil {
		return nil, err
	}
	var out []string
	if !sent[0] {
		deadline := st.StopAt()
		if deadline.Before(now) {
			deadline = now // placed after the notice was due (a request in flight then): stopped at once
		}
		if err := s.publish(ctx, b, subject.RentalPreempted, []string{a.Tenant}, &shizuv1.RentalPreempted{
			Meta:     shizuv1.NewMeta(fmt.Sprintf("rental:%s:preempted:budget:%s:%d", a.RentalID, st.Month, a.Attempt), s.source, "", a.RentalID, now),
			RentalId: a.RentalID, TenantId: a.Tenant, NodeId: a.NodeID, NodeEpoch: int64(max(a.Epoch, 1)),
			NoticeDeadline: timestamppb.New(deadline), Reason: shizuv1.PreemptReason_PREEMPT_REASON_BUDGET_EXHAUSTED,
			Message: shizuv1.Truncate(st.Notice(), 1000),
		}); err != nil {
			return nil, err
		}
		s.d.Log.InfoContext(ctx, "running rental given notice: its tenant's budget is spent", "rental", a.RentalID, "tenant", a.Tenant,
			"budget", st.Budget, "stop_at", deadline)
		out = append(out, notice)
	}
	if !sent[1] && !now.Before(st.StopAt()) {
		if err := s.publish(ctx, b, subject.RentalCancelRequested, []string{a.Tenant}, &shizuv1.RentalCancelRequested{
			Meta:     shizuv1.NewMeta(fmt.Sprintf("cancel:budget:%s:%s", a.RentalID, st.Month), s.source, "", a.RentalID, now),
			RentalId: a.RentalID, TenantId: a.Tenant, RequestedBy: "budget:" + st.Budget,
			Reason: shizuv1.Truncate(st.Refusal(), 1000),
		}); err != nil {
			return nil, err
		}
		s.d.Log.InfoContext(ctx, "running rental stopped: its tenant's budget is spent", "rental", a.RentalID, "tenant", a.Tenant, "budget", st.Budget)
		out = append(out, cancel)
	}
	return out, nil
}

// budgetMark names one sent notice or cancel of a rental (within its
// month's key).
func budgetMark(st budget.State, rental, what string) string {
	return st.Tenant + "|" + rental + "|" + what
}

// budgetMarkKey is the Redis hash of a month's marks.
func (s *Scheduler) budgetMarkKey(month string) string {
	return s.cfg.KeyPrefix + ":sched:budget:" + month
}

// budgetMarked says which of marks are set in month.
func (s *Scheduler) budgetMarked(ctx context.Context, month string, marks ...string) ([]bool, error) {
	out := make([]bool, len(marks))
	if s.d.Redis == nil {
		s.budgets.mu.RLock()
		defer s.budgets.mu.RUnlock()
		for i, m := range marks {
			out[i] = s.budgets.marks[month+"|"+m]
		}
		return out, nil
	}
	vals, err := s.d.Redis.HMGet(ctx, s.budgetMarkKey(month), marks...).Result()
	if err != nil {
		return nil, fmt.Errorf("read budget marks: %w", err)
	}
	for i, v := range vals {
		out[i] = v != nil
	}
	return out, nil
}

// markBudget sets marks in month.
func (s *Scheduler) markBudget(ctx context.Context, month string, marks ...string) error {
	if s.d.Redis == nil {
		s.budgets.mu.Lock()
		defer s.budgets.mu.Unlock()
		if s.budgets.marks == nil {
			s.budgets.marks = map[string]bool{}
		}
		for _, m := range marks {
			s.budgets.marks[month+"|"+m] = true
		}
		return nil
	}
	args := make([]any, 0, 2*len(marks))
	for _, m := range marks {
		args = append(args, m, 1)
	}
	_, err := s.d.Redis.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, s.budgetMarkKey(month), args...)
		p.Expire(ctx, s.budgetMarkKey(month), budgetMarkTTL)
		return nil
	})
	if err != nil {
		return fmt.Errorf("mark budget notices: %w", err)
	}
	return nil
}
