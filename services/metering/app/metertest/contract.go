package metertest

import (
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/app"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/services/metering/pricing"
)

var t0 = time.Date(2026, 11, 2, 9, 0, 0, 0, time.UTC)

func usd(micros int64) pricing.Money { return pricing.Money{Micros: micros, Currency: "USD"} }

func scheduledFacts(ref ledger.SegmentRef) ledger.SegmentState {
	return ledger.SegmentState{RentalID: ref.RentalID, Attempt: ref.Attempt, TenantID: "acme", NodeID: "node-1",
		Plan: shizuv1.Plan_PLAN_SPOT, Model: "H100-SXM5-80GB", Zone: "eu-1", GPUCount: 4, MilliGPU: 1000,
		Labels: map[string]string{"team": "nlp"}}
}

// RunSegmentStoreContract checks what the meter relies on of an
// app.SegmentStore; newStore returns an empty one.
func RunSegmentStoreContract(t *testing.T, newStore func(t *testing.T) app.SegmentStore) {
	cases := []struct {
		name string
		run  func(t *testing.T, s app.SegmentStore)
	}{
		{"a batch gives each segment its own events, in first-seen order", batchGivesEachSegmentItsOwnEvents},
		{"a start makes the segment due at its first close, to the second", startMakesTheSegmentDue},
		{"a finished segment is never due again", finishedSegmentIsNeverDueAgain},
		{"the earliest loss wins and ends only the placement it was reported for", earliestLossWins},
		{"the spot history is every price up to the segment's end", spotHistoryUpToTheEnd},
		{"a parked segment is dropped and a scheduled one kept", parkedSegmentIsDroppedScheduledKept},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, newStore(t))
		})
	}
}

func parkedSegmentIsDroppedScheduledKept(t *testing.T, s app.SegmentStore) {
	parked, scheduled := ledger.SegmentRef{RentalID: "r-parked", Attempt: 1}, ledger.SegmentRef{RentalID: "r-sched", Attempt: 1}
	if _, err := s.MergeSegments(t.Context(), []ledger.SegmentEvent{
		ledger.StartedEvent(parked, "node-1", t0, t0),
		ledger.ScheduledEvent(scheduledFacts(scheduled)), ledger.StartedEvent(scheduled, "node-1", t0, t0),
	}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ref  ledger.SegmentRef
		want bool
	}{{parked, true}, {scheduled, false}, {parked, true}} {
		if dropped, err := s.DropParked(t.Context(), c.ref); err != nil || dropped != c.want {
			t.Fatalf("DropParked(%v) = %v, %v; want %v", c.ref, dropped, err, c.want)
		}
	}
	due, err := s.Due(t.Context(), t0.Add(time.Hour), 10)
	if err != nil || !slices.Equal(due, []ledger.SegmentRef{scheduled}) {
		t.Fatalf("due %v (%v), want only the scheduled segment", due, err)
	}
	states, err := s.MergeSegments(t.Context(), []ledger.SegmentEvent{{Ref: parked}, {Ref: scheduled}})
	if err != nil || !states[0].StartedAt.IsZero() || !states[1].Scheduled {
		t.Fatalf("states %+v (%v): want the parked one gone, the scheduled one kept", states, err)
	}
}

func batchGivesEachSegmentItsOwnEvents(t *testing.T, s app.SegmentStore) {
	a, b, c := ledger.SegmentRef{RentalID: "r-a", Attempt: 1}, ledger.SegmentRef{RentalID: "r-b", Attempt: 2}, ledger.SegmentRef{RentalID: "r-c", Attempt: 1}
	states, err := s.MergeSegments(t.Context(), []ledger.SegmentEvent{
		ledger.StartedEvent(a, "node-1", t0, t0.Add(time.Minute)),
		ledger.ScheduledEvent(scheduledFacts(b)),
		ledger.StartedEvent(a, "node-9", t0.Add(time.Hour), t0.Add(time.Hour)),
		ledger.StoppedEvent(b, t0, t0.Add(90*time.Second), shizuv1.ExitReason_EXIT_REASON_COMPLETED),
		{Ref: c},
		ledger.StoppedEvent(a, t0, t0.Add(30*time.Second), shizuv1.ExitReason_EXIT_REASON_CANCELLED),
	})
	if err != nil || len(states) != 3 || states[0].RentalID != "r-a" || states[1].RentalID != "r-b" || states[2].RentalID != "r-c" {
		t.Fatalf("states %+v (%v), want r-a, r-b, r-c", states, err)
	}
	if sa := states[0]; !sa.StartedAt.Equal(t0) || sa.NodeID != "node-1" || !sa.StoppedAt.Equal(t0.Add(30*time.Second)) || sa.Scheduled {
		t.Fatalf("r-a: %+v", sa)
	}
	if sb := states[1]; !sb.Scheduled || sb.GPUCount != 4 || sb.Labels["team"] != "nlp" || !sb.StoppedAt.Equal(t0.Add(90*time.Second)) {
		t.Fatalf("r-b: %+v", sb)
	}
	if sc := states[2]; sc.Scheduled || !sc.StartedAt.IsZero() {
		t.Fatalf("r-c was only loaded, yet %+v", sc)
	}
	if got, err := s.Attempts(t.Context(), "r-b"); err != nil || !slices.Equal(got, []int32{2}) {
		t.Fatalf("attempts of r-b %v (%v), want [2]", got, err)
	}
}

func startMakesTheSegmentDue(t *testing.T, s app.SegmentStore) {
	ref := ledger.SegmentRef{RentalID: "r-1", Attempt: 1}
	first := t0.Add(time.Minute + 30*time.Second)
	if _, err := s.MergeSegments(t.Context(), []ledger.SegmentEvent{ledger.StartedEvent(ref, "node-1", t0, first)}); err != nil {
		t.Fatal(err)
	}
	if due, err := s.Due(t.Context(), first.Add(-time.Second), 10); err != nil || len(due) != 0 {
		t.Fatalf("due a second early: %v (%v)", due, err)
	}
	if due, err := s.Due(t.Context(), first.Add(999*time.Millisecond), 10); err != nil || !slices.Equal(due, []ledger.SegmentRef{ref}) {
		t.Fatalf("due at its first close: %v (%v)", due, err)
	}
}

func finishedSegmentIsNeverDueAgain(t *testing.T, s app.SegmentStore) {
	ref := ledger.SegmentRef{RentalID: "r-f", Attempt: 1}
	stop := t0.Add(90 * time.Second)
	redeliver := []ledger.SegmentEvent{ledger.StartedEvent(ref, "node-1", t0, t0.Add(time.Minute)),
		ledger.StoppedEvent(ref, t0, stop, shizuv1.ExitReason_EXIT_REASON_COMPLETED)}
	steps := []func() error{
		func() error { _, err := s.MergeSegments(t.Context(), redeliver); return err },
		func() error {
			return s.AdvanceAll(t.Context(), []ledger.Advance{{Ref: ref, Cursor: stop, Finished: true}})
		},
		func() error { // the closer's running advance lands after the finishing one
			return s.AdvanceAll(t.Context(), []ledger.Advance{{Ref: ref, Cursor: t0.Add(time.Minute), Due: t0.Add(2 * time.Minute)}})
		},
		func() error { _, err := s.MergeSegments(t.Context(), redeliver); return err },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatal(err)
		}
		if due, err := s.Due(t.Context(), t0.Add(time.Hour), 10); i > 0 && (err != nil || len(due) != 0) {
			t.Fatalf("after step %d: due %v (%v), want nothing", i, due, err)
		}
	}
	states, err := s.MergeSegments(t.Context(), []ledger.SegmentEvent{{Ref: ref}})
	if err != nil || !states[0].Done || !states[0].Cursor.Equal(stop) {
		t.Fatalf("segment %+v (%v), want done with its cursor at the stop", states, err)
	}
}

func earliestLossWins(t *testing.T, s app.SegmentStore) {
	one, two := ledger.SegmentRef{RentalID: "r-1", Attempt: 1}, ledger.SegmentRef{RentalID: "r-1", Attempt: 2}
	for _, at := range []time.Time{t0.Add(2 * time.Minute), t0.Add(time.Minute), t0.Add(3 * time.Minute)} {
		if err := s.Lost(t.Context(), "r-1", 1, at); err != nil {
			t.Fatal(err)
		}
	}
	states, err := s.MergeSegments(t.Context(), []ledger.SegmentEvent{{Ref: one}, ledger.StartedEvent(two, "node-1", t0.Add(5*time.Minute), t0.Add(6*time.Minute))})
	if err != nil || !states[0].LostAt.Equal(t0.Add(time.Minute)) || !states[1].LostAt.IsZero() {
		t.Fatalf("states %+v (%v), want attempt 1 lost at the earliest report and attempt 2 not lost", states, err)
	}
}

func spotHistoryUpToTheEnd(t *testing.T, s app.SegmentStore) {
	points := []ledger.PricePoint{{At: t0, Price: usd(900_000)}, {At: t0.Add(time.Minute), Price: usd(1_400_000)}, {At: t0.Add(time.Hour), Price: usd(700_000)}}
	for _, p := range append(points, points[0]) { // a redelivered price
		if err := s.SpotPrice(t.Context(), "eu-1", "H100-SXM5-80GB", p); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.SpotPrices(t.Context(), "eu-1", "H100-SXM5-80GB", t0.Add(time.Minute))
	if err != nil || !slices.Equal(got, points[:2]) {
		t.Fatalf("history %v (%v), want %v", got, err, points[:2])
	}
	if all, err := s.SpotPrices(t.Context(), "eu-1", "H100-SXM5-80GB", time.Time{}); err != nil || len(all) != 3 {
		t.Fatalf("whole history %v (%v), want 3 prices", all, err)
	}
	if other, err := s.SpotPrices(t.Context(), "us-1", "H100-SXM5-80GB", time.Time{}); err != nil || len(other) != 0 {
		t.Fatalf("another zone's history %v (%v), want none", other, err)
	}
}

// UsageRecord is a valid usage record of tenant with id and amount.
func UsageRecord(id, tenant string, micros int64) *shizuv1.UsageRecorded {
	return &shizuv1.UsageRecorded{Meta: shizuv1.NewMeta(id, "test", "", "r-1", t0.Add(time.Minute)), TenantId: tenant, RentalId: "r-1",
		NodeId: "node-1", Plan: shizuv1.Plan_PLAN_ON_DEMAND, Model: "H100-SXM5-80GB",
		IntervalStart: timestamppb.New(t0), IntervalEnd: timestamppb.New(t0.Add(time.Minute)), Seconds: 60, GpuCount: 1, MilliGpu: 1000,
		UnitPricePerGpuHour: &shizuv1.Money{Micros: 3_600_000, Currency: "USD"}, Amount: &shizuv1.Money{Micros: micros, Currency: "USD"}}
}

// RunUsageStoreContract checks what the meter relies on of an
// app.UsageStore; newStore returns an empty one.
func RunUsageStoreContract(t *testing.T, newStore func(t *testing.T) app.UsageStore) {
	t.Run("a record applied twice counts once and reports the month's spend", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		got, err := s.ApplyAll(t.Context(), "", []*shizuv1.UsageRecorded{UsageRecord("usage:a", "acme", 700), UsageRecord("usage:b", "acme", 300),
			UsageRecord("usage:a", "acme", 700), UsageRecord("usage:c", "other", 5)})
		if err != nil || len(got) != 4 {
			t.Fatalf("applied %+v (%v)", got, err)
		}
		if !got[0].New || got[0].MonthAfter != 700 || !got[1].New || got[1].MonthBefore != 700 || got[1].MonthAfter != 1000 ||
			got[2].New || got[2].MonthAfter != 1000 || !got[3].New || got[3].MonthAfter != 5 {
			t.Fatalf("applied %+v", got)
		}
		again, err := s.ApplyAll(t.Context(), "", []*shizuv1.UsageRecorded{UsageRecord("usage:b", "acme", 300)})
		if err != nil || again[0].New || again[0].MonthAfter != 1000 {
			t.Fatalf("a redelivered record: %+v (%v)", again, err)
		}
	})
	t.Run("a threshold is alerted once a month", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		for _, th := range []int64{500, 100, 500} {
			if _, err := s.Alert(t.Context(), "acme", "2026-11", th); err != nil {
				t.Fatal(err)
			}
		}
		if first, err := s.Alert(t.Context(), "acme", "2026-12", 100); err != nil || !first {
			t.Fatalf("a new month's first alert: %v (%v)", first, err)
		}
		if again, err := s.Alert(t.Context(), "acme", "2026-11", 100); err != nil || again {
			t.Fatalf("an alerted threshold alerted again: %v (%v)", again, err)
		}
		if got, err := s.Alerts(t.Context(), "acme", "2026-11"); err != nil || !slices.Equal(got, []int64{100, 500}) {
			t.Fatalf("alerts %v (%v), want [100 500]", got, err)
		}
		if got, err := s.Alerts(t.Context(), "other", "2026-11"); err != nil || len(got) != 0 {
			t.Fatalf("another tenant's alerts %v (%v)", got, err)
		}
	})
}

// RunPublisherContract checks what the meter relies on of an
// app.Publisher; newPublisher returns one and a reader of the event ids
// the stream holds on usage.*.recorded, in the order stored.
func RunPublisherContract(t *testing.T, newPublisher func(t *testing.T) (app.Publisher, func(t *testing.T) []string)) {
	t.Run("a batch stores every event once it is waited for, a repeated id once", func(t *testing.T) {
		t.Parallel()
		p, stored := newPublisher(t)
		b := p.NewBatch()
		for _, id := range []string{"usage:r-1:a", "usage:r-1:b", "usage:r-1:a"} {
			if err := b.Publish(t.Context(), "usage.acme.recorded", UsageRecord(id, "acme", 5)); err != nil {
				t.Fatal(err)
			}
		}
		if b.Len() != 3 {
			t.Fatalf("%d queued, want 3", b.Len())
		}
		if err := b.Wait(t.Context()); err != nil {
			t.Fatal(err)
		}
		again := p.NewBatch()
		if err := again.Publish(t.Context(), "usage.acme.recorded", UsageRecord("usage:r-1:b", "acme", 5)); err != nil {
			t.Fatal(err)
		}
		if err := again.Wait(t.Context()); err != nil {
			t.Fatal(err)
		}
		if got := stored(t); !slices.Equal(got, []string{"usage:r-1:a", "usage:r-1:b"}) {
			t.Fatalf("stored %v, want each id once", got)
		}
		if empty := p.NewBatch(); empty.Len() != 0 || empty.Wait(t.Context()) != nil {
			t.Fatalf("an empty batch")
		}
	})
}

// RunDeadLetterContract checks what the meter relies on of an
// app.Publisher's dead letters; newPublisher returns one and a reader of
// the dead letters stored, in order, with Event left nil.
func RunDeadLetterContract(t *testing.T, newPublisher func(t *testing.T) (app.Publisher, func(t *testing.T) []app.DeadLetter)) {
	t.Run("a dead letter is stored once per id with its reason", func(t *testing.T) {
		t.Parallel()
		p, stored := newPublisher(t)
		dl := app.DeadLetter{Subject: "dlq.RENTALS.metering", ID: "dlq:RENTALS:metering:unscheduled:r-1:1",
			Event:  &shizuv1.RentalStarted{Meta: shizuv1.NewMeta("rental:r-1:started:1", "metering", "", "r-1", t0), RentalId: "r-1", Attempt: 1},
			Stream: "RENTALS", Consumer: "metering", Reason: "no RentalScheduled"}
		for range 2 {
			if err := p.DeadLetter(t.Context(), dl); err != nil {
				t.Fatal(err)
			}
		}
		want := dl
		want.Event = nil
		if got := stored(t); len(got) != 1 || got[0] != want {
			t.Fatalf("stored %+v, want %+v once", got, want)
		}
	})
}
