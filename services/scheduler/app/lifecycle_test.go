package app_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

func stopped(s *shizuv1.RentalScheduled, reason shizuv1.ExitReason) *shizuv1.RentalStopped {
	at := time.Now()
	return &shizuv1.RentalStopped{
		Meta:     &shizuv1.EventMeta{EventId: fmt.Sprintf("rental:%s:stopped:1", s.GetRentalId()), OccurredAt: timestamppb.New(at), Source: "node-agent/" + s.GetNodeId()},
		RentalId: s.GetRentalId(), TenantId: s.GetTenantId(), NodeId: s.GetNodeId(), NodeEpoch: s.GetNodeEpoch(),
		StartedAt: timestamppb.New(at.Add(-time.Minute)), StoppedAt: timestamppb.New(at), ExitReason: reason, Attempt: 1,
	}
}

func cancel(id, tenant string) *shizuv1.RentalCancelRequested {
	return &shizuv1.RentalCancelRequested{
		Meta:     &shizuv1.EventMeta{EventId: "cancel:" + id, OccurredAt: timestamppb.Now(), Source: "test"},
		RentalId: id, TenantId: tenant, RequestedBy: "user-1",
	}
}

func scheduledOf(o *outcomes, id string) (*shizuv1.RentalScheduled, error) {
	if len(o.scheduled[id]) == 0 {
		return nil, fmt.Errorf("%s not scheduled", id)
	}
	return o.scheduled[id][0], nil
}

func TestAPendingRequestIsScheduledOnceAStopFreesCapacity(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register(gpuNode("n1", 1, capacity.MarketOnDemand))
	e.replica(testConfig(), time.Now)
	e.publish(requested("first", "acme", spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), time.Now()))
	var first *shizuv1.RentalScheduled
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) (err error) { first, err = scheduledOf(o, "first"); return })
	e.publish(requested("second", "acme", spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), time.Now()))
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) error {
		if len(o.pending["second"]) == 0 {
			return errors.New("second not pending")
		}
		p := o.pending["second"][0]
		if p.GetReason() != shizuv1.PendingReason_PENDING_REASON_NO_CAPACITY || p.GetMissing().GetGpuCount() != 1 || o.shortages == 0 {
			return fmt.Errorf("pending %v, %d shortages", p, o.shortages)
		}
		return nil
	})
	e.publish(stopped(first, shizuv1.ExitReason_EXIT_REASON_COMPLETED))
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) error {
		s, err := scheduledOf(o, "second")
		if err == nil && s.GetNodeId() != "n1" {
			return fmt.Errorf("second on %s", s.GetNodeId())
		}
		return err
	})
	if _, err := e.store.Allocation(t.Context(), "first"); !capacity.IsNotFound(err) {
		t.Fatalf("first still holds capacity: %v", err)
	}
}

func TestARequestPendingPastItsDeadlineIsRejectedWithTheReason(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register(gpuNode("n1", 1, capacity.MarketOnDemand))
	cfg := testConfig()
	cfg.PendingTimeout = 300 * time.Millisecond
	e.replica(cfg, time.Now)
	e.publish(requested("big", "acme", spec(4, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), time.Now()))
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) error {
		if len(o.pending["big"]) != 1 {
			return fmt.Errorf("%d pending events", len(o.pending["big"]))
		}
		if len(o.rejected["big"]) != 1 {
			return errors.New("not rejected yet")
		}
		r := o.rejected["big"][0]
		if r.GetReason() != shizuv1.RejectReason_REJECT_REASON_PENDING_TIMEOUT || r.GetMessage() == "" {
			return fmt.Errorf("rejected %v", r)
		}
		return nil
	})
}

func TestInvalidSpecsAreRejectedAtOnceWithAClearReason(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register(gpuNode("n1", 8, capacity.MarketOnDemand))
	e.replica(testConfig(), time.Now)
	cases := map[string]*shizuv1.RentalSpec{
		"milli-above-1000": spec(1, 1500, 0, shizuv1.Plan_PLAN_ON_DEMAND),
		"fraction-of-two":  {GpuCount: 2, MilliGpu: 500, VramMib: 1024, Plan: shizuv1.Plan_PLAN_ON_DEMAND},
		"unknown-model":    {GpuCount: 1, MilliGpu: 1000, AllowedModels: []string{"Voodoo2"}, Plan: shizuv1.Plan_PLAN_ON_DEMAND},
		"vram-too-big":     {GpuCount: 1, MilliGpu: 1000, VramMib: 500 * 1024, Plan: shizuv1.Plan_PLAN_ON_DEMAND},
		"asks-nothing":     {Plan: shizuv1.Plan_PLAN_ON_DEMAND},
	}
	want := map[string]string{"milli-above-1000": "milli_gpu", "fraction-of-two": "milli_gpu",
		"unknown-model": "unknown model", "vram-too-big": "vram_mib", "asks-nothing": "gpu_count"}
	for id, sp := range cases {
		e.publish(requested(id, "acme", sp, time.Now()))
	}
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) error {
		for id, says := range want {
			if len(o.rejected[id]) != 1 {
				return fmt.Errorf("%s: %d rejections", id, len(o.rejected[id]))
			}
			r := o.rejected[id][0]
			if r.GetReason() != shizuv1.RejectReason_REJECT_REASON_INVALID_SPEC || !strings.Contains(r.GetMessage(), says) {
				return fmt.Errorf("%s: %v, want a message naming %q", id, r, says)
			}
		}
		return nil
	})
}

func TestCancellingBeforePlacementRejectsAndAfterPlacementStopsTheRental(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register(gpuNode("n1", 1, capacity.MarketOnDemand))
	e.replica(testConfig(), time.Now)
	// Cancelled before the request arrives: it never runs.
	e.publish(cancel("early", "acme"))
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) error {
		if len(o.rejected["early"]) != 1 || o.rejected["early"][0].GetReason() != shizuv1.RejectReason_REJECT_REASON_CANCELLED {
			return fmt.Errorf("early: %v", o.rejected["early"])
		}
		return nil
	})
	e.publish(requested("early", "acme", spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), time.Now()))
	e.publish(requested("placed", "acme", spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), time.Now()))
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) (err error) { _, err = scheduledOf(o, "placed"); return })
	// The early rental's request must not have taken capacity.
	if _, err := e.store.Allocation(t.Context(), "early"); !capacity.IsNotFound(err) {
		t.Fatalf("cancelled rental holds capacity: %v", err)
	}
	e.seen.mu.Lock()
	if len(e.seen.scheduled["early"]) != 0 {
		t.Fatal("a cancelled rental was scheduled")
	}
	e.seen.mu.Unlock()
	// Cancelled once placed: the node agent is told to stop it.
	e.publish(cancel("placed", "acme"))
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) error {
		if o.stops["placed"] != 1 {
			return fmt.Errorf("%d stop commands", o.stops["placed"])
		}
		return nil
	})
}

// A burst of on-demand requests on a node full of spot rentals, run by a
// real node agent: each spot victim is preempted once (one RentalPreempted
// per victim, however many requests could use it), told to stop after
// the notice (StopRental), stopped by its agent with
// EXIT_REASON_PREEMPTED, and an on-demand request takes each freed GPU,
// ahead of a waiting spot request.
func TestOnDemandPreemptsTheCheapestSpotRentalAndTakesItsPlace(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testkit.WithHeartbeats(3*time.Second))
	down := e.watchStops()
	e.startAgent("n1", "a100pcie4") // 4 GPUs
	cfg := testConfig()
	cfg.PreemptionNotice = time.Second
	// Two replicas share the requests and the retries of the pending set.
	e.replica(cfg, time.Now)
	e.replica(cfg, time.Now)
	// Four spot rentals fill the node, one after the other: the later
	// ones have run less, so they are the cheaper victims.
	spots := []string{"spot0", "spot1", "spot2", "spot3"}
	for _, id := range spots {
		e.publish(requested(id, "spotty", spec(1, 1000, 0, shizuv1.Plan_PLAN_SPOT), time.Now()))
		e.seen.waitFor(t, 20*time.Second, func(o *outcomes) (err error) { _, err = scheduledOf(o, id); return })
	}
	// A burst: six on-demand requests (more than there are victims) and
	// one more spot request, which only waits (spot never preempts spot).
	var burst []proto.Message
	ods := []string{"od0", "od1", "od2", "od3", "od4", "od5"}
	for _, id := range ods {
		burst = append(burst, requested(id, "acme", spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), time.Now()))
	}
	burst = append(burst, requested("spot4", "spotty", spec(1, 1000, 0, shizuv1.Plan_PLAN_SPOT), time.Now()))
	e.publish(burst...)
	// Every victim is stopped by the agent, as preempted.
	testkit.Eventually(t, 60*time.Second, func() error {
		for _, id := range spots {
			got := down.of(id)
			if len(got) == 0 {
				return fmt.Errorf("%s not stopped", id)
			}
			if r := got[0].GetExitReason(); r != shizuv1.ExitReason_EXIT_REASON_PREEMPTED || !strings.HasPrefix(got[0].GetMeta().GetSource(), "node-agent") {
				return fmt.Errorf("%s stopped with %v by %s", id, r, got[0].GetMeta().GetSource())
			}
		}
		return nil
	})
	// Four on-demand requests take the four freed GPUs; the spot request
	// does not.
	e.seen.waitFor(t, 60*time.Second, func(o *outcomes) error {
		placed := 0
		for _, id := range ods {
			if len(o.scheduled[id]) > 0 {
				placed++
			}
		}
		if placed != len(spots) {
			return fmt.Errorf("%d on-demand requests placed, want %d", placed, len(spots))
		}
		return nil
	})
	e.seen.mu.Lock()
	defer e.seen.mu.Unlock()
	if len(e.seen.scheduled["spot4"]) != 0 {
		t.Error("the spot request took the capacity freed for on-demand")
	}
	for _, id := range spots {
		// Counted by event id, as the stream keeps them: a redelivered
		// request that publishes its notice again, under the same id, is
		// deduplicated; a second preemptor would have another id.
		var got []*shizuv1.RentalPreempted
		for _, p := range e.seen.preempted[id] {
			if !slices.ContainsFunc(got, func(q *shizuv1.RentalPreempted) bool { return q.GetMeta().GetEventId() == p.GetMeta().GetEventId() }) {
				got = append(got, p)
			}
		}
		if len(got) != 1 {
			t.Errorf("%s: %d RentalPreempted (distinct event ids), want exactly one", id, len(got))
			continue
		}
		if p := got[0].GetPreemptingRentalId(); !slices.Contains(ods, p) {
			t.Errorf("%s preempted for %s", id, p)
		}
		if e.seen.stops[id] != 1 {
			t.Errorf("%s: %d stop commands, want one", id, e.seen.stops[id])
		}
	}
	if n := len(e.seen.preempted["spot4"]); n != 0 {
		t.Errorf("the waiting spot request was preempted %d times", n)
	}
}

// A request whose ids cannot be answered (no rental id) is dead-lettered
// with the reason; the scheduler goes on with the next one.
func TestARequestWithoutUsableIDsIsDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register(gpuNode("n1", 1, capacity.MarketOnDemand))
	e.replica(testConfig(), time.Now)
	bad := requested("", "acme", spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), time.Now())
	bad.Meta.EventId = "req:bad"
	raw, err := proto.Marshal(bad)
	if err != nil {
		t.Fatal(err)
	}
	js := e.Admin.JetStream()
	msg := nats.NewMsg("rental.acme.requested")
	msg.Data = raw
	msg.Header.Set(jetstream.MsgIDHeader, "req:bad")
	msg.Header.Set(bus.HeaderEvent, bus.EventName(bad))
	if _, err := js.PublishMsg(t.Context(), msg); err != nil {
		t.Fatal(err)
	}
	e.publish(requested("good", "acme", spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), time.Now()))
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) (err error) { _, err = scheduledOf(o, "good"); return })
	testkit.Eventually(t, 20*time.Second, func() error {
		stream, err := js.Stream(t.Context(), topology.StreamDeadLetter)
		if err != nil {
			return err
		}
		m, err := stream.GetLastMsgForSubject(t.Context(), "dlq.RENTALS.scheduler")
		if err != nil {
			return err
		}
		if reason := m.Header.Get(bus.HeaderDLQReason); !strings.Contains(reason, "rental_id") {
			return fmt.Errorf("dead letter reason %q", reason)
		}
		return nil
	})
}
