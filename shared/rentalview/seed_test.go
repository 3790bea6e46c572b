package rentalview_test

import (
	"context"
	"reflect"
	"testing"

	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/rentalview"
)

// TestASeededRecordIsWhatTheProjectorWrites: a request's publisher seeds
// its record (read at once, before any projector runs); the projector
// then skips that request and folds what follows, ending with the record
// a projector alone writes from the same events; seeding again after the
// projector changes nothing.
func TestASeededRecordIsWhatTheProjectorWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t)
	req := requested("acme", "r1", shizuv1.Plan_PLAN_ON_DEMAND, map[string]string{"team": "ml"})
	b, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	ack, err := e.js.Publish(ctx, "rental.acme.requested", b)
	if err != nil {
		t.Fatal(err)
	}
	seed := &rentalview.Rental{ID: "r1", Tenant: "acme", State: rentalview.StateRequested}
	rentalview.Apply(seed, req, t0)
	seed.Seq = ack.Sequence
	if err := e.store.Seed(ctx, seed); err != nil {
		t.Fatal(err)
	}
	if got, err := e.store.Get(ctx, "acme", "r1"); err != nil || got.State != rentalview.StateRequested {
		t.Fatalf("Get after Seed: %+v, %v; want the requested record with no projector running", got, err)
	}
	e.publish(t, "", scheduled("acme", "r1", "n1", "H100"), started("acme", "r1", "n1"))
	// The same events on a second rental that nobody seeds.
	req2 := proto.Clone(req).(*shizuv1.RentalRequested)
	req2.RentalId = "r2"
	e.publish(t, "", req2, scheduled("acme", "r2", "n1", "H100"), started("acme", "r2", "n1"))
	e.run(t)
	seeded := e.await(t, "acme", "r1", inState(rentalview.StateRunning))
	alone := e.await(t, "acme", "r2", inState(rentalview.StateRunning))
	if len(seeded.Timeline) != len(alone.Timeline) {
		t.Fatalf("seeded timeline %+v, projected alone %+v", seeded.Timeline, alone.Timeline)
	}
	seeded.ID, seeded.Seq, alone.Seq = "r2", 0, 0
	if !reflect.DeepEqual(seeded.Timeline, alone.Timeline) || seeded.State != alone.State || !reflect.DeepEqual(seeded.Labels, alone.Labels) {
		t.Fatalf("seeded then projected %+v\nprojected alone %+v", seeded, alone)
	}
	if err := e.store.Seed(ctx, seed); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.store.Get(ctx, "acme", "r1"); got.State != rentalview.StateRunning {
		t.Fatalf("a late seed rewound the record to %s", got.State)
	}
	if err := e.store.Seed(ctx, &rentalview.Rental{ID: "r3", Tenant: "acme"}); !fault.IsInvalid(err) {
		t.Fatalf("Seed without a sequence: %v, want invalid", err)
	}
}
