package migrate_test

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/failover/migrate"
)

func placed(attempt int32, node string) migrate.Placement {
	return migrate.Placement{Attempt: attempt, Tenant: "acme", Node: node,
		Spec: &shizuv1.RentalSpec{GpuCount: 1, MilliGpu: 1000, Plan: shizuv1.Plan_PLAN_RESERVED}}
}

func migrating(rental string, from, next int32, reason shizuv1.MigrationReason, at time.Time) *shizuv1.RentalMigrating {
	return &shizuv1.RentalMigrating{Meta: &shizuv1.EventMeta{EventId: "m", OccurredAt: timestamppb.New(at), CausationId: "node:n1:lost:1"},
		RentalId: rental, TenantId: "acme", FromNodeId: "n1", FromNodeEpoch: 1, Reason: reason,
		LastHeartbeatAt: timestamppb.New(at.Add(-time.Second)), FromAttempt: from, NextAttempt: next}
}

func started(rental string, attempt int32) *shizuv1.RentalStarted {
	return &shizuv1.RentalStarted{RentalId: rental, Attempt: attempt, NodeId: "n2"}
}

func TestRebuiltPlacementsAreTheLatestAttemptsStillRunning(t *testing.T) {
	t.Parallel()
	r := migrate.NewRecords()
	r.Scheduled("a", placed(2, "n2"))
	r.Scheduled("a", placed(1, "n1")) // an older attempt, later on the stream
	r.Scheduled("b", placed(1, "n1"))
	r.Stopped("b", 1)
	r.Scheduled("c", placed(1, "n1"))
	r.Stopped("c", 0) // not its attempt
	got := r.Placements()
	if len(got) != 2 || got["a"].Attempt != 2 || got["a"].Node != "n2" || got["c"].Attempt != 1 {
		t.Fatalf("placements %+v, want a at attempt 2 and c (b stopped)", got)
	}
}

func TestRebuiltMovesAreThoseHandedOverAndNotMigratedYet(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	r := migrate.NewRecords()
	r.Scheduled("spot", placed(1, "n1"))
	r.Migrating(migrating("spot", 1, 2, shizuv1.MigrationReason_MIGRATION_REASON_SPOT_INTERRUPTION, at))
	r.Scheduled("spot", placed(2, "n2"))
	r.Started(started("spot", 1)) // the old run's start: completes nothing
	r.Started(started("spot", 2))
	r.Migrating(migrating("done", 1, 2, shizuv1.MigrationReason_MIGRATION_REASON_NODE_LOST, at))
	r.Started(started("done", 2))
	r.Migrated("done", 2)
	r.Migrating(migrating("waiting", 1, 2, shizuv1.MigrationReason_MIGRATION_REASON_NODE_LOST, at))

	moves := r.Moves()
	if len(moves) != 2 || moves[0].Rental != "spot" || moves[1].Rental != "waiting" {
		t.Fatalf("moves %+v, want spot and waiting (done was migrated)", moves)
	}
	spot := moves[0]
	if spot.Mode != migrate.ModeMakeBeforeBreak || !spot.Published || !spot.Scheduled || spot.FromAttempt != 1 ||
		spot.NextAttempt != 2 || !spot.DecidedAt.Equal(at) || spot.Cause != "node:n1:lost:1" || spot.Class != migrate.ClassReserved {
		t.Fatalf("spot move %+v", spot)
	}
	if moves[1].Mode != migrate.ModeBreak || !moves[1].LastAlive.Equal(at.Add(-time.Second)) {
		t.Fatalf("waiting move %+v", moves[1])
	}
	done := r.Completions()
	if len(done) != 1 || done[0].GetRentalId() != "spot" || done[0].GetAttempt() != 2 {
		t.Fatalf("completions %v, want the spot move's start of attempt 2", done)
	}
}
