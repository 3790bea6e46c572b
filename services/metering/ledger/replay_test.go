package ledger_test

import (
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
)

var replayRules = ledger.Rules{Interval: time.Minute, MinimumCharge: time.Minute}

// onDemand is facts() on demand (no spot history needed to close it).
func onDemand(attempt int32, node string) ledger.SegmentState {
	f := facts()
	f.Plan, f.MaxSpot, f.Attempt, f.NodeID = shizuv1.Plan_PLAN_ON_DEMAND, nil, attempt, node
	return f
}

func billedOf(recs []ledger.Record) []ledger.BilledRecord {
	out := make([]ledger.BilledRecord, len(recs))
	for i, r := range recs {
		out[i] = ledger.BilledRecord{RentalID: r.RentalID, NodeID: r.NodeID, Start: r.Start, End: r.End}
	}
	return out
}

func restoredOf(t *testing.T, got []ledger.Restored, ref ledger.SegmentRef) ledger.Restored {
	t.Helper()
	for _, r := range got {
		if r.State.RentalID == ref.RentalID && r.State.Attempt == ref.Attempt {
			return r
		}
	}
	t.Fatalf("segment %v not restored", ref)
	return ledger.Restored{}
}

func TestARestoredRunningSegmentResumesBillingWhereTheStreamStops(t *testing.T) {
	t.Parallel()
	start := epoch.Add(15 * time.Second)
	grace := 30 * time.Second
	r := ledger.NewReplay()
	r.Merge(ledger.ScheduledEvent(onDemand(1, "node-1")))
	r.Merge(ledger.StartedEvent(ref, "node-1", start, ledger.NextBoundary(start, time.Minute).Add(grace)))
	st, due := merged(ledger.SegmentState{RentalID: "r-1", Attempt: 1}, ledger.DueEntry{}, ledger.ScheduledEvent(onDemand(1, "node-1")),
		ledger.StartedEvent(ref, "node-1", start, ledger.NextBoundary(start, time.Minute).Add(grace)))
	seg, _ := st.Segment()
	tariff := ledger.Tariff{Base: usd(2_000_000)}
	// The records of the first 5 minutes were published before the loss.
	published, cursor, err := ledger.Close(seg, tariff, replayRules, time.Time{}, epoch.Add(5*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range billedOf(published) {
		r.Billed(b)
	}
	got := restoredOf(t, r.Segments(replayRules, grace), ref)
	if !got.State.Cursor.Equal(cursor) || !got.Known || got.State.Done {
		t.Fatalf("restored cursor %s known %v done %v, want the cursor %s of the last published record", got.State.Cursor, got.Known, got.State.Done, cursor)
	}
	if want := epoch.Add(6*time.Minute + grace); !got.Due.Listed || !got.Due.At.Equal(want) {
		t.Fatalf("due %+v, want listed at %s (the next boundary plus grace)", got.Due, want)
	}
	if !got.State.StartedAt.Equal(st.StartedAt) || got.State.TenantID != st.TenantID || due.Listed != true {
		t.Fatalf("restored state %+v differs from the merged one %+v", got.State, st)
	}
	// Closing on from the restored cursor gives exactly the records not yet
	// published: together, the records of one close over the whole run.
	rest, _, err := ledger.Close(seg, tariff, replayRules, got.State.Cursor, epoch.Add(9*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	all, _, _ := ledger.Close(seg, tariff, replayRules, time.Time{}, epoch.Add(9*time.Minute))
	if len(published)+len(rest) != len(all) || rest[0].ID != all[len(published)].ID {
		t.Fatalf("published %d + resumed %d records, one close gives %d (first resumed %s)", len(published), len(rest), len(all), rest[0].ID)
	}
}

func TestARestoredStoppedSegmentWhoseRecordsAreAllPublishedIsDone(t *testing.T) {
	t.Parallel()
	start, stop := epoch.Add(10*time.Second), epoch.Add(20*time.Second)
	r := ledger.NewReplay()
	r.Merge(ledger.ScheduledEvent(onDemand(1, "node-1")))
	r.Merge(ledger.StartedEvent(ref, "node-1", start, epoch.Add(time.Minute)))
	r.Merge(ledger.StoppedEvent(ref, start, stop, shizuv1.ExitReason_EXIT_REASON_COMPLETED))
	st, _ := merged(ledger.SegmentState{RentalID: "r-1", Attempt: 1}, ledger.DueEntry{}, ledger.ScheduledEvent(onDemand(1, "node-1")),
		ledger.StoppedEvent(ref, start, stop, shizuv1.ExitReason_EXIT_REASON_COMPLETED))
	seg, _ := st.Segment()
	// Ten seconds and the top-up to the minimum charge.
	recs, _, err := ledger.Close(seg, ledger.Tariff{Base: usd(1_000_000)}, replayRules, time.Time{}, stop)
	if err != nil || len(recs) != 2 {
		t.Fatalf("close: %d records, %v", len(recs), err)
	}
	r.Billed(billedOf(recs)[0])
	partly := restoredOf(t, r.Segments(replayRules, 0), ref)
	if partly.State.Done || !partly.Due.Listed {
		t.Fatal("a stopped segment whose top-up is not published yet is done")
	}
	r.Billed(billedOf(recs)[1])
	done := restoredOf(t, r.Segments(replayRules, 0), ref)
	if !done.State.Done || done.Due.Listed || !done.State.Cursor.Equal(start.Add(time.Minute)) {
		t.Fatalf("restored %+v due %+v: want done at the top-up's end, off the due list", done.State, done.Due)
	}
}

func TestAReplayedFailoverReportWithoutAnAttemptEndsTheRunningPlacementOnTheLostNode(t *testing.T) {
	t.Parallel()
	r := ledger.NewReplay()
	second := ledger.SegmentRef{RentalID: "r-1", Attempt: 2}
	r.Merge(ledger.ScheduledEvent(onDemand(1, "node-1")))
	r.Merge(ledger.StartedEvent(ref, "node-1", epoch, epoch.Add(time.Minute)))
	r.Merge(ledger.StoppedEvent(ref, epoch, epoch.Add(time.Minute), shizuv1.ExitReason_EXIT_REASON_PREEMPTED))
	r.Merge(ledger.ScheduledEvent(onDemand(2, "node-1")))
	r.Merge(ledger.StartedEvent(second, "node-1", epoch.Add(2*time.Minute), epoch.Add(3*time.Minute)))
	if a := r.Lost("r-1", "node-1", 0, epoch.Add(5*time.Minute)); a != 2 {
		t.Fatalf("loss assigned to attempt %d, want the running attempt 2", a)
	}
	r.Lost("r-1", "node-1", 2, epoch.Add(7*time.Minute)) // a later report: the earliest wins
	got := restoredOf(t, r.Segments(replayRules, 0), second)
	if !got.State.LostAt.Equal(epoch.Add(5 * time.Minute)) {
		t.Fatalf("lost at %s, want the earliest report's heartbeat", got.State.LostAt)
	}
	if l := r.Losses(); len(l) != 1 || l[0].Attempt != 2 {
		t.Fatalf("losses %+v", l)
	}
}

func TestRecordsBelongToThePlacementOnTheirNodeThatStartedLastBeforeThem(t *testing.T) {
	t.Parallel()
	first := onDemand(1, "node-1")
	first.StartedAt = epoch
	first.StoppedAt = epoch.Add(3 * time.Minute)
	second := onDemand(2, "node-9")
	second.StartedAt = epoch.Add(4 * time.Minute)
	third := onDemand(3, "node-1")
	third.StartedAt = epoch.Add(8 * time.Minute)
	rec := func(node string, from, to time.Duration) ledger.BilledRecord {
		return ledger.BilledRecord{RentalID: "r-1", NodeID: node, Start: epoch.Add(from), End: epoch.Add(to)}
	}
	got := ledger.CursorOf([]ledger.SegmentState{first, second, third}, []ledger.BilledRecord{
		rec("node-1", 0, time.Minute), rec("node-1", 2*time.Minute, 3*time.Minute),
		rec("node-9", 5*time.Minute, 6*time.Minute), rec("node-9", 4*time.Minute, 5*time.Minute),
		rec("node-1", 8*time.Minute, 9*time.Minute),
	})
	want := map[int32]time.Time{1: epoch.Add(3 * time.Minute), 2: epoch.Add(6 * time.Minute), 3: epoch.Add(9 * time.Minute)}
	for a, c := range want {
		if g := got[ledger.SegmentRef{RentalID: "r-1", Attempt: a}]; !g.Equal(c) {
			t.Fatalf("attempt %d cursor %s, want %s (all: %v)", a, g, c, got)
		}
	}
}
