package failovertest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/failover/detect"
	"github.com/shizu-gpu/shizu/services/failover/migrate"
	"github.com/shizu-gpu/shizu/shared/fault"
)

// The interfaces the failover app needs (its own declarations have the
// same methods; see app/records.go and app/publish.go).
type (
	// PlacementRecords hold each rental's latest placement.
	PlacementRecords interface {
		Put(ctx context.Context, rental string, p migrate.Placement) error
		Forget(ctx context.Context, rental string, attempt int32) error
		Get(ctx context.Context, rental string) (migrate.Placement, bool, error)
		GetMany(ctx context.Context, rentals []string) (map[string]migrate.Placement, error)
	}
	// MoveRecords hold the moves in flight.
	MoveRecords interface {
		Put(ctx context.Context, m migrate.Record) error
		PutMany(ctx context.Context, ms []migrate.Record) error
		UpdateMany(ctx context.Context, ms []migrate.Record) error
		Get(ctx context.Context, rental string) (migrate.Record, bool, error)
		GetMany(ctx context.Context, rentals []string) (map[string]migrate.Record, error)
		List(ctx context.Context) ([]string, error)
		Drop(ctx context.Context, rental string) error
	}
	// QuarantineRecords hold the nodes quarantined for flapping.
	QuarantineRecords interface {
		Put(ctx context.Context, q detect.Quarantine) error
		List(ctx context.Context) ([]detect.Quarantine, error)
		Drop(ctx context.Context, node string) error
	}
	// EventBatch queues events and has them acknowledged together.
	EventBatch interface {
		Publish(ctx context.Context, subject string, ev proto.Message) error
		Len() int
		Wait(ctx context.Context) error
	}
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// Spec is a valid rental spec of plan.
func Spec(plan shizuv1.Plan) *shizuv1.RentalSpec {
	return &shizuv1.RentalSpec{GpuCount: 1, MilliGpu: 1000, Plan: plan, Priority: 5, CheckpointUri: "s3://ckpt/run/"}
}

// Record is a valid recorded move of rental off node n1, at attempt 1.
func Record(rental string) migrate.Record {
	return migrate.Record{Rental: rental, Tenant: "acme", FromNode: "n1", FromEpoch: 3, FromAttempt: 1, NextAttempt: 2,
		GPUs: []int{0}, Reason: int32(shizuv1.MigrationReason_MIGRATION_REASON_NODE_LOST), Mode: migrate.ModeBreak,
		LastAlive: t0.Add(-3 * time.Second), LastBeat: t0.Add(-3 * time.Second), DecidedAt: t0, Cause: "node:n1:lost:3",
		Class: migrate.ClassOnDemand}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// RunPlacementRecordsContract checks what the failover app relies on of
// its placement records.
func RunPlacementRecordsContract(t *testing.T, newRecords func(t *testing.T) PlacementRecords) {
	t.Run("a placement reads back as stored, spec and GPU model included", func(t *testing.T) {
		r := newRecords(t)
		want := migrate.Placement{Attempt: 1, Tenant: "acme", Node: "n1", Spec: Spec(shizuv1.Plan_PLAN_RESERVED),
			Model: "A100-SXM4-80GB", VRAMMiB: 81920}
		must(t, r.Put(t.Context(), "r1", want))
		got, ok, err := r.Get(t.Context(), "r1")
		must(t, err)
		if !ok || got.Attempt != 1 || got.Tenant != "acme" || got.Node != "n1" || !proto.Equal(got.Spec, want.Spec) ||
			got.Model != want.Model || got.VRAMMiB != want.VRAMMiB {
			t.Fatalf("read %+v (%v), want %+v", got, ok, want)
		}
	})
	t.Run("a rental never placed is not found", func(t *testing.T) {
		r := newRecords(t)
		if _, ok, err := r.Get(t.Context(), "nobody"); err != nil || ok {
			t.Fatalf("found a placement of a rental never placed (%v)", err)
		}
	})
	t.Run("an older attempt redelivered does not overwrite a newer one", func(t *testing.T) {
		r := newRecords(t)
		must(t, r.Put(t.Context(), "r1", migrate.Placement{Attempt: 2, Tenant: "acme", Node: "n2", Spec: Spec(shizuv1.Plan_PLAN_SPOT)}))
		must(t, r.Put(t.Context(), "r1", migrate.Placement{Attempt: 1, Tenant: "acme", Node: "n1", Spec: Spec(shizuv1.Plan_PLAN_SPOT)}))
		if got, _, err := r.Get(t.Context(), "r1"); err != nil || got.Attempt != 2 || got.Node != "n2" {
			t.Fatalf("read %+v (%v), want attempt 2 on n2", got, err)
		}
	})
	t.Run("forgetting drops only the attempt named", func(t *testing.T) {
		r := newRecords(t)
		must(t, r.Put(t.Context(), "r1", migrate.Placement{Attempt: 2, Tenant: "acme", Node: "n2", Spec: Spec(shizuv1.Plan_PLAN_SPOT)}))
		must(t, r.Forget(t.Context(), "r1", 1))
		if _, ok, err := r.Get(t.Context(), "r1"); err != nil || !ok {
			t.Fatalf("an older attempt's stop forgot the newer placement (%v)", err)
		}
		must(t, r.Forget(t.Context(), "r1", 2))
		if _, ok, err := r.Get(t.Context(), "r1"); err != nil || ok {
			t.Fatalf("the latest attempt's stop left its placement (%v)", err)
		}
	})
	t.Run("many are read at once, the rentals never placed left out", func(t *testing.T) {
		r := newRecords(t)
		must(t, r.Put(t.Context(), "r1", migrate.Placement{Attempt: 1, Tenant: "acme", Node: "n1", Spec: Spec(shizuv1.Plan_PLAN_ON_DEMAND)}))
		must(t, r.Put(t.Context(), "r2", migrate.Placement{Attempt: 3, Tenant: "acme", Node: "n1", Spec: Spec(shizuv1.Plan_PLAN_SPOT)}))
		got, err := r.GetMany(t.Context(), []string{"r1", "nobody", "r2"})
		must(t, err)
		if len(got) != 2 || got["r1"].Attempt != 1 || got["r2"].Attempt != 3 {
			t.Fatalf("read %+v, want r1 at 1 and r2 at 3", got)
		}
		if none, err := r.GetMany(t.Context(), nil); err != nil || len(none) != 0 {
			t.Fatalf("reading none gave %v (%v)", none, err)
		}
	})
}

// RunMoveRecordsContract checks what the failover app relies on of its
// move records.
func RunMoveRecordsContract(t *testing.T, newRecords func(t *testing.T) MoveRecords) {
	t.Run("a move reads back as stored and is listed", func(t *testing.T) {
		r := newRecords(t)
		want := Record("r1")
		want.StopOld, want.Priority = true, 7
		must(t, r.Put(t.Context(), want))
		got, ok, err := r.Get(t.Context(), "r1")
		must(t, err)
		if !ok || !equalRecords(got, want) {
			t.Fatalf("read %+v (%v), want %+v", got, ok, want)
		}
		if ids, err := r.List(t.Context()); err != nil || !slices.Equal(ids, []string{"r1"}) {
			t.Fatalf("listed %v (%v), want r1", ids, err)
		}
	})
	t.Run("moves stored together read back together, the others left out", func(t *testing.T) {
		r := newRecords(t)
		must(t, r.PutMany(t.Context(), []migrate.Record{Record("r1"), Record("r2")}))
		must(t, r.PutMany(t.Context(), nil))
		got, err := r.GetMany(t.Context(), []string{"r1", "r2", "r3"})
		must(t, err)
		if len(got) != 2 || !equalRecords(got["r2"], Record("r2")) {
			t.Fatalf("read %+v, want r1 and r2", got)
		}
		ids, err := r.List(t.Context())
		must(t, err)
		slices.Sort(ids)
		if !slices.Equal(ids, []string{"r1", "r2"}) {
			t.Fatalf("listed %v, want r1 and r2", ids)
		}
	})
	t.Run("an update rewrites only the moves still recorded", func(t *testing.T) {
		r := newRecords(t)
		must(t, r.PutMany(t.Context(), []migrate.Record{Record("r1"), Record("r2")}))
		must(t, r.Drop(t.Context(), "r2")) // completed meanwhile
		r1, r2 := Record("r1"), Record("r2")
		r1.Published, r2.Published = true, true
		must(t, r.UpdateMany(t.Context(), []migrate.Record{r1, r2}))
		must(t, r.UpdateMany(t.Context(), nil))
		if got, _, err := r.Get(t.Context(), "r1"); err != nil || !got.Published {
			t.Fatalf("r1 %+v (%v), want published", got, err)
		}
		if _, ok, err := r.Get(t.Context(), "r2"); err != nil || ok {
			t.Fatalf("a completed move came back (%v)", err)
		}
	})
	t.Run("a dropped move is neither read nor listed", func(t *testing.T) {
		r := newRecords(t)
		must(t, r.Put(t.Context(), Record("r1")))
		must(t, r.Drop(t.Context(), "r1"))
		must(t, r.Drop(t.Context(), "never"))
		if _, ok, err := r.Get(t.Context(), "r1"); err != nil || ok {
			t.Fatalf("still read (%v)", err)
		}
		if ids, err := r.List(t.Context()); err != nil || len(ids) != 0 {
			t.Fatalf("still listed: %v (%v)", ids, err)
		}
	})
}

func equalRecords(a, b migrate.Record) bool {
	return fmt.Sprintf("%+v", a) == fmt.Sprintf("%+v", b) && a.DecidedAt.Equal(b.DecidedAt)
}

// RunQuarantineRecordsContract checks what the failover app relies on of
// its quarantine records.
func RunQuarantineRecordsContract(t *testing.T, newRecords func(t *testing.T) QuarantineRecords) {
	t.Run("quarantines are listed by node with their epoch and end", func(t *testing.T) {
		r := newRecords(t)
		must(t, r.Put(t.Context(), detect.Quarantine{Node: "n2", Epoch: 4, Until: t0.Add(time.Minute), Losses: 3}))
		must(t, r.Put(t.Context(), detect.Quarantine{Node: "n1", Epoch: 2, Until: t0}))
		got, err := r.List(t.Context())
		must(t, err)
		if len(got) != 2 || got[0].Node != "n1" || got[1].Node != "n2" || got[1].Epoch != 4 || !got[1].Until.Equal(t0.Add(time.Minute)) {
			t.Fatalf("listed %+v", got)
		}
	})
	t.Run("a node quarantined again keeps only the latest", func(t *testing.T) {
		r := newRecords(t)
		must(t, r.Put(t.Context(), detect.Quarantine{Node: "n1", Epoch: 2, Until: t0}))
		must(t, r.Put(t.Context(), detect.Quarantine{Node: "n1", Epoch: 3, Until: t0.Add(time.Hour)}))
		if got, err := r.List(t.Context()); err != nil || len(got) != 1 || got[0].Epoch != 3 {
			t.Fatalf("listed %+v (%v), want epoch 3 only", got, err)
		}
	})
	t.Run("a dropped quarantine is not listed", func(t *testing.T) {
		r := newRecords(t)
		must(t, r.Put(t.Context(), detect.Quarantine{Node: "n1", Epoch: 2, Until: t0}))
		must(t, r.Drop(t.Context(), "n1"))
		must(t, r.Drop(t.Context(), "never"))
		if got, err := r.List(t.Context()); err != nil || len(got) != 0 {
			t.Fatalf("listed %+v (%v)", got, err)
		}
	})
}

// migrating is a valid RentalMigrating with event id id.
func migrating(id, rental string) *shizuv1.RentalMigrating {
	return &shizuv1.RentalMigrating{Meta: shizuv1.NewMeta(id, "contract", "", rental, t0), RentalId: rental, TenantId: "acme",
		FromNodeId: "n1", FromNodeEpoch: 1, Reason: shizuv1.MigrationReason_MIGRATION_REASON_NODE_LOST, FromAttempt: 1, NextAttempt: 2}
}

// MigratingSubject is where the contract publishes (tenant acme's
// rental.acme.migrating).
const MigratingSubject = "rental.acme.migrating"

// RunEventBatchContract checks what the failover app relies on of the bus.
// open returns a batch factory and what has reached the bus on
// MigratingSubject so far (subject and id of each event, in order).
func RunEventBatchContract(t *testing.T, open func(t *testing.T) (newBatch func() EventBatch, delivered func(t *testing.T) []Event)) {
	ids := func(es []Event) []string {
		out := make([]string, len(es))
		for i, e := range es {
			out[i] = e.ID
		}
		return out
	}
	t.Run("a batch's events reach the bus in order once it is waited for", func(t *testing.T) {
		newBatch, delivered := open(t)
		b := newBatch()
		must(t, b.Publish(t.Context(), MigratingSubject, migrating("rental:r1:migrating:2", "r1")))
		must(t, b.Publish(t.Context(), MigratingSubject, migrating("rental:r2:migrating:2", "r2")))
		if b.Len() != 2 {
			t.Fatalf("Len %d, want 2 queued", b.Len())
		}
		must(t, b.Wait(t.Context()))
		if b.Len() != 0 {
			t.Fatalf("Len %d after Wait, want 0", b.Len())
		}
		got := delivered(t)
		if want := []string{"rental:r1:migrating:2", "rental:r2:migrating:2"}; !slices.Equal(ids(got), want) {
			t.Fatalf("delivered %v, want %v", ids(got), want)
		}
		if got[0].Subject != MigratingSubject {
			t.Fatalf("delivered on %s", got[0].Subject)
		}
	})
	t.Run("an event published again under its id is delivered once", func(t *testing.T) {
		newBatch, delivered := open(t)
		for range 2 {
			b := newBatch()
			must(t, b.Publish(t.Context(), MigratingSubject, migrating("rental:r1:migrating:2", "r1")))
			must(t, b.Wait(t.Context()))
		}
		if got := delivered(t); len(got) != 1 {
			t.Fatalf("delivered %v, want once", ids(got))
		}
	})
	t.Run("an event without an id is refused as invalid and the others still go out", func(t *testing.T) {
		newBatch, delivered := open(t)
		b := newBatch()
		must(t, b.Publish(t.Context(), MigratingSubject, migrating("rental:r1:migrating:2", "r1")))
		if err := b.Publish(t.Context(), MigratingSubject, migrating("", "r2")); !fault.IsInvalid(err) {
			t.Fatalf("an event without an id: %v, want invalid", err)
		}
		must(t, b.Wait(t.Context()))
		if got := delivered(t); !slices.Equal(ids(got), []string{"rental:r1:migrating:2"}) {
			t.Fatalf("delivered %v, want r1's only", ids(got))
		}
	})
	t.Run("waiting for an empty batch succeeds", func(t *testing.T) {
		newBatch, _ := open(t)
		must(t, newBatch().Wait(t.Context()))
	})
}
