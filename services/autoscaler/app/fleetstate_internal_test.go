package app

import (
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/autoscaler/fleet"
	"github.com/shizu-gpu/shizu/services/autoscaler/policy"
	"github.com/shizu-gpu/shizu/services/autoscaler/provider"
	"github.com/shizu-gpu/shizu/services/autoscaler/provider/providertest"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

// replicaEnv is real NATS (with the streams) and Redis shared by scalers
// that play replicas of the autoscaler, each with a provider of its own.
type replicaEnv struct {
	t     *testing.T
	pub   *bus.Conn
	redis *testkit.Redis
	caps  *capacity.Store
	file  policy.File
}

func newReplicaEnv(t *testing.T, file policy.File) *replicaEnv {
	t.Helper()
	p := testkit.Platform(t, testkit.WithoutUsers())
	return &replicaEnv{t: t, pub: p.Admin, redis: p.Redis, caps: p.Capacity(t), file: file}
}

// replica starts one scaler (a replica, or the same one after a restart:
// nothing in memory survives) on the shared NATS and Redis.
func (e *replicaEnv) replica(prov provider.Provider) *scaler {
	m, err := newMetrics(noop.NewMeterProvider())
	if err != nil {
		e.t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(e.t.Output(), nil))
	return newScaler(e.pub, e.redis.Client(e.t), "shizu", e.caps, prov, e.file, time.Now, log, m)
}

func fleetPolicy(maxNodes int) policy.File {
	return policy.File{Fleet: fleet.Config{
		InstanceTypes: []fleet.InstanceType{{Name: "p5.48xlarge", Profile: "h100x8", Model: "H100-SXM5-80GB", GPUs: 8,
			PricePerGPUHourMicros: 2_490_000}},
		DefaultZone: "z1", MaxNodes: maxNodes, IdleAfter: fleet.Duration(time.Hour), RegisterTimeout: fleet.Duration(time.Hour),
	}}
}

func shortage(id string, rentals ...string) *shizuv1.CapacityShortage {
	return &shizuv1.CapacityShortage{
		Meta:    &shizuv1.EventMeta{EventId: id, OccurredAt: timestamppb.Now(), Source: "scheduler"},
		Missing: &shizuv1.ResourceVector{GpuCount: 8}, RentalIds: rentals,
	}
}

func provisioned(p *providertest.Memory) int {
	n := 0
	for _, c := range p.Calls() {
		if c.Op == "provision" {
			n += len(c.IDs)
		}
	}
	return n
}

func TestTwoReplicasGivenTheSameShortageProvisionOnce(t *testing.T) {
	t.Parallel()
	e := newReplicaEnv(t, fleetPolicy(8))
	// Each replica has its own provider, as each process has its own local
	// provider: only the claims in Redis keep them from both provisioning.
	provA, provB := providertest.NewMemory(), providertest.NewMemory()
	a, b := e.replica(provA), e.replica(provB)
	// The scheduler reports the same two waiting rentals again and again
	// (each report is a new event); the reports land on both replicas at
	// the same time.
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 10 {
		for name, s := range map[string]*scaler{"a": a, "b": b} {
			wg.Go(func() {
				ev := shortage(fmt.Sprintf("shortage-%s-%d", name, i), "r1", "r2")
				if err := s.onShortage(t.Context(), ev, bus.Delivery{}); err != nil {
					errs <- err
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Two 8-GPU rentals need two nodes, once.
	if got := provisioned(provA) + provisioned(provB); got != 2 {
		t.Fatalf("replicas provisioned %d nodes in all (a %d, b %d); want 2", got, provisioned(provA), provisioned(provB))
	}
	recorded, err := a.fleet.nodes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(recorded) != 2 {
		t.Fatalf("%d provisioned nodes recorded in Redis; want 2: %v", len(recorded), recorded)
	}
	// A shortage for another rental is a new claim: one more node.
	if err := b.onShortage(t.Context(), shortage("shortage-r3", "r3"), bus.Delivery{}); err != nil {
		t.Fatal(err)
	}
	if got := provisioned(provA) + provisioned(provB); got != 3 {
		t.Fatalf("%d nodes after a shortage for a new rental; want 3", got)
	}
}

func TestAFailedProvisioningGivesItsClaimBack(t *testing.T) {
	t.Parallel()
	e := newReplicaEnv(t, fleetPolicy(8))
	prov := providertest.NewMemory()
	s := e.replica(prov)
	prov.Fail = fmt.Errorf("cloud API down")
	if err := s.onShortage(t.Context(), shortage("shortage-1", "r1"), bus.Delivery{}); err == nil {
		t.Fatal("a failed provisioning was acknowledged")
	}
	covered, err := s.fleet.covered(t.Context(), []string{"r1"})
	if err != nil {
		t.Fatal(err)
	}
	if covered["r1"] {
		t.Fatal("r1 stays claimed after its provisioning failed: the next report would provision nothing")
	}
	prov.Fail = nil
	if err := s.onShortage(t.Context(), shortage("shortage-2", "r1"), bus.Delivery{}); err != nil {
		t.Fatal(err)
	}
	if got := provisioned(prov); got != 1 {
		t.Fatalf("%d nodes provisioned once the provider answers; want 1", got)
	}
}

func TestARestartedReplicaStillKnowsTheNodesItProvisioned(t *testing.T) {
	t.Parallel()
	file := fleetPolicy(1)
	file.Fleet.RegisterTimeout = fleet.Duration(time.Second)
	e := newReplicaEnv(t, file)
	before := e.replica(providertest.NewMemory())
	if err := before.onShortage(t.Context(), shortage("shortage-1", "r1"), bus.Delivery{}); err != nil {
		t.Fatal(err)
	}
	// After a restart the process's local provider knows no node; Redis
	// does.
	prov := providertest.NewMemory()
	after := e.replica(prov)
	nodes, err := after.fleetNodes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 1 || nodes[0].InstanceType != "p5.48xlarge" || nodes[0].Pool != "fleet" {
		t.Fatalf("after a restart the fleet is %v; want the node provisioned before", nodes)
	}
	// It counts against max_nodes (1): a new shortage provisions nothing.
	if err := after.onShortage(t.Context(), shortage("shortage-2", "r2"), bus.Delivery{}); err != nil {
		t.Fatal(err)
	}
	if got := provisioned(prov); got != 0 {
		t.Fatalf("the restarted replica provisioned %d nodes beyond max_nodes", got)
	}
	// The node never registered: past its register timeout the restarted
	// replica releases it and forgets it.
	if err := after.tickFleet(t.Context(), time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	released := false
	for _, c := range prov.Calls() {
		released = released || (c.Op == "release" && c.Node == nodes[0].ID)
	}
	if !released {
		t.Fatalf("the restarted replica did not release %s: %v", nodes[0].ID, prov.Calls())
	}
	if left, err := after.fleet.nodes(t.Context()); err != nil || len(left) != 0 {
		t.Fatalf("released node still recorded: %v (%v)", left, err)
	}
}
