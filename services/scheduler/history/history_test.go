package history_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/history"
	"github.com/shizu-gpu/shizu/services/scheduler/round"
)

var t0 = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

func meta(id string) *shizuv1.EventMeta { return shizuv1.NewMeta(id, "test", "", "", t0) }

func requested(id string) *shizuv1.RentalRequested {
	return &shizuv1.RentalRequested{Meta: meta("req:" + id), RentalId: id, TenantId: "acme",
		Spec: &shizuv1.RentalSpec{GpuCount: 1, MilliGpu: 1000, Plan: shizuv1.Plan_PLAN_ON_DEMAND}}
}

func scheduled(id string, attempt int32) *shizuv1.RentalScheduled {
	return &shizuv1.RentalScheduled{Meta: meta(fmt.Sprintf("sched:%s:%d", id, attempt)), RentalId: id, TenantId: "acme", NodeId: "n1", Attempt: attempt}
}

func rejected(id string, reason shizuv1.RejectReason) *shizuv1.RentalRejected {
	return &shizuv1.RentalRejected{Meta: meta("rej:" + id), RentalId: id, TenantId: "acme", Reason: reason}
}

func pending(id string, reason shizuv1.PendingReason) *shizuv1.RentalPending {
	return &shizuv1.RentalPending{Meta: meta("pend:" + id), RentalId: id, TenantId: "acme", Reason: reason}
}

func stopped(id string, attempt int32) *shizuv1.RentalStopped {
	return &shizuv1.RentalStopped{Meta: meta(fmt.Sprintf("stop:%s:%d", id, attempt)), RentalId: id, TenantId: "acme", NodeId: "n1", Attempt: attempt}
}

func migrating(id string, next int32) *shizuv1.RentalMigrating {
	return &shizuv1.RentalMigrating{Meta: meta(fmt.Sprintf("mig:%s:%d", id, next)), RentalId: id, TenantId: "acme", FromNodeId: "n1",
		NextAttempt: next, Spec: requested(id).GetSpec()}
}

func cancel(id string) *shizuv1.RentalCancelRequested {
	return &shizuv1.RentalCancelRequested{Meta: meta("cancel:" + id), RentalId: id, TenantId: "acme"}
}

func fold(evs ...proto.Message) history.Records {
	f := history.New("scheduler")
	for _, ev := range evs {
		f.Add(ev)
	}
	return f.Records()
}

// decided renders the decided attempts as "rental/attempt=outcome[+running]".
func decided(r history.Records) []string {
	var out []string
	for _, d := range r.Decided {
		s := fmt.Sprintf("%s/%d=%s", d.Rental, d.Attempt, d.Outcome)
		if d.Running {
			s += "+running"
		}
		out = append(out, s)
	}
	return out
}

func waiting(r history.Records) []string {
	var out []string
	for _, p := range r.Pending {
		out = append(out, fmt.Sprintf("%s/%d:%s", p.Event.GetRentalId(), p.Attempt, p.Reason))
	}
	return out
}

func TestTheFoldTellsDecidedAttemptsFromWaitingRequests(t *testing.T) {
	t.Parallel()
	const noCap, preempt = shizuv1.PendingReason_PENDING_REASON_NO_CAPACITY, shizuv1.PendingReason_PENDING_REASON_AWAITING_PREEMPTION
	for _, c := range []struct {
		name             string
		events           []proto.Message
		decided, waiting []string
	}{
		{"a request with no outcome waits, as its RentalPending said",
			[]proto.Message{requested("a"), pending("a", preempt)}, nil, []string{"a/1:" + preempt.String()}},
		{"a request never reported pending is still its consumer's, not the pending set's",
			[]proto.Message{requested("a")}, nil, nil},
		{"a placed rental that runs is decided and running",
			[]proto.Message{requested("a"), pending("a", noCap), scheduled("a", 1)}, []string{"a/1=scheduled+running"}, nil},
		{"a placed rental that stopped is decided, not running",
			[]proto.Message{requested("a"), scheduled("a", 1), stopped("a", 1)}, []string{"a/1=scheduled"}, nil},
		{"a rejection decides the request",
			[]proto.Message{requested("a"), pending("a", noCap), rejected("a", shizuv1.RejectReason_REJECT_REASON_PENDING_TIMEOUT)},
			[]string{"a/1=rejected"}, nil},
		{"a rejection for a cancel is a cancelled outcome",
			[]proto.Message{requested("a"), cancel("a"), rejected("a", shizuv1.RejectReason_REJECT_REASON_CANCELLED)},
			[]string{"a/1=cancelled"}, nil},
		{"a cancel not answered yet cancels the waiting request",
			[]proto.Message{requested("a"), pending("a", noCap), cancel("a")}, []string{"a/1=cancelled"}, nil},
		{"a cancel of a placed rental leaves it placed (its stop follows)",
			[]proto.Message{requested("a"), scheduled("a", 1), cancel("a")}, []string{"a/1=scheduled+running"}, nil},
		{"a moved rental waits as its next attempt, the old run stopped",
			[]proto.Message{requested("a"), scheduled("a", 1), stopped("a", 1), migrating("a", 2), pending("a", noCap)},
			[]string{"a/1=scheduled"}, []string{"a/2:" + noCap.String()}},
		{"a pending report of an earlier attempt does not make the next one pending",
			[]proto.Message{requested("a"), pending("a", preempt), scheduled("a", 1), stopped("a", 1), migrating("a", 2)},
			[]string{"a/1=scheduled"}, nil},
		{"a moved rental placed again runs as its latest attempt only",
			[]proto.Message{requested("a"), scheduled("a", 1), migrating("a", 2), scheduled("a", 2), stopped("a", 1)},
			[]string{"a/1=scheduled", "a/2=scheduled+running"}, nil},
		{"a redelivered request or a repeated outcome changes nothing",
			[]proto.Message{requested("a"), scheduled("a", 1), requested("a"), scheduled("a", 1),
				rejected("a", shizuv1.RejectReason_REJECT_REASON_PENDING_TIMEOUT)},
			[]string{"a/1=scheduled+running"}, nil},
		{"a move failover could not describe places nothing",
			[]proto.Message{requested("a"), scheduled("a", 1), stopped("a", 1), &shizuv1.RentalMigrating{Meta: meta("m"), RentalId: "a", NextAttempt: 0}},
			[]string{"a/1=scheduled"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := fold(c.events...)
			if d := decided(got); !slices.Equal(d, c.decided) {
				t.Errorf("decided %v, want %v", d, c.decided)
			}
			if w := waiting(got); !slices.Equal(w, c.waiting) {
				t.Errorf("waiting %v, want %v", w, c.waiting)
			}
		})
	}
}

func TestAWaitingRequestKeepsItsOriginalEvent(t *testing.T) {
	t.Parallel()
	req := requested("a")
	got := fold(req, pending("a", shizuv1.PendingReason_PENDING_REASON_NO_CAPACITY), requested("b"), scheduled("b", 1))
	if len(got.Pending) != 1 || got.Pending[0].Event != req {
		t.Fatalf("pending %+v; want a's own RentalRequested (its time keeps its deadline)", got.Pending)
	}
	moved := fold(requested("c"), scheduled("c", 1), stopped("c", 1), migrating("c", 2), pending("c", shizuv1.PendingReason_PENDING_REASON_NO_CAPACITY))
	ev := moved.Pending[0].Event
	if ev.GetMeta().GetEventId() != "rental:c:requeued:2" || !ev.GetMeta().GetOccurredAt().AsTime().Equal(t0) ||
		!proto.Equal(ev.GetSpec(), requested("c").GetSpec()) {
		t.Fatalf("moved rental waits as %v; want the requeued request of attempt 2 at the move's time", ev)
	}
	m := migrating("e", 2)
	m.FromGpuModel = "A100-SXM4-80GB"
	preferring := fold(requested("e"), scheduled("e", 1), stopped("e", 1), m, pending("e", shizuv1.PendingReason_PENDING_REASON_NO_CAPACITY))
	if got := preferring.Pending[0].PreferredModels; len(got) != 1 || got[0] != "A100-SXM4-80GB" {
		t.Fatalf("a moved rental rebuilt pending prefers %v; want the model it ran on", got)
	}
	if d := fold(requested("d"), scheduled("d", 1)).Decided[0]; d.Request.GetRentalId() != "d" || d.Outcome != round.OutcomeScheduled {
		t.Fatalf("decided %+v; want d's request with it", d)
	}
}

func TestAPreemptionLastsUntilItsVictimStops(t *testing.T) {
	t.Parallel()
	notice := t0.Add(30 * time.Second)
	pre := &shizuv1.RentalPreempted{Meta: meta("pre:v"), RentalId: "v", TenantId: "acme", NodeId: "n1",
		NoticeDeadline: timestamppb.New(notice), PreemptingRentalId: "p"}
	sched := scheduled("v", 1)
	sched.NodeEpoch = 3
	got := fold(requested("v"), sched, requested("p"), pre)
	want := history.Preemption{Victim: "v", Tenant: "acme", Preemptor: "p", NodeID: "n1", NodeEpoch: 3, Notice: notice}
	if len(got.Preemptions) != 1 || got.Preemptions[0] != want {
		t.Fatalf("preemptions %+v, want %+v", got.Preemptions, want)
	}
	if got := fold(requested("v"), sched, pre, stopped("v", 1)); len(got.Preemptions) != 0 {
		t.Fatalf("a stopped victim still preempted: %+v", got.Preemptions)
	}
}

// A budget notice is no preemption: the budget sweep stops the rental
// (through a cancel), so a rebuild restores no preemption record for it.
func TestABudgetNoticeIsNoPreemption(t *testing.T) {
	t.Parallel()
	notice := &shizuv1.RentalPreempted{Meta: meta("budget:v"), RentalId: "v", TenantId: "acme", NodeId: "n1",
		NoticeDeadline: timestamppb.New(t0.Add(5 * time.Minute)), Reason: shizuv1.PreemptReason_PREEMPT_REASON_BUDGET_EXHAUSTED}
	got := fold(requested("v"), scheduled("v", 1), notice)
	if len(got.Preemptions) != 0 {
		t.Fatalf("preemptions %+v, want none for a budget notice", got.Preemptions)
	}
	if len(got.Decided) != 1 || !got.Decided[0].Running {
		t.Fatalf("decided %+v, want the rental running", got.Decided)
	}
}

// A rental id belongs to the tenant of its first event: another tenant's
// request, rejection, cancel or stop under that id (all refused by the
// scheduler) changes nothing of the owner's rental, and the owners are
// part of the records.
func TestAnotherTenantsEventsUnderARentalIdChangeNothing(t *testing.T) {
	t.Parallel()
	req := requested("r1")
	other := requested("r1")
	other.TenantId = "dev"
	refused := rejected("r1", shizuv1.RejectReason_REJECT_REASON_NOT_PERMITTED)
	refused.TenantId = "dev"
	otherCancel, otherStop := cancel("r1"), stopped("r1", 1)
	otherCancel.TenantId, otherStop.TenantId = "dev", "dev"
	got := fold(req, other, refused, pending("r1", shizuv1.PendingReason_PENDING_REASON_NO_CAPACITY), otherCancel, otherStop)
	if d := decided(got); len(d) != 0 {
		t.Fatalf("decided %v; the owner's request is still pending", d)
	}
	if len(got.Pending) != 1 || got.Pending[0].Event.GetTenantId() != "acme" {
		t.Fatalf("pending %v; want acme's request", got.Pending)
	}
	if !slices.Equal(got.Owners, []history.Owner{{Rental: "r1", Tenant: "acme"}}) {
		t.Fatalf("owners %v", got.Owners)
	}
	got = fold(req, scheduled("r1", 1), otherStop)
	if d := decided(got); !slices.Equal(d, []string{"r1/1=scheduled+running"}) {
		t.Fatalf("decided %v; another tenant's stop does not end acme's run", d)
	}
}
