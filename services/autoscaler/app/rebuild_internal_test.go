package app

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/autoscaler/policy"
	"github.com/shizu-gpu/shizu/shared/topology"
)

func TestRebuiltPoolReplicasAreTheRequestedOnesNotEndedNorCancelledByTheAutoscaler(t *testing.T) {
	t.Parallel()
	p := NewPoolReplicas()
	fold := func(subj string, ev proto.Message) {
		data, err := proto.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		p.Fold(subj, data)
	}
	request := func(id string, plan shizuv1.Plan) {
		fold("rental.acme.requested", &shizuv1.RentalRequested{Meta: &shizuv1.EventMeta{Source: topology.Autoscaler},
			RentalId: id, TenantId: "acme", Spec: &shizuv1.RentalSpec{Plan: plan, Labels: map[string]string{PoolLabel: "web"}}})
	}
	for i, id := range []string{"pool-web-1", "pool-web-2", "pool-web-3", "pool-web-4", "pool-web-5", "pool-web-6"} {
		plan := shizuv1.Plan_PLAN_ON_DEMAND
		if i == 5 {
			plan = shizuv1.Plan_PLAN_SPOT
		}
		request(id, plan)
	}
	request("pool-web-1", shizuv1.Plan_PLAN_ON_DEMAND) // redelivered: once
	fold("rental.acme.requested", &shizuv1.RentalRequested{RentalId: "pool-api-9", TenantId: "acme",
		Spec: &shizuv1.RentalSpec{Labels: map[string]string{PoolLabel: "web"}}}) // not a web id
	fold("rental.acme.requested", &shizuv1.RentalRequested{RentalId: "tenant-own", TenantId: "acme"})
	fold("rental.acme.requested", &shizuv1.RentalRequested{Meta: &shizuv1.EventMeta{Source: "tenant"}, RentalId: "pool-web-99",
		TenantId: "acme", Spec: &shizuv1.RentalSpec{Labels: map[string]string{PoolLabel: "web"}}}) // not the autoscaler's
	fold("rental.acme.cancel_requested", &shizuv1.RentalCancelRequested{RentalId: "pool-web-6", RequestedBy: topology.Autoscaler})
	fold("rental.acme.cancel_requested", &shizuv1.RentalCancelRequested{RentalId: "pool-web-5", RequestedBy: "tenant"})
	fold("rental.acme.rejected", &shizuv1.RentalRejected{RentalId: "pool-web-2", Reason: shizuv1.RejectReason_REJECT_REASON_PENDING_TIMEOUT})
	fold("rental.acme.rejected", &shizuv1.RentalRejected{RentalId: "pool-web-5", Reason: shizuv1.RejectReason_REJECT_REASON_CANCELLED})
	fold("rental.acme.stopped", &shizuv1.RentalStopped{RentalId: "pool-web-3", ExitReason: shizuv1.ExitReason_EXIT_REASON_COMPLETED})
	fold("rental.acme.stopped", &shizuv1.RentalStopped{RentalId: "pool-web-4", ExitReason: shizuv1.ExitReason_EXIT_REASON_MIGRATED})

	got := p.Pools()
	if len(got) != 1 {
		t.Fatalf("pools %v, want web only", got)
	}
	web := got["web"]
	var ids []string
	for _, r := range web.Rentals {
		ids = append(ids, r.ID)
	}
	// 2 rejected, 3 completed and 6 cancelled by the autoscaler are gone; 4
	// (stopped to migrate) and 5 (a cancel the autoscaler did not ask for,
	// which the live handlers keep too) stay.
	if want := []string{"pool-web-1", "pool-web-4", "pool-web-5"}; !slices.Equal(ids, want) || web.Seq != 6 {
		t.Fatalf("replicas %v at sequence %d, want %v at 6 (no id is reused)", ids, web.Seq, want)
	}
	if web.Rentals[0].Market != policy.OnDemand {
		t.Fatalf("market %v", web.Rentals[0].Market)
	}
}
