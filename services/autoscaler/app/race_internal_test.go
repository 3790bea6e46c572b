package app

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/autoscaler/policy"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// decisionsOf lists pool's ScalingDecided on the SCALING stream, in order.
func (e *replicaEnv) decisionsOf(pool string) []*shizuv1.ScalingDecided {
	e.t.Helper()
	st, err := e.pub.JetStream().Stream(e.t.Context(), topology.StreamScaling)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := st.Info(e.t.Context())
	if err != nil {
		e.t.Fatal(err)
	}
	var out []*shizuv1.ScalingDecided
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && seq > 0; seq++ {
		m, err := st.GetMsg(e.t.Context(), seq)
		if err != nil || m.Subject != "scale."+pool+".decided" {
			continue
		}
		ev := &shizuv1.ScalingDecided{}
		if err := proto.Unmarshal(m.Data, ev); err != nil {
			e.t.Fatal(err)
		}
		out = append(out, ev)
	}
	return out
}

// A tick and a traffic sample of one pool race (as two handlers of one
// replica, or two replicas, do): the tick commits first, so the sample's
// optimistic update is retried on the tick's record. What reaches the
// stream must be what was committed: each decision starts where the one
// before it ended, and the rentals are those the record holds.
func TestARacingTickAndSampleLeaveOnlyDecisionsThatTookEffect(t *testing.T) {
	t.Parallel()
	const pol = `{"id":"api","tenant":"globex","rental":{"gpu_count":1,"milli_gpu":1000},"min_replicas":2,"max_replicas":6,"max_step_out":2,"max_step_in":2,"thresholds":[{"name":"busy","metric":"concurrent_requests_per_replica","scale_out_above":10,"scale_in_below":3,"step":2}]}`
	e := newReplicaEnv(t, policy.File{})
	s := e.replica(nil)
	ctx := t.Context()
	decl := &shizuv1.PoolDeclared{Meta: &shizuv1.EventMeta{EventId: "declare-1", OccurredAt: timestamppb.Now(), Source: "cli"},
		PoolId: "api", TenantId: "globex", PolicyJson: []byte(pol)}
	if err := s.onPoolDeclared(ctx, decl, bus.Delivery{StreamSeq: 1}); err != nil {
		t.Fatal(err)
	}
	pool, ok, err := s.pool(ctx, "api")
	if err != nil || !ok {
		t.Fatalf("pool(api) = %v, %v", ok, err)
	}
	var raced atomic.Bool
	s.states.beforeCommit = func() {
		if raced.CompareAndSwap(false, true) {
			s.tickPool(ctx, pool, time.Now()) // commits first
		}
	}
	sample := &shizuv1.TrafficSampled{Meta: &shizuv1.EventMeta{EventId: "sample-1", OccurredAt: timestamppb.Now(), Source: "gateway"},
		PoolId: "api", ConcurrentRequests: 100, RequestsPerSecond: 1000}
	if err := s.scaleOnSample(ctx, pool, sample); err != nil {
		t.Fatal(err)
	}
	rec, err := s.states.read(ctx, s.states.rdb, s.states.key("api"))
	if err != nil {
		t.Fatal(err)
	}
	ds := e.decisionsOf("api")
	var chain []string
	from := int32(0)
	for _, d := range ds {
		chain = append(chain, fmt.Sprintf("%s %d->%d", d.GetMeta().GetEventId(), d.GetFromReplicas(), d.GetToReplicas()))
		if d.GetFromReplicas() != from {
			t.Errorf("decision %s starts from %d, but the one before ended at %d", d.GetMeta().GetEventId(), d.GetFromReplicas(), from)
		}
		from = d.GetToReplicas()
	}
	if int(from) != len(rec.Rentals) {
		t.Errorf("decisions end at %d replicas, the record holds %d rentals", from, len(rec.Rentals))
	}
	if got := e.requestedRentals("globex"); len(got) != len(rec.Rentals) {
		t.Errorf("requested %v; the record holds %d rentals", got, len(rec.Rentals))
	}
	t.Logf("decisions: %v; record: %d rentals", chain, len(rec.Rentals))
}

// A replica that stopped between committing a change and publishing its
// events left them in the pool's outbox: the next tick (any replica's)
// publishes them and empties the outbox.
func TestEventsAReplicaLeftInTheOutboxArePublishedByTheNextTick(t *testing.T) {
	t.Parallel()
	e := newReplicaEnv(t, policy.File{})
	s := e.replica(nil)
	ctx := t.Context()
	const pol = `{"id":"api","tenant":"globex","rental":{"gpu_count":1,"milli_gpu":1000},"min_replicas":1,"max_replicas":2,"max_step_out":1,"max_step_in":1,"thresholds":[{"name":"busy","metric":"concurrent_requests_per_replica","scale_out_above":10,"scale_in_below":3,"step":1}]}`
	decl := &shizuv1.PoolDeclared{Meta: &shizuv1.EventMeta{EventId: "declare-1", OccurredAt: timestamppb.Now(), Source: "cli"},
		PoolId: "api", TenantId: "globex", PolicyJson: []byte(pol)}
	if err := s.onPoolDeclared(ctx, decl, bus.Delivery{StreamSeq: 1}); err != nil {
		t.Fatal(err)
	}
	pool, _, err := s.pool(ctx, "api")
	if err != nil {
		t.Fatal(err)
	}
	// As the crashed replica committed it: the floor's rental and its
	// events, never published.
	err = s.states.update(ctx, "api", func(rec *poolRecord) error {
		d := policy.Decision{Pool: "api", To: 1, Rule: policy.RuleMinReplicas, Reason: "floor", Market: policy.OnDemand}
		if err := s.apply(ctx, pool, rec, d, "scale:api:crashed", ""); err != nil {
			return err
		}
		for i := range rec.Outbox {
			rec.Outbox[i].Queued = time.Now().Add(-time.Minute)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := e.requestedRentals("globex"); len(got) != 0 {
		t.Fatalf("requested %v before any publish", got)
	}
	s.tickPool(ctx, pool, time.Now())
	if got := e.requestedRentals("globex"); len(got) != 1 || got[0] != "pool-api-1" {
		t.Fatalf("requested %v after the tick; want the left pool-api-1 once", got)
	}
	if ds := e.decisionsOf("api"); len(ds) != 1 || ds[0].GetMeta().GetEventId() != "scale:api:crashed" {
		t.Fatalf("decisions %v; want the left one", ds)
	}
	rec, err := s.states.read(ctx, s.states.rdb, s.states.key("api"))
	if err != nil || len(rec.Outbox) != 0 || len(rec.Rentals) != 1 {
		t.Fatalf("record after the tick: %d rentals, outbox %v, %v", len(rec.Rentals), rec.Outbox, err)
	}
}

// An outbox entry that does not decode is dropped with an error, not
// retried forever: the pool's other events still go out.
func TestAnOutboxEntryThatDoesNotDecodeIsDroppedAndTheRestPublished(t *testing.T) {
	t.Parallel()
	e := newReplicaEnv(t, policy.File{})
	s := e.replica(nil)
	ctx := t.Context()
	good := &shizuv1.ScalingDecided{Meta: &shizuv1.EventMeta{EventId: "scale:api:good", OccurredAt: timestamppb.Now(), Source: topology.Autoscaler},
		PoolId: "api", FromReplicas: 0, ToReplicas: 1, Rule: "min-replicas", Reason: "floor"}
	err := s.states.update(ctx, "api", func(rec *poolRecord) error {
		rec.Outbox = append(rec.Outbox, outboxEvent{ID: "broken", Subject: "scale.api.decided", Type: "shizu.v1.NoSuchEvent", Data: []byte{1}})
		return rec.enqueue("scale.api.decided", good)
	})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := s.states.read(ctx, s.states.rdb, s.states.key("api"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.publish(ctx, "api", rec.Outbox); err != nil {
		t.Fatalf("publish: %v", err)
	}
	if ds := e.decisionsOf("api"); len(ds) != 1 || ds[0].GetMeta().GetEventId() != "scale:api:good" {
		t.Fatalf("decisions %v; want the good one", ds)
	}
	if rec, err := s.states.read(ctx, s.states.rdb, s.states.key("api")); err != nil || len(rec.Outbox) != 0 {
		t.Fatalf("outbox after publish: %v, %v", rec.Outbox, err)
	}
}
