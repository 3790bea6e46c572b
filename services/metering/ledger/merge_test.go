package ledger_test

import (
	"reflect"
	"testing"
	"time"

	"pgregory.net/rapid"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
)

var ref = ledger.SegmentRef{RentalID: "r-1", Attempt: 1}

func facts() ledger.SegmentState {
	max := usd(1_000_000)
	return ledger.SegmentState{RentalID: "r-1", Attempt: 1, TenantID: "acme", NodeID: "node-1", Plan: shizuv1.Plan_PLAN_SPOT,
		Model: "H100-SXM5-80GB", Zone: "eu-1", GPUCount: 2, MilliGPU: 1000, Labels: map[string]string{"team": "nlp"}, MaxSpot: &max}
}

func merged(st ledger.SegmentState, due ledger.DueEntry, evs ...ledger.SegmentEvent) (ledger.SegmentState, ledger.DueEntry) {
	for _, ev := range evs {
		st, due = ledger.Merge(st, due, ev)
	}
	return st, due
}

func TestMergingTheEventsOfAPlacement(t *testing.T) {
	t.Parallel()
	t0 := epoch
	sched := ledger.ScheduledEvent(facts())
	start := ledger.StartedEvent(ref, "node-1", t0, t0.Add(time.Minute))
	lateStart := ledger.StartedEvent(ref, "node-9", t0.Add(time.Hour), t0.Add(2*time.Hour))
	stop := ledger.StoppedEvent(ref, t0, t0.Add(90*time.Second), shizuv1.ExitReason_EXIT_REASON_COMPLETED)
	noMax := facts()
	noMax.MaxSpot = nil
	noNode := facts()
	noNode.NodeID = ""
	cases := []struct {
		name    string
		from    ledger.SegmentState
		fromDue ledger.DueEntry
		events  []ledger.SegmentEvent
		check   func(st ledger.SegmentState, due ledger.DueEntry) string
	}{
		{"a schedule sets the pricing facts and lists nothing", ledger.SegmentState{}, ledger.DueEntry{}, []ledger.SegmentEvent{sched},
			func(st ledger.SegmentState, due ledger.DueEntry) string {
				if !st.Scheduled || st.TenantID != "acme" || st.GPUCount != 2 || st.MaxSpot == nil || due.Listed {
					return "facts not set, or listed"
				}
				return ""
			}},
		{"a start lists the segment as due at its first close", ledger.SegmentState{}, ledger.DueEntry{}, []ledger.SegmentEvent{start},
			func(st ledger.SegmentState, due ledger.DueEntry) string {
				if !st.StartedAt.Equal(t0) || st.NodeID != "node-1" || !due.Listed || !due.At.Equal(t0.Add(time.Minute)) {
					return "start not recorded or not due at its first close"
				}
				return ""
			}},
		{"the first start reported wins", ledger.SegmentState{}, ledger.DueEntry{}, []ledger.SegmentEvent{start, lateStart},
			func(st ledger.SegmentState, due ledger.DueEntry) string {
				if !st.StartedAt.Equal(t0) || st.StartNode != "node-1" || !due.At.Equal(t0.Add(time.Minute)) {
					return "a later start report moved the start or the due time"
				}
				return ""
			}},
		{"a stop keeps the earlier due entry", ledger.SegmentState{}, ledger.DueEntry{}, []ledger.SegmentEvent{start, stop},
			func(st ledger.SegmentState, due ledger.DueEntry) string {
				if !st.StoppedAt.Equal(t0.Add(90*time.Second)) || st.ExitReason != shizuv1.ExitReason_EXIT_REASON_COMPLETED || !due.At.Equal(t0.Add(time.Minute)) {
					return "stop not recorded or due entry moved"
				}
				return ""
			}},
		{"a schedule without a maximum spot price keeps the one known", ledger.SegmentState{}, ledger.DueEntry{}, []ledger.SegmentEvent{sched, ledger.ScheduledEvent(noMax)},
			func(st ledger.SegmentState, _ ledger.DueEntry) string {
				if st.MaxSpot == nil || st.MaxSpot.Micros != 1_000_000 {
					return "the maximum was cleared"
				}
				return ""
			}},
		{"the node is the start's while the schedule names none", ledger.SegmentState{}, ledger.DueEntry{}, []ledger.SegmentEvent{start, ledger.ScheduledEvent(noNode)},
			func(st ledger.SegmentState, _ ledger.DueEntry) string {
				if st.NodeID != "node-1" {
					return "node " + st.NodeID
				}
				return ""
			}},
		{"the schedule's node wins over the start's", ledger.SegmentState{}, ledger.DueEntry{}, []ledger.SegmentEvent{lateStart, sched},
			func(st ledger.SegmentState, _ ledger.DueEntry) string {
				if st.NodeID != "node-1" || st.StartNode != "node-9" {
					return "node " + st.NodeID + " start node " + st.StartNode
				}
				return ""
			}},
		{"a redelivered stop of a finished segment takes it off the due list", ledger.SegmentState{Done: true},
			ledger.DueEntry{Listed: true, At: t0}, []ledger.SegmentEvent{stop},
			func(_ ledger.SegmentState, due ledger.DueEntry) string {
				if due.Listed {
					return "a finished segment is listed"
				}
				return ""
			}},
		{"a load changes nothing", facts(), ledger.DueEntry{Listed: true, At: t0}, []ledger.SegmentEvent{{Ref: ref}},
			func(st ledger.SegmentState, due ledger.DueEntry) string {
				if !reflect.DeepEqual(st, facts()) || !due.At.Equal(t0) {
					return "changed"
				}
				return ""
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st, due := merged(tc.from, tc.fromDue, tc.events...)
			if msg := tc.check(st, due); msg != "" {
				t.Fatalf("%s: state %+v, due %+v", msg, st, due)
			}
		})
	}
}

func TestAdvancingACursor(t *testing.T) {
	t.Parallel()
	t0 := epoch
	cases := []struct {
		name     string
		from     ledger.SegmentState
		advance  ledger.Advance
		want     time.Time
		wantDone bool
		wantDue  ledger.DueEntry
	}{
		{"a first advance sets the cursor and the next close", ledger.SegmentState{}, ledger.Advance{Cursor: t0, Due: t0.Add(time.Minute)},
			t0, false, ledger.DueEntry{Listed: true, At: t0.Add(time.Minute)}},
		{"a cursor never moves back", ledger.SegmentState{Cursor: t0.Add(time.Minute)}, ledger.Advance{Cursor: t0, Due: t0.Add(time.Minute)},
			t0.Add(time.Minute), false, ledger.DueEntry{Listed: true, At: t0.Add(time.Minute)}},
		{"a finishing advance takes the segment off the due list", ledger.SegmentState{}, ledger.Advance{Cursor: t0, Finished: true},
			t0, true, ledger.DueEntry{}},
		{"a running advance after the finishing one does not list it again", ledger.SegmentState{Cursor: t0, Done: true},
			ledger.Advance{Cursor: t0.Add(-time.Minute), Due: t0.Add(time.Minute)}, t0, true, ledger.DueEntry{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st, due := tc.advance.Apply(tc.from, ledger.DueEntry{Listed: true, At: t0.Add(-time.Hour)})
			if !st.Cursor.Equal(tc.want) || st.Done != tc.wantDone || due != tc.wantDue {
				t.Fatalf("cursor %s done %v due %+v, want %s %v %+v", st.Cursor, st.Done, due, tc.want, tc.wantDone, tc.wantDue)
			}
		})
	}
	if got := ledger.EarliestLoss(ledger.EarliestLoss(time.Time{}, t0.Add(time.Second)), t0); !got.Equal(t0) {
		t.Fatalf("earliest loss %s, want %s", got, t0)
	}
	if got := ledger.EarliestLoss(t0, t0.Add(time.Second)); !got.Equal(t0) {
		t.Fatalf("a later loss report moved the loss to %s", got)
	}
}

// genEvents draws one schedule, one start and one stop of a placement.
func genEvents(t *rapid.T) []ledger.SegmentEvent {
	start := epoch.Add(time.Duration(rapid.Int64Range(0, 3600).Draw(t, "start")) * time.Second)
	stop := start.Add(time.Duration(rapid.Int64Range(0, 3600).Draw(t, "duration")) * time.Second)
	f := facts()
	f.NodeID = rapid.SampledFrom([]string{"", "node-1"}).Draw(t, "node")
	return []ledger.SegmentEvent{
		ledger.ScheduledEvent(f),
		ledger.StartedEvent(ref, "node-2", start, ledger.NextBoundary(start, time.Minute)),
		ledger.StoppedEvent(ref, start, stop, shizuv1.ExitReason_EXIT_REASON_PREEMPTED),
	}
}

func TestPropertyAnOrderOfAPlacementsEventsGivesOneStateAndRedeliveryChangesNothing(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		evs := genEvents(t)
		want, _ := merged(ledger.SegmentState{}, ledger.DueEntry{}, evs...)
		perm := rapid.Permutation(evs).Draw(t, "order")
		got, due := merged(ledger.SegmentState{}, ledger.DueEntry{}, perm...)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("order %v gave %+v, in order %+v", perm, got, want)
		}
		again := rapid.SliceOfN(rapid.SampledFrom(evs), 1, 5).Draw(t, "redelivered")
		st, dueAgain := merged(got, due, again...)
		if !reflect.DeepEqual(st, got) || dueAgain != due {
			t.Fatalf("redelivering %v changed %+v / %+v into %+v / %+v", again, got, due, st, dueAgain)
		}
		if !due.Listed {
			t.Fatalf("a started segment is not due")
		}
	})
}

func TestTheCutoffIsTheClockHeldBackToTheWatermark(t *testing.T) {
	t.Parallel()
	now := epoch.Add(time.Hour)
	cases := []struct {
		name      string
		watermark time.Time
		follows   bool
		want      time.Time
	}{
		{"a meter that follows no durable bills by its clock", epoch, false, now},
		{"a watermark behind the clock holds billing back to it", epoch, true, epoch},
		{"a watermark ahead of the clock leaves the clock", now.Add(time.Minute), true, now},
		{"a watermark never read holds billing back entirely", time.Time{}, true, time.Time{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := ledger.Cutoff(now, tc.watermark, tc.follows); !got.Equal(tc.want) {
				t.Fatalf("cutoff %s, want %s", got, tc.want)
			}
		})
	}
}

func TestTheLostAttemptIsTheRunningPlacementOnTheLostNode(t *testing.T) {
	t.Parallel()
	on := func(attempt int32, node string, ended bool) ledger.SegmentState {
		st := ledger.SegmentState{RentalID: "r-1", Attempt: attempt, NodeID: node}
		if ended {
			st.StoppedAt = epoch
		}
		return st
	}
	cases := []struct {
		name       string
		placements []ledger.SegmentState
		want       int32
	}{
		{"the latest running placement on the node", []ledger.SegmentState{on(1, "n-1", false), on(2, "n-2", false), on(3, "n-1", false)}, 3},
		{"a running one wins over a later ended one", []ledger.SegmentState{on(1, "n-1", false), on(2, "n-1", true)}, 1},
		{"else the latest one on the node", []ledger.SegmentState{on(1, "n-1", true), on(2, "n-1", true), on(3, "n-2", false)}, 2},
		{"none known on the node: the first", []ledger.SegmentState{on(2, "n-2", false)}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := ledger.LostAttempt(tc.placements, "n-1"); got != tc.want {
				t.Fatalf("attempt %d, want %d", got, tc.want)
			}
		})
	}
}
