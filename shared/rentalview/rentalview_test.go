package rentalview_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/rentalview"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func meta(at time.Time) *shizuv1.EventMeta {
	return &shizuv1.EventMeta{OccurredAt: timestamppb.New(at)}
}

func requested(tenant, rental string, plan shizuv1.Plan, labels map[string]string) *shizuv1.RentalRequested {
	return &shizuv1.RentalRequested{Meta: meta(t0), RentalId: rental, TenantId: tenant,
		Spec: &shizuv1.RentalSpec{GpuCount: 2, MilliGpu: 1000, VramMib: 81920, Plan: plan, Labels: labels}}
}

func scheduled(tenant, rental, node, model string) *shizuv1.RentalScheduled {
	return &shizuv1.RentalScheduled{Meta: meta(t0.Add(time.Second)), RentalId: rental, TenantId: tenant, NodeId: node, Attempt: 1,
		GpuModel: model, Gpus: []*shizuv1.GpuAssignment{{GpuIndex: 0}, {GpuIndex: 1}}}
}

func started(tenant, rental, node string) *shizuv1.RentalStarted {
	return &shizuv1.RentalStarted{Meta: meta(t0.Add(2 * time.Second)), RentalId: rental, TenantId: tenant, NodeId: node, Attempt: 1,
		StartedAt: timestamppb.New(t0.Add(2 * time.Second))}
}

func stopped(tenant, rental, node string) *shizuv1.RentalStopped {
	return &shizuv1.RentalStopped{Meta: meta(t0.Add(time.Minute)), RentalId: rental, TenantId: tenant, NodeId: node, Attempt: 1,
		StoppedAt: timestamppb.New(t0.Add(time.Minute)), ExitReason: shizuv1.ExitReason_EXIT_REASON_CANCELLED}
}

// TestApplyFoldsALifecycle folds plain values: the record says what the
// events said.
func TestApplyFoldsALifecycle(t *testing.T) {
	r := &rentalview.Rental{ID: "r-1", Tenant: "acme", State: rentalview.StateRequested}
	for _, m := range []proto.Message{requested("acme", "r-1", shizuv1.Plan_PLAN_SPOT, map[string]string{"team": "ml"}),
		scheduled("acme", "r-1", "n-1", "H100"), started("acme", "r-1", "n-1")} {
		rentalview.Apply(r, m, m.(interface{ GetMeta() *shizuv1.EventMeta }).GetMeta().GetOccurredAt().AsTime())
	}
	if r.State != rentalview.StateRunning || r.Node != "n-1" || r.Model != "H100" || r.Plan != "spot" || r.GPUCount != 2 ||
		r.VRAMMiB != 81920 || r.Labels["team"] != "ml" || len(r.GPUs) != 2 || len(r.Segments) != 1 || len(r.Timeline) != 3 {
		t.Fatalf("folded %+v", r)
	}
	if !r.RequestedAt.Equal(t0) || !r.UpdatedAt.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("requested_at %v updated_at %v", r.RequestedAt, r.UpdatedAt)
	}
	rentalview.Apply(r, stopped("acme", "r-1", "n-1"), t0.Add(time.Minute))
	if r.State != rentalview.StateStopped || r.Segments[0].StoppedAt == nil || r.Segments[0].Reason != "cancelled" {
		t.Fatalf("after stop %+v", r)
	}
	before := *r
	rentalview.Apply(r, &shizuv1.NodeLost{}, t0.Add(time.Hour)) // not a rental event
	if r.State != before.State || len(r.Timeline) != len(before.Timeline) || !r.UpdatedAt.Equal(before.UpdatedAt) {
		t.Fatalf("a non-rental event changed the rental: %+v", r)
	}
}

type env struct {
	js    jetstream.JetStream
	store *rentalview.Store
	proj  *rentalview.Projector
}

func setup(t testing.TB) env {
	t.Helper()
	ctx := context.Background()
	_, js := testkit.StartNATS(t).JetStream(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: topology.StreamRentals, Subjects: []string{subject.RentalAll}}); err != nil {
		t.Fatal(err)
	}
	s, err := rentalview.Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	return env{js: js, store: s, proj: rentalview.NewProjector(js, s, nil)}
}

// publish sends events on their own tenant's subjects (or on the
// subject tenant given), as the services do.
func (e env) publish(t *testing.T, subjTenant string, msgs ...proto.Message) {
	t.Helper()
	for _, m := range msgs {
		tenant := subjTenant
		if tenant == "" {
			tenant = m.(interface{ GetTenantId() string }).GetTenantId()
		}
		var form string
		switch m.(type) {
		case *shizuv1.RentalRequested:
			form = subject.RentalRequested
		case *shizuv1.RentalScheduled:
			form = subject.RentalScheduled
		case *shizuv1.RentalStarted:
			form = subject.RentalStarted
		case *shizuv1.RentalStopped:
			form = subject.RentalStopped
		default:
			t.Fatalf("no subject for %T", m)
		}
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.js.Publish(context.Background(), fmt.Sprintf(form, tenant), b); err != nil {
			t.Fatal(err)
		}
	}
}

// run starts the projector until the test ends.
func (e env) run(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.proj.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// await polls Get until ok says the record is there. The minute is a
// bound on a hang, not a speed check.
func (e env) await(t *testing.T, tenant, rental string, ok func(*rentalview.Rental) bool) *rentalview.Rental {
	t.Helper()
	var got *rentalview.Rental
	testkit.Eventually(t, time.Minute, func() error {
		r, err := e.store.Get(context.Background(), tenant, rental)
		if err != nil {
			return err
		}
		if !ok(r) {
			return fmt.Errorf("%s/%s is %+v", tenant, rental, r)
		}
		got = r
		return nil
	})
	return got
}

func inState(s string) func(*rentalview.Rental) bool {
	return func(r *rentalview.Rental) bool { return r.State == s }
}

// TestProjectorTenantsAndForgery: events published on RENTALS reach the
// record; the same rental id under two tenants is two records; an event
// forged on the attacker's subject naming the victim changes nothing; Get
// for another tenant's id is ErrNotFound.
func TestProjectorTenantsAndForgery(t *testing.T) {
	e := setup(t)
	e.run(t)
	e.publish(t, "", requested("alice", "r-1", shizuv1.Plan_PLAN_ON_DEMAND, nil), scheduled("alice", "r-1", "n-1", "H100"),
		started("alice", "r-1", "n-1"))
	e.publish(t, "", requested("mallory", "r-1", shizuv1.Plan_PLAN_SPOT, nil))
	// forged: on mallory's subject, naming alice in the body
	e.publish(t, "mallory", stopped("alice", "r-1", "n-1"))
	e.publish(t, "", scheduled("mallory", "r-1", "n-9", "A100")) // a marker after the forgery
	// One projector applies in stream order: once the marker is in, the
	// forgery has been seen.
	mal := e.await(t, "mallory", "r-1", inState(rentalview.StateScheduled))
	alice, err := e.store.Get(context.Background(), "alice", "r-1")
	if err != nil {
		t.Fatal(err)
	}
	if alice.State != rentalview.StateRunning {
		t.Fatalf("a forged event changed alice's rental: %+v", alice)
	}
	if alice.Tenant != "alice" || alice.Node != "n-1" || alice.Plan != "on-demand" || mal.Tenant != "mallory" || mal.Node != "n-9" {
		t.Fatalf("alice %+v mallory %+v", alice, mal)
	}
	if alice.Seq == 0 || alice.Seq >= mal.Seq {
		t.Fatalf("seq alice %d mallory %d", alice.Seq, mal.Seq)
	}
	if _, err := e.store.Get(context.Background(), "bob", "r-1"); !errors.Is(err, rentalview.ErrNotFound) {
		t.Fatalf("bob's Get of r-1: %v, want ErrNotFound", err)
	}
	if _, err := e.store.Get(context.Background(), "a.b", "r-1"); err == nil || errors.Is(err, rentalview.ErrNotFound) {
		t.Fatalf("Get with a tenant that is no subject token: %v, want an invalid-input error", err)
	}
}

// TestKeysOfOddTokens: ids with characters a KV key may not hold map to
// distinct records ("a=2Eb"-looking ids included).
func TestKeysOfOddTokens(t *testing.T) {
	e := setup(t)
	e.run(t)
	ids := []string{"r:1", "r=3A1", "r/1", "r_1"}
	for _, id := range ids {
		e.publish(t, "", requested("t@x", id, shizuv1.Plan_PLAN_SPOT, nil))
	}
	for _, id := range ids {
		if r := e.await(t, "t@x", id, inState(rentalview.StateRequested)); r.ID != id || r.Tenant != "t@x" {
			t.Fatalf("%s: %+v", id, r)
		}
	}
	rs, next, err := e.store.List(context.Background(), "t@x", rentalview.Filter{}, "", 0)
	if err != nil || next != "" || len(rs) != len(ids) {
		t.Fatalf("list: %d rentals, next %q, %v", len(rs), next, err)
	}
}

// TestReplayAndRebuild: a second projector on a fresh durable (a full
// replay of every event) and a second Run of the same durable change
// nothing; Rebuild after the bucket is emptied gives the same records.
func TestReplayAndRebuild(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.publish(t, "", requested("acme", "r-1", shizuv1.Plan_PLAN_SPOT, nil), scheduled("acme", "r-1", "n-1", "H100"),
		started("acme", "r-1", "n-1"), requested("acme", "r-2", shizuv1.Plan_PLAN_ON_DEMAND, nil))
	if err := e.proj.Rebuild(ctx); err != nil {
		t.Fatal(err)
	}
	first, _, err := e.store.List(ctx, "acme", rentalview.Filter{}, "", 0)
	if err != nil || len(first) != 2 {
		t.Fatalf("after rebuild: %d, %v", len(first), err)
	}
	// Run replays every event from sequence 1 over the rebuilt records.
	e.run(t)
	e.publish(t, "", requested("zed", "marker", shizuv1.Plan_PLAN_SPOT, nil))
	e.await(t, "zed", "marker", inState(rentalview.StateRequested))
	again, _, err := e.store.List(ctx, "acme", rentalview.Filter{}, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := range first {
		if len(again[i].Timeline) != len(first[i].Timeline) || again[i].Seq != first[i].Seq || again[i].State != first[i].State {
			t.Fatalf("replay changed %s: %+v, was %+v", first[i].ID, again[i], first[i])
		}
	}
	if err := e.proj.Rebuild(ctx); err != nil {
		t.Fatal(err)
	}
	rebuilt, _, err := e.store.List(ctx, "acme", rentalview.Filter{}, "", 0)
	if err != nil || len(rebuilt) != 2 {
		t.Fatalf("rebuilt: %d, %v", len(rebuilt), err)
	}
	for i := range first {
		if fmt.Sprint(*rebuilt[i]) != fmt.Sprint(*first[i]) {
			t.Fatalf("rebuild gave %+v, want %+v", rebuilt[i], first[i])
		}
	}
}

// TestListFiltersAndPages: filters narrow, a cursor pages through every
// match once, a cursor List never gave is an error.
func TestListFiltersAndPages(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	for i := range 7 {
		plan, labels := shizuv1.Plan_PLAN_SPOT, map[string]string{"team": "ml"}
		if i%2 == 1 {
			plan, labels = shizuv1.Plan_PLAN_ON_DEMAND, map[string]string{"team": "web"}
		}
		e.publish(t, "", requested("acme", fmt.Sprintf("r-%d", i), plan, labels))
	}
	e.publish(t, "", scheduled("acme", "r-0", "n-1", "H100"), requested("other", "r-9", shizuv1.Plan_PLAN_SPOT, nil))
	if err := e.proj.Rebuild(ctx); err != nil {
		t.Fatal(err)
	}
	var seen []string
	cursor := ""
	for pages := 0; ; pages++ {
		rs, next, err := e.store.List(ctx, "acme", rentalview.Filter{Plan: "spot", Labels: map[string]string{"team": "ml"}}, cursor, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			seen = append(seen, r.ID)
		}
		if next == "" {
			break
		}
		cursor = next
	}
	if fmt.Sprint(seen) != "[r-0 r-2 r-4 r-6]" {
		t.Fatalf("spot/ml pages gave %v", seen)
	}
	rs, _, err := e.store.List(ctx, "acme", rentalview.Filter{State: rentalview.StateScheduled, Model: "H100"}, "", 0)
	if err != nil || len(rs) != 1 || rs[0].ID != "r-0" {
		t.Fatalf("scheduled H100: %v, %v", rs, err)
	}
	for _, bad := range []string{"r.1", "=zz", "=41"} {
		if _, _, err := e.store.List(ctx, "acme", rentalview.Filter{}, bad, 0); err == nil {
			t.Fatalf("cursor %q: no error", bad)
		}
	}
	if _, _, err := e.store.List(ctx, "acme", rentalview.Filter{}, "", -1); err == nil {
		t.Fatal("limit -1: no error")
	}
}

// TestWatchDeliversUpdates: the current record, then each change.
func TestWatchDeliversUpdates(t *testing.T) {
	e := setup(t)
	e.run(t)
	e.publish(t, "", requested("acme", "r-1", shizuv1.Plan_PLAN_SPOT, nil))
	e.await(t, "acme", "r-1", inState(rentalview.StateRequested))
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := e.store.Watch(ctx, "acme", "r-1")
	if err != nil {
		t.Fatal(err)
	}
	if r := <-ch; r.State != rentalview.StateRequested {
		t.Fatalf("first: %+v", r)
	}
	e.publish(t, "", scheduled("acme", "r-1", "n-1", "H100"), started("acme", "r-1", "n-1"))
	for r := range ch {
		if r.State == rentalview.StateRunning {
			break
		}
	}
	cancel()
	for range ch { // closed once ctx ends
	}
}
