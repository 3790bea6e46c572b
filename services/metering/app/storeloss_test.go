package app_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/app"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// runMetering runs the real service (app.Run, as the metering user, on the
// real clock) until the returned stop is called or the test ends.
func (e *env) runMetering(t *testing.T, cfg app.Config) (stop func()) {
	t.Helper()
	cfg.Service = e.ServiceConfig(t, topology.Metering)
	cfg.Service.LogLevel = "error"
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx, cfg) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("metering: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

// liveRentals are n rentals of randomRentals' kinds (plans, shares, spot
// maxima), with ids that start with prefix and no segment yet: the test
// starts and stops them on the real clock, as node agents would.
func liveRentals(seed uint64, n int, prefix string) []rental {
	out := randomRentals(seed, n)
	for i := range out {
		out[i].id, out[i].segs = prefix+out[i].id, nil
	}
	return out
}

// eventsOf are the events of attempt (1-based) of r that match keep.
func eventsOf(r rental, attempt int32, keep func(proto.Message) bool) []event {
	var out []event
	for _, ev := range r.events() {
		var a int32
		switch m := ev.msg.(type) {
		case *shizuv1.RentalScheduled:
			a = m.GetAttempt()
		case *shizuv1.RentalStarted:
			a = m.GetAttempt()
		case *shizuv1.RentalStopped:
			a = m.GetAttempt()
		case *shizuv1.RentalMigrating: // its id ends with the attempt (events)
			id := m.GetMeta().GetEventId()
			n, _ := strconv.Atoi(id[strings.LastIndex(id, ":")+1:])
			a = int32(n)
		}
		if a == attempt && keep(ev.msg) {
			out = append(out, ev)
		}
	}
	return out
}

func isBegin(m proto.Message) bool {
	switch m.(type) {
	case *shizuv1.RentalScheduled, *shizuv1.RentalStarted:
		return true
	}
	return false
}

func isEnd(m proto.Message) bool { return !isBegin(m) }

// startNow starts a new segment of each rental on node now and publishes
// its schedule and start.
func (e *env) startNow(t testing.TB, rs []rental, node string) {
	t.Helper()
	for i := range rs {
		rs[i].segs = append(rs[i].segs, seg{node: node, start: time.Now().UTC()})
		e.publish(t, eventsOf(rs[i], int32(len(rs[i].segs)), isBegin))
	}
}

// stopNow stops each rental's running segment now (lost, when lose: a
// failover report with its last heartbeat now) and publishes it.
func (e *env) stopNow(t testing.TB, rs []rental, exit shizuv1.ExitReason, lose bool) {
	t.Helper()
	for i := range rs {
		last := &rs[i].segs[len(rs[i].segs)-1]
		if lose {
			last.lost = time.Now().UTC()
		} else {
			last.stop, last.exit = time.Now().UTC(), exit
		}
		e.publish(t, eventsOf(rs[i], int32(len(rs[i].segs)), isEnd))
	}
}

// billedTo waits until every rental of rs has a record closed at or after
// t (the closer billed its running segment that far).
func (e *env) billedTo(t *testing.T, rs []rental, at time.Time) {
	t.Helper()
	testkit.Eventually(t, 60*time.Second, func() error {
		got, _ := e.recordEnds(t)
		for _, r := range rs {
			if !got[r.id].After(at) {
				return fmt.Errorf("rental %s billed to %s, not past %s yet", r.id, got[r.id], at)
			}
		}
		return nil
	})
}

// secondsOf sums the seconds of the records each rental's run bills (its
// run's seconds, and the top-up to the minimum charge).
func secondsOf(t testing.TB, cfg app.Config, rentals []rental) map[string]int64 {
	t.Helper()
	cat, _ := cfg.Catalogue()
	list, _ := cat.OnDemand("H100-SXM5-80GB")
	out := map[string]int64{}
	for _, r := range rentals {
		for i := range r.segs {
			sg, _ := r.state(cat, i).Segment()
			tariff := ledger.Tariff{Base: list}
			if r.plan == shizuv1.Plan_PLAN_SPOT {
				tariff.Spot = spotPrices
			}
			recs, _, err := ledger.Close(sg, tariff, cfg.Rules, time.Time{}, sg.End.Add(time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			for _, rec := range recs {
				out[r.id] += rec.Seconds
			}
		}
	}
	return out
}

// TestLosingRedisLosesNoBilledSecondAndBillsNoneTwice runs the real
// service on the real clock (one-second records), starts rentals, stops
// some, moves one off a lost node, then restarts Redis empty (with metering
// running, with two replicas running, or while it is down), starts more
// and stops them all: the
// usage records on the stream and the aggregates must be exactly those of
// a run that never lost Redis, each record published once, and every
// rental's billed seconds its run's seconds (with the top-up to the
// minimum charge where it applies).
func TestLosingRedisLosesNoBilledSecondAndBillsNoneTwice(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		replicas int
		down     bool
	}{{"while metering runs", 1, false}, {"while metering is down", 1, true}, {"while two replicas run", 2, false}} {
		down := c.down
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnvWithUsers(t)
			cfg := testConfig()
			cfg.Rules.Interval, cfg.CloseGrace, cfg.Tick = time.Second, 2*time.Second, 100*time.Millisecond
			stop := e.runMetering(t, cfg)
			for range c.replicas - 1 {
				e.runMetering(t, cfg)
			}
			e.prices(t, cfg)
			early := liveRentals(21, 12, "a-")
			moved := early[:2]
			e.startNow(t, early, "node-1")
			e.billedTo(t, early, early[len(early)-1].segs[0].start.Add(2*time.Second))
			e.stopNow(t, early[8:], shizuv1.ExitReason_EXIT_REASON_COMPLETED, false)
			e.stopNow(t, moved, 0, true) // node-1 lost under them
			e.startNow(t, moved, "node-9")
			e.billedTo(t, early[:8], time.Now().Add(-cfg.CloseGrace))

			if down {
				stop()
			}
			e.Redis.Restart(t) // comes back empty
			if down {
				e.runMetering(t, cfg)
			}
			late := liveRentals(22, 6, "b-")
			e.startNow(t, late, "node-2")
			e.billedTo(t, append(late, early[:8]...), time.Now().Add(-cfg.CloseGrace))
			e.stopNow(t, early[:8], shizuv1.ExitReason_EXIT_REASON_CANCELLED, false)
			e.stopNow(t, late, shizuv1.ExitReason_EXIT_REASON_COMPLETED, false)

			all := append(append([]rental{}, early...), late...)
			want := expectedLedger(t, cfg, all)
			e.settled(t, cfg.KeyPrefix, want)
			got, messages := e.billed(t)
			if messages != len(got) {
				t.Fatalf("%d usage messages for %d records: some record was published twice", messages, len(got))
			}
			agg := aggregatesOf(e.rdb, cfg.KeyPrefix)
			for id, secs := range secondsOf(t, cfg, all) {
				h, err := agg.rentalSeconds(t.Context(), id)
				if err != nil {
					t.Fatal(err)
				}
				if h != secs {
					t.Fatalf("rental %s: %d seconds in the aggregates, its run bills %d", id, h, secs)
				}
			}
		})
	}
}

// recordEnds reads the latest interval end of each rental's usage records
// on the stream.
func (e *env) recordEnds(t testing.TB) (map[string]time.Time, error) {
	t.Helper()
	ctx := t.Context()
	s, err := e.pub.JetStream().Stream(ctx, topology.StreamBilling)
	if err != nil {
		return nil, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]time.Time{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			return nil, err
		}
		var ev shizuv1.UsageRecorded
		if !subject.Matches(subject.UsageRecordedAll, m.Subject) || proto.Unmarshal(m.Data, &ev) != nil {
			continue
		}
		if end := ev.GetIntervalEnd().AsTime(); end.After(out[ev.GetRentalId()]) {
			out[ev.GetRentalId()] = end
		}
	}
	return out, nil
}

// rentalSeconds reads a rental's billed seconds from the aggregates.
func (a aggregates) rentalSeconds(ctx context.Context, rental string) (int64, error) {
	gen, err := a.generation(ctx)
	if err != nil {
		return 0, err
	}
	v, err := a.rdb.HGet(ctx, a.prefix+"agg:"+gen+":rental:"+rental, "seconds").Int64()
	if err != nil {
		return 0, errors.Join(fmt.Errorf("rental %s seconds", rental), err)
	}
	return v, nil
}
