package redisstore_test

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/services/metering/pricing"
	"github.com/shizu-gpu/shizu/services/metering/redisstore"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

// placement is the Go rule's view of one segment.
type placement struct {
	st  ledger.SegmentState
	due ledger.DueEntry
}

var agreementRefs = []ledger.SegmentRef{{RentalID: "r-1", Attempt: 1}, {RentalID: "r-1", Attempt: 2}, {RentalID: "r-2", Attempt: 1}}

// op is one step: an event to merge, or an advance.
type op struct {
	ev      *ledger.SegmentEvent
	advance *ledger.Advance
}

// at draws an instant on a millisecond (the scripts compare cursors as
// Lua numbers, exact to well under a millisecond at today's nanoseconds).
func at(t *rapid.T, label string) time.Time {
	return t0.Add(time.Duration(rapid.Int64Range(-600_000, 3_600_000).Draw(t, label)) * time.Millisecond)
}

func genOp(t *rapid.T) op {
	ref := rapid.SampledFrom(agreementRefs).Draw(t, "ref")
	switch rapid.IntRange(0, 4).Draw(t, "kind") {
	case 0:
		st := ledger.SegmentState{RentalID: ref.RentalID, Attempt: ref.Attempt, TenantID: "acme",
			NodeID: rapid.SampledFrom([]string{"", "node-1", "node-2"}).Draw(t, "node"),
			Plan:   rapid.SampledFrom([]shizuv1.Plan{shizuv1.Plan_PLAN_ON_DEMAND, shizuv1.Plan_PLAN_SPOT}).Draw(t, "plan"),
			Model:  "H100-SXM5-80GB", Zone: "eu-1", GPUCount: rapid.Int32Range(1, 8).Draw(t, "gpus"), MilliGPU: 1000}
		if rapid.Bool().Draw(t, "labelled") {
			st.Labels = map[string]string{"team": rapid.SampledFrom([]string{"nlp", "vision"}).Draw(t, "team")}
		}
		if rapid.Bool().Draw(t, "capped") {
			st.MaxSpot = &pricing.Money{Micros: rapid.Int64Range(0, 5_000_000).Draw(t, "max"), Currency: "USD"}
		}
		if rapid.Bool().Draw(t, "timed") {
			st.ScheduledAt = at(t, "scheduled")
		}
		ev := ledger.ScheduledEvent(st)
		return op{ev: &ev}
	case 1:
		ev := ledger.StartedEvent(ref, rapid.SampledFrom([]string{"node-1", "node-3"}).Draw(t, "start-node"), at(t, "start"), at(t, "due"))
		return op{ev: &ev}
	case 2:
		start := at(t, "sstart")
		ev := ledger.StoppedEvent(ref, start, start.Add(time.Duration(rapid.Int64Range(0, 600_000).Draw(t, "ran"))*time.Millisecond),
			rapid.SampledFrom([]shizuv1.ExitReason{shizuv1.ExitReason_EXIT_REASON_COMPLETED, shizuv1.ExitReason_EXIT_REASON_PREEMPTED}).Draw(t, "exit"))
		return op{ev: &ev}
	case 3:
		return op{advance: &ledger.Advance{Ref: ref, Cursor: at(t, "cursor"), Due: at(t, "next"), Finished: rapid.Bool().Draw(t, "finished")}}
	}
	return op{ev: &ledger.SegmentEvent{Ref: ref}}
}

// normal makes states comparable across the store's encoding: no labels
// and empty labels are the same.
func normal(st ledger.SegmentState) ledger.SegmentState {
	if len(st.Labels) == 0 {
		st.Labels = nil
	} else {
		st.Labels = maps.Clone(st.Labels)
	}
	return st
}

// The segment merge rule is written in Go (ledger.Merge, Advance.Apply) and
// applied atomically in Lua: on the same events and advances, in batches
// of any size, both give the same states, due entries and attempts.
func TestTheMergeScriptAppliesTheGoMergeRule(t *testing.T) {
	t.Parallel()
	rdb := testkit.StartRedis(t).Client(t)
	ctx := t.Context()
	run := 0
	rapid.Check(t, func(rt *rapid.T) {
		run++
		prefix := fmt.Sprintf("agree%d:", run)
		s := redisstore.New(rdb, prefix)
		model := map[ledger.SegmentRef]placement{}
		attempts := map[string]map[int32]bool{}
		ops := rapid.SliceOfN(rapid.Custom(genOp), 1, 30).Draw(rt, "ops")
		var batch []ledger.SegmentEvent
		flush := func() {
			if len(batch) == 0 {
				return
			}
			if _, err := s.MergeSegments(ctx, batch); err != nil {
				rt.Fatalf("merge: %v", err)
			}
			batch = nil
		}
		for _, o := range ops {
			if o.advance != nil {
				flush()
				p := model[o.advance.Ref]
				p.st, p.due = o.advance.Apply(p.st, p.due)
				model[o.advance.Ref] = p
				if err := s.AdvanceAll(ctx, []ledger.Advance{*o.advance}); err != nil {
					rt.Fatalf("advance: %v", err)
				}
				continue
			}
			ev := *o.ev
			p := model[ev.Ref]
			p.st, p.due = ledger.Merge(p.st, p.due, ev)
			model[ev.Ref] = p
			if ev.RecordsAttempt() {
				if attempts[ev.Ref.RentalID] == nil {
					attempts[ev.Ref.RentalID] = map[int32]bool{}
				}
				attempts[ev.Ref.RentalID][ev.Ref.Attempt] = true
			}
			batch = append(batch, ev)
			if rapid.Bool().Draw(rt, "flush") {
				flush()
			}
		}
		flush()
		loads := make([]ledger.SegmentEvent, len(agreementRefs))
		for i, r := range agreementRefs {
			loads[i] = ledger.SegmentEvent{Ref: r}
		}
		states, err := s.MergeSegments(ctx, loads)
		if err != nil {
			rt.Fatal(err)
		}
		for i, r := range agreementRefs {
			want := model[r]
			want.st.RentalID, want.st.Attempt = r.RentalID, r.Attempt
			if got := normal(states[i]); !reflect.DeepEqual(got, normal(want.st)) {
				rt.Fatalf("%v: the script gives\n%+v\nthe Go rule\n%+v", r, got, normal(want.st))
			}
			score, err := rdb.ZScore(ctx, prefix+"due", fmt.Sprintf("%s %d", r.RentalID, r.Attempt)).Result()
			listed := !errors.Is(err, redis.Nil)
			if err != nil && listed {
				rt.Fatal(err)
			}
			if listed != want.due.Listed || (listed && int64(score) != want.due.At.Unix()) {
				rt.Fatalf("%v: the script lists it %v at %d, the Go rule %+v", r, listed, int64(score), want.due)
			}
		}
		for _, rental := range []string{"r-1", "r-2"} {
			got, err := s.Attempts(ctx, rental)
			if err != nil {
				rt.Fatal(err)
			}
			slices.Sort(got)
			want := slices.Sorted(maps.Keys(attempts[rental]))
			if !slices.Equal(got, want) && (len(got) != 0 || len(want) != 0) {
				rt.Fatalf("attempts of %s: script %v, Go rule %v", rental, got, want)
			}
		}
	})
}
