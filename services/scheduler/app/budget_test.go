package app_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/app"
	"github.com/shizu-gpu/shizu/shared/budget"
	"github.com/shizu-gpu/shizu/shared/budget/budgetkv"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// clock is a test clock the test moves.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// budgetEnv is a replica on a moved clock, the BUDGETS bucket as metering
// writes it, and the cancel requests of the RENTALS stream.
type budgetEnv struct {
	*env
	clock   *clock
	scheds  []*app.Scheduler
	states  *budgetkv.Store
	mu      sync.Mutex
	cancels map[string][]*shizuv1.RentalCancelRequested
}

var budgetDay = time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)

// newBudgetEnv runs replicas scheduler replicas on one clock.
func newBudgetEnv(t *testing.T, replicas int) *budgetEnv {
	t.Helper()
	e := &budgetEnv{env: newEnv(t), clock: &clock{t: budgetDay}, cancels: map[string][]*shizuv1.RentalCancelRequested{}}
	var err error
	// What metering does at start, as its own user.
	if e.states, err = budgetkv.Ensure(t.Context(), e.Connect(t, topology.Metering).JetStream(), 1); err != nil {
		t.Fatal(err)
	}
	e.register(gpuNode("n1", 4, capacity.MarketOnDemand))
	for range replicas {
		e.replicaWith(testConfig(), e.clock.now, func(s *app.Scheduler) { e.scheds = append(e.scheds, s) })
	}
	cons, err := e.Admin.JetStream().OrderedConsumer(t.Context(), topology.StreamRentals,
		jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject.RentalCancelRequestedAll}})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		ev := &shizuv1.RentalCancelRequested{}
		if err := proto.Unmarshal(m.Data(), ev); err != nil {
			t.Errorf("decode cancel: %v", err)
			return
		}
		e.mu.Lock()
		e.cancels[ev.GetRentalId()] = append(e.cancels[ev.GetRentalId()], ev)
		e.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)
	return e
}

// exhaust writes tenant's state as metering does once its spend reached
// the budget, and waits until the replica's book has it.
func (e *budgetEnv) exhaust(tenant string, policy budget.Policy, grace time.Duration) budget.State {
	e.t.Helper()
	st, err := e.states.Put(e.t.Context(), budget.State{Tenant: tenant, Budget: "monthly", Month: budget.Month(e.clock.now()),
		SpentMicros: 1_000_250_000, LimitMicros: 1_000_000_000, Currency: "USD", Policy: policy,
		GraceMillis: grace.Milliseconds(), ExhaustedAt: e.clock.now()})
	if err != nil {
		e.t.Fatal(err)
	}
	testkit.Eventually(e.t, 10*time.Second, func() error {
		for i, s := range e.scheds {
			if !app.BudgetInForce(s, tenant, e.clock.now()) {
				return fmt.Errorf("replica %d has not seen the budget state yet", i)
			}
		}
		return nil
	})
	return st
}

// sweep runs a budget sweep on every replica.
func (e *budgetEnv) sweep() {
	for _, s := range e.scheds {
		app.SweepBudgets(e.t.Context(), s)
	}
}

// run requests rental for tenant and waits until it is scheduled.
func (e *budgetEnv) run(rental, tenant string) {
	e.t.Helper()
	e.publish(requested(rental, tenant, spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), e.clock.now()))
	e.seen.waitFor(e.t, 20*time.Second, func(o *outcomes) error {
		if len(o.scheduled[rental]) == 0 {
			return fmt.Errorf("%s not scheduled", rental)
		}
		return nil
	})
}

// rejectedFor waits until rental is rejected and returns the rejection.
func (e *budgetEnv) rejectedFor(rental string) *shizuv1.RentalRejected {
	e.t.Helper()
	var got *shizuv1.RentalRejected
	e.seen.waitFor(e.t, 20*time.Second, func(o *outcomes) error {
		if len(o.rejected[rental]) == 0 {
			return fmt.Errorf("%s not rejected", rental)
		}
		got = o.rejected[rental][0]
		return nil
	})
	return got
}

func (e *budgetEnv) cancelsOf(rental string) []*shizuv1.RentalCancelRequested {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]*shizuv1.RentalCancelRequested(nil), e.cancels[rental]...)
}

func checkRefusal(t *testing.T, rej *shizuv1.RentalRejected) {
	t.Helper()
	if rej.GetReason() != shizuv1.RejectReason_REJECT_REASON_NOT_PERMITTED ||
		rej.GetMessage() != "the monthly budget of tenant acme is spent for 2026-12: 1000.25 USD of 1000.00 USD; new rentals are refused until the budget is raised or the month ends" {
		t.Fatalf("rejection %v %q, want NOT_PERMITTED naming the budget and the spend", rej.GetReason(), rej.GetMessage())
	}
}

// Under reject-new, new requests of the tenant are rejected (and one
// waiting for capacity), its running rental is left alone, other tenants
// rent on; a raised budget (metering lifts the state) lets it rent again.
func TestABudgetSpentUnderRejectNewRejectsNewRentalsAndLeavesRunningOnes(t *testing.T) {
	t.Parallel()
	e := newBudgetEnv(t, 1)
	e.run("running", "acme")
	e.publish(requested("waiting", "acme", spec(4, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), e.clock.now()))
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) error {
		if len(o.pending["waiting"]) == 0 {
			return errors.New("the four-GPU request is not pending")
		}
		return nil
	})
	e.exhaust("acme", budget.RejectNew, 0)

	e.publish(requested("new", "acme", spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), e.clock.now()))
	checkRefusal(t, e.rejectedFor("new"))
	checkRefusal(t, e.rejectedFor("waiting"))
	e.run("other", "globex")
	// A request of acme under globex's rental id is refused as not acme's,
	// not as over budget: no outcome is recorded under globex's id.
	forged := requested("other", "acme", spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), e.clock.now())
	forged.Meta.EventId = "req:acme:other"
	e.publish(forged)
	if rej := e.rejectedFor("other"); rej.GetTenantId() != "acme" || strings.Contains(rej.GetMessage(), "budget") {
		t.Fatalf("acme's request under globex's id: %v %q", rej.GetTenantId(), rej.GetMessage())
	}

	e.sweep()
	e.clock.set(budgetDay.Add(time.Hour))
	e.sweep()
	e.seen.mu.Lock()
	if n, s := len(e.seen.preempted["running"]), e.seen.stops["running"]; n != 0 || s != 0 {
		t.Errorf("reject-new gave the running rental %d notices and %d stops", n, s)
	}
	e.seen.mu.Unlock()
	if c := e.cancelsOf("running"); len(c) != 0 {
		t.Errorf("reject-new cancelled the running rental: %v", c)
	}

	if err := e.states.Delete(t.Context(), "acme"); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		for _, s := range e.scheds {
			if app.BudgetInForce(s, "acme", e.clock.now()) {
				return errors.New("the lifted state is still in force")
			}
		}
		return nil
	})
	e.run("after-raise", "other-idea")
	e.publish(requested("after-lift", "acme", spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), e.clock.now()))
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) error {
		if len(o.scheduled["after-lift"]) == 0 && len(o.pending["after-lift"]) == 0 {
			return errors.New("acme's request after the lift is neither scheduled nor pending")
		}
		if len(o.rejected["after-lift"]) != 0 {
			return fmt.Errorf("rejected after the lift: %v", o.rejected["after-lift"][0])
		}
		return nil
	})
}

// Under stop-running (two replicas), each running rental of the tenant gets a notice
// whose deadline is the exhaustion plus the grace, is not stopped before
// it, and once it passed is cancelled as the tenant's own stop is (one
// StopRental, EXIT_REASON_CANCELLED); other tenants' rentals run on. A new
// month lifts the stop.
func TestABudgetSpentUnderStopRunningNoticesThenStopsAfterTheGrace(t *testing.T) {
	t.Parallel()
	e := newBudgetEnv(t, 2) // both replicas sweep; each notice and stop is given once
	e.run("mine", "acme")
	e.run("theirs", "globex")
	st := e.exhaust("acme", budget.StopRunning, 5*time.Minute)

	e.sweep()
	var notice *shizuv1.RentalPreempted
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) error {
		if len(o.preempted["mine"]) == 0 {
			return errors.New("no notice")
		}
		notice = o.preempted["mine"][0]
		return nil
	})
	if notice.GetReason() != shizuv1.PreemptReason_PREEMPT_REASON_BUDGET_EXHAUSTED ||
		!notice.GetNoticeDeadline().AsTime().Equal(budgetDay.Add(5*time.Minute)) ||
		!strings.Contains(notice.GetMessage(), "the monthly budget of tenant acme is spent for 2026-12 (1000.25 USD of 1000.00 USD): this rental will be stopped at 2026-12-04T10:05:00Z") {
		t.Fatalf("notice %v", notice)
	}
	if err := notice.Validate(); err != nil {
		t.Fatalf("the notice does not validate: %v", err)
	}
	// Before the deadline: no cancel, no stop, however often it sweeps.
	e.clock.set(st.StopAt().Add(-time.Second))
	e.sweep()
	e.sweep()
	if c := e.cancelsOf("mine"); len(c) != 0 {
		t.Fatalf("cancelled before the grace passed: %v", c)
	}
	e.publish(requested("new", "acme", spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), e.clock.now()))
	checkRefusal(t, e.rejectedFor("new"))

	e.clock.set(st.StopAt())
	e.sweep()
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) error {
		if o.stops["mine"] == 0 {
			return errors.New("the node was not told to stop the rental")
		}
		return nil
	})
	c := e.cancelsOf("mine")
	if len(c) != 1 || c[0].GetRequestedBy() != "budget:monthly" || c[0].GetTenantId() != "acme" ||
		!strings.Contains(c[0].GetReason(), "the monthly budget of tenant acme is spent") {
		t.Fatalf("cancels %v, want one by budget:monthly naming the budget", c)
	}
	e.sweep()
	e.seen.mu.Lock()
	stops, notices, theirs := e.seen.stops["mine"], len(e.seen.preempted["mine"]), e.seen.stops["theirs"]+len(e.seen.preempted["theirs"])
	e.seen.mu.Unlock()
	if stops != 1 || notices != 1 || theirs != 0 {
		t.Fatalf("%d stops and %d notices of acme's rental, %d of globex's; want 1, 1 and 0", stops, notices, theirs)
	}

	// January: the stop is lifted.
	e.clock.set(time.Date(2027, 1, 1, 0, 0, 1, 0, time.UTC))
	for _, s := range e.scheds {
		if app.BudgetInForce(s, "acme", e.clock.now()) {
			t.Fatal("December's budget state is in force in January")
		}
	}
	e.run("january", "acme")
}
