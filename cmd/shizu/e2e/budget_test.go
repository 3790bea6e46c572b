package e2e

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/budget/budgetkv"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// budgetLog keeps the notices, cancel requests and budget crossings seen
// on the bus.
type budgetLog struct {
	mu        sync.Mutex
	notices   map[string][]*shizuv1.RentalPreempted
	cancels   map[string][]*shizuv1.RentalCancelRequested
	crossings map[string][]*shizuv1.BudgetThresholdCrossed
}

func (s *stack) watchBudgets() *budgetLog {
	l := &budgetLog{notices: map[string][]*shizuv1.RentalPreempted{}, cancels: map[string][]*shizuv1.RentalCancelRequested{},
		crossings: map[string][]*shizuv1.BudgetThresholdCrossed{}}
	nc := s.nats.Connect(s.t, nats.UserInfo(topology.Admin, password(topology.Admin)))
	on := func(subj string, newEv func() proto.Message, keep func(proto.Message)) {
		if _, err := nc.Subscribe(subj, func(m *nats.Msg) {
			ev := newEv()
			if proto.Unmarshal(m.Data, ev) != nil {
				return
			}
			l.mu.Lock()
			defer l.mu.Unlock()
			keep(ev)
		}); err != nil {
			s.t.Fatal(err)
		}
	}
	on(subject.RentalPreemptedAll, func() proto.Message { return &shizuv1.RentalPreempted{} }, func(m proto.Message) {
		ev := m.(*shizuv1.RentalPreempted)
		l.notices[ev.GetRentalId()] = append(l.notices[ev.GetRentalId()], ev)
	})
	on(subject.RentalCancelRequestedAll, func() proto.Message { return &shizuv1.RentalCancelRequested{} }, func(m proto.Message) {
		ev := m.(*shizuv1.RentalCancelRequested)
		l.cancels[ev.GetRentalId()] = append(l.cancels[ev.GetRentalId()], ev)
	})
	on(subject.UsageBudgetCrossedAll, func() proto.Message { return &shizuv1.BudgetThresholdCrossed{} }, func(m proto.Message) {
		ev := m.(*shizuv1.BudgetThresholdCrossed)
		l.crossings[ev.GetTenantId()] = append(l.crossings[ev.GetTenantId()], ev)
	})
	if err := nc.Flush(); err != nil {
		s.t.Fatal(err)
	}
	return l
}

func (l *budgetLog) read(fn func(*budgetLog)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fn(l)
}

// requestAs publishes tenant's RentalRequested of one whole GPU, as the API
// does.
func (s *stack) requestAs(tenant, rental string) {
	s.t.Helper()
	ev := &shizuv1.RentalRequested{
		Meta:     shizuv1.NewMeta("rental:"+rental+":requested", "e2e", "", rental, time.Now()),
		RentalId: rental, TenantId: tenant, Spec: &shizuv1.RentalSpec{Plan: shizuv1.Plan_PLAN_ON_DEMAND, GpuCount: 1, MilliGpu: 1000},
	}
	subj, err := subject.Format(subject.RentalRequested, tenant)
	if err != nil {
		s.t.Fatal(err)
	}
	if _, err := s.admin.Publish(s.t.Context(), subj, ev); err != nil {
		s.t.Fatal(err)
	}
}

// waitStarted waits until each rental's first run started.
func (s *stack) waitStarted(rentals ...string) {
	s.t.Helper()
	s.eventually(60*time.Second, func() error {
		for _, r := range rentals {
			if s.rec.startedAt(r, 1) == nil {
				return fmt.Errorf("%s not started", r)
			}
		}
		return nil
	})
}

// outcomeOf waits until rental is scheduled or rejected; the rejection, or
// nil when it was scheduled.
func (s *stack) outcomeOf(rental string) *shizuv1.RentalRejected {
	s.t.Helper()
	var rej *shizuv1.RentalRejected
	s.eventually(30*time.Second, func() error {
		s.rec.mu.Lock()
		defer s.rec.mu.Unlock()
		if rej = s.rec.rejected[rental]; rej != nil || len(s.rec.scheduled[rental]) > 0 {
			return nil
		}
		return fmt.Errorf("%s neither scheduled nor rejected", rental)
	})
	return rej
}

// budgetState reads tenant's state in the BUDGETS bucket (nil when none).
func (s *stack) budgetState(tenant string) jetstream.KeyValueEntry {
	kv, err := s.js.KeyValue(s.t.Context(), topology.BudgetsBucket)
	if err != nil {
		return nil
	}
	e, err := kv.Get(s.t.Context(), budgetkv.Key(tenant))
	if err != nil {
		return nil
	}
	return e
}

// refusedOnceInForce waits until tenant's budget state is stored, then
// requests until one request is rejected: a request racing with the
// state's arrival at the scheduler may still be placed. It returns the
// rejection and the rentals placed before it.
func (s *stack) refusedOnceInForce(tenant string) (*shizuv1.RentalRejected, []string) {
	s.t.Helper()
	s.eventually(60*time.Second, func() error {
		if s.budgetState(tenant) == nil {
			return fmt.Errorf("no budget state of %s yet", tenant)
		}
		return nil
	})
	var placed []string
	for i := range 10 {
		id := fmt.Sprintf("%s-probe%d", tenant, i)
		s.requestAs(tenant, id)
		if rej := s.outcomeOf(id); rej != nil {
			return rej, placed
		}
		placed = append(placed, id)
	}
	s.t.Fatalf("ten requests of %s placed after its budget state was stored", tenant)
	return nil, nil
}

// TestBudgetsStopAsTheirPolicySays runs the whole platform (real metering,
// scheduler and failover, a node agent child) with three tenants whose
// month budget (0.001 USD) their first rental spends within seconds, one
// per policy. Metering bills real usage, publishes each 100 % crossing and
// writes the hard stops; the scheduler acts on them: alert does nothing,
// reject-new rejects new rentals and leaves the running one alone,
// stop-running gives its running rental a notice and stops it after the
// 3 s grace as the tenant's own stop would, billed as such.
func TestBudgetsStopAsTheirPolicySays(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node-agent child process and the whole platform")
	}
	t.Parallel()
	accounts := filepath.Join(t.TempDir(), "accounts.json")
	doc := `{"budgets":[
		{"tenant_id":"alerting","currency":"USD","amount_micros":1000,"thresholds_percent":[100],"policy":"alert"},
		{"tenant_id":"capped","currency":"USD","amount_micros":1000,"policy":"reject-new"},
		{"tenant_id":"halted","currency":"USD","amount_micros":1000,"policy":"stop-running","grace":"3s"}]}`
	if err := os.WriteFile(accounts, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	s := newStack(t, stackConfig{MeterInterval: time.Second, CloseGrace: time.Second, Accounts: accounts})
	log := s.watchBudgets()
	s.startAgents(1)
	tenants := []string{"alerting", "capped", "halted"}
	for _, tn := range tenants {
		s.requestAs(tn, tn+"-1")
	}
	s.waitStarted("alerting-1", "capped-1", "halted-1")
	s.eventually(60*time.Second, func() error {
		var err error
		log.read(func(l *budgetLog) {
			for _, tn := range tenants {
				if len(l.crossings[tn]) == 0 {
					err = fmt.Errorf("no budget crossing of %s yet", tn)
				}
			}
		})
		return err
	})
	log.read(func(l *budgetLog) {
		for tn, want := range map[string]shizuv1.BudgetPolicy{"alerting": shizuv1.BudgetPolicy_BUDGET_POLICY_ALERT,
			"capped": shizuv1.BudgetPolicy_BUDGET_POLICY_REJECT_NEW, "halted": shizuv1.BudgetPolicy_BUDGET_POLICY_STOP_RUNNING} {
			c := l.crossings[tn][0]
			if c.GetPolicy() != want || c.GetExhausted() != (tn != "alerting") || c.GetThresholdPercent() != 100 {
				t.Errorf("%s's crossing: policy %s exhausted %v at %d %%", tn, c.GetPolicy(), c.GetExhausted(), c.GetThresholdPercent())
			}
		}
	})

	// stop-running: a notice, then after the grace a cancel as the
	// tenant's, the agent's stop, and the bill closed as for a tenant stop.
	var stopped *shizuv1.RentalStopped
	s.eventually(60*time.Second, func() error {
		s.rec.mu.Lock()
		defer s.rec.mu.Unlock()
		if stopped = s.rec.stopped["halted-1"][1]; stopped == nil {
			return errors.New("halted-1 not stopped yet")
		}
		return nil
	})
	var notice *shizuv1.RentalPreempted
	var cancels []*shizuv1.RentalCancelRequested
	log.read(func(l *budgetLog) {
		if len(l.notices["halted-1"]) > 0 {
			notice = l.notices["halted-1"][0]
		}
		cancels = l.cancels["halted-1"]
	})
	if notice == nil || notice.GetReason() != shizuv1.PreemptReason_PREEMPT_REASON_BUDGET_EXHAUSTED ||
		!strings.Contains(notice.GetMessage(), "the monthly budget of tenant halted is spent") {
		t.Fatalf("halted-1's notice: %v", notice)
	}
	if len(cancels) != 1 || cancels[0].GetRequestedBy() != "budget:monthly" {
		t.Fatalf("halted-1's cancel requests: %v", cancels)
	}
	deadline := notice.GetNoticeDeadline().AsTime()
	if stopped.GetExitReason() != shizuv1.ExitReason_EXIT_REASON_CANCELLED || stopped.GetStoppedAt().AsTime().Before(deadline) {
		t.Fatalf("halted-1 stopped %s at %s (%v), want cancelled at or after its notice deadline %s", stopped.GetExitReason(),
			stopped.GetStoppedAt().AsTime().Format(time.StampMilli), stopped.GetStoppedAt().AsTime().Sub(deadline), deadline.Format(time.StampMilli))
	}
	started := s.rec.startedAt("halted-1", 1).GetStartedAt().AsTime()
	stopAt := stopped.GetStoppedAt().AsTime()
	s.eventually(60*time.Second, func() error {
		// The run is billed up to its stop (the last second that began
		// before it), and, as a tenant's stop short of the minimum charge,
		// topped up to it from the stop.
		var last, topUp bool
		for _, u := range s.usage()["halted-1"] {
			from, to := u.GetIntervalStart().AsTime(), u.GetIntervalEnd().AsTime()
			switch {
			case from.Equal(stopAt) && to.Equal(started.Add(time.Minute)):
				topUp = true
			case to.After(stopAt):
				t.Fatalf("halted-1 billed [%s, %s), past its stop at %s", from.Format(time.StampMilli), to.Format(time.StampMilli), stopAt.Format(time.StampMilli))
			default:
				last = last || to.After(stopAt.Add(-time.Second))
			}
		}
		if !last || !topUp {
			return fmt.Errorf("halted-1's bill not closed as a tenant's stop: billed up to the stop %v, minimum-charge top-up %v", last, topUp)
		}
		return nil
	})
	rej, _ := s.refusedOnceInForce("halted")
	if rej.GetReason() != shizuv1.RejectReason_REJECT_REASON_NOT_PERMITTED || !strings.Contains(rej.GetMessage(), "the monthly budget of tenant halted is spent") {
		t.Fatalf("halted's new request: %v %q", rej.GetReason(), rej.GetMessage())
	}

	// reject-new: new requests rejected, the running rental billed past the
	// moment the stop-running tenant was stopped.
	rej, placed := s.refusedOnceInForce("capped")
	if rej.GetReason() != shizuv1.RejectReason_REJECT_REASON_NOT_PERMITTED ||
		!strings.Contains(rej.GetMessage(), "the monthly budget of tenant capped is spent") || !strings.Contains(rej.GetMessage(), "of 0.001 USD") {
		t.Fatalf("capped's new request: %v %q", rej.GetReason(), rej.GetMessage())
	}
	if len(placed) > 0 {
		t.Logf("%d of capped's requests raced the budget state and were placed", len(placed))
	}
	// alert: a new request runs.
	s.requestAs("alerting", "alerting-2")
	s.waitStarted("alerting-2")
	s.eventually(60*time.Second, func() error {
		for _, r := range []string{"capped-1", "alerting-1"} {
			billedAfter := false
			for _, u := range s.usage()[r] {
				billedAfter = billedAfter || u.GetIntervalStart().AsTime().After(stopAt)
			}
			if !billedAfter {
				return fmt.Errorf("%s not billed after halted-1 stopped yet", r)
			}
		}
		return nil
	})
	s.rec.mu.Lock()
	for _, r := range []string{"capped-1", "alerting-1", "alerting-2"} {
		if st := s.rec.stopped[r]; len(st) != 0 {
			t.Errorf("%s was stopped: %v", r, st)
		}
	}
	s.rec.mu.Unlock()
	log.read(func(l *budgetLog) {
		for _, r := range []string{"capped-1", "alerting-1", "alerting-2"} {
			if len(l.notices[r])+len(l.cancels[r]) != 0 {
				t.Errorf("%s got %d notices and %d cancels", r, len(l.notices[r]), len(l.cancels[r]))
			}
		}
	})
}
