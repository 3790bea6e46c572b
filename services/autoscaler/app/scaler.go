package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/autoscaler/fleet"
	"github.com/shizu-gpu/shizu/services/autoscaler/policy"
	"github.com/shizu-gpu/shizu/services/autoscaler/provider"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/rent"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// PoolLabel is the rental label naming the pool a rental belongs to.
const PoolLabel = "shizu.pool"

// publisher is the part of the bus the scaler uses.
type publisher interface {
	Publish(ctx context.Context, subject string, ev proto.Message) (bus.Ack, error)
}

// scaler turns samples, shortages and telemetry into decisions, events and
// provider calls. The decisions themselves are the policy and fleet
// packages'; this is the adapter.
type scaler struct {
	pub    publisher
	states stateStore
	fleet  fleetStore
	// declared: pools declared through the bus.
	declared poolStore
	caps     *capacity.Store
	prov     provider.Provider
	file     policy.File
	pools    map[string]policy.Pool
	now      func() time.Time
	log      *slog.Logger
	m        metrics

	mu sync.Mutex
	// idle: when each provider node was first seen holding nothing.
	idle map[string]time.Time
	// busyAt: last telemetry with GPU utilization above zero, per node.
	busyAt map[string]time.Time
}

type metrics struct {
	decisions metric.Int64Counter
	latency   metric.Float64Histogram
	provision metric.Int64Counter
	release   metric.Int64Counter
}

func newMetrics(mp metric.MeterProvider) (metrics, error) {
	m := mp.Meter("github.com/shizu-gpu/shizu/services/autoscaler")
	var errs []error
	var out metrics
	var err error
	out.decisions, err = m.Int64Counter("shizu.autoscaler.decisions", metric.WithDescription("scaling decisions that changed a pool, by rule kind"))
	errs = append(errs, err)
	out.latency, err = m.Float64Histogram("shizu.autoscaler.decision.latency", metric.WithUnit("s"),
		metric.WithDescription("from a traffic sample's time to its decision being published"))
	errs = append(errs, err)
	out.provision, err = m.Int64Counter("shizu.autoscaler.nodes.provisioned", metric.WithDescription("nodes asked of the provider"))
	errs = append(errs, err)
	out.release, err = m.Int64Counter("shizu.autoscaler.nodes.released", metric.WithDescription("nodes given back to the provider"))
	errs = append(errs, err)
	return out, errors.Join(errs...)
}

// ruleKind is the rule without its user-chosen name, a low-cardinality label.
func ruleKind(rule string) string {
	for i := range len(rule) {
		if rule[i] == ':' {
			return rule[:i]
		}
	}
	return rule
}

func sampleOf(ev *shizuv1.TrafficSampled) policy.Sample {
	s := policy.Sample{At: ev.GetMeta().GetOccurredAt().AsTime(), Concurrent: ev.GetConcurrentRequests(), RPS: ev.GetRequestsPerSecond()}
	if p := ev.GetP99Latency(); p != nil {
		s.P99, s.HasP99 = p.AsDuration(), true
	}
	return s
}

// onSample records a pool's sample and decides at the sample's time.
func (s *scaler) onSample(ctx context.Context, ev *shizuv1.TrafficSampled, _ bus.Delivery) error {
	pool, ok, err := s.pool(ctx, ev.GetPoolId())
	if err != nil {
		return err
	}
	if !ok {
		s.log.DebugContext(ctx, "traffic sample for a pool without policy", "pool", ev.GetPoolId())
		return nil
	}
	return s.scaleOnSample(ctx, pool, ev)
}

// scaleOnSample records a sample of pool, whose policy was read before,
// and decides at the sample's time.
func (s *scaler) scaleOnSample(ctx context.Context, pool policy.Pool, ev *shizuv1.TrafficSampled) error {
	sample := sampleOf(ev)
	cause := ev.GetMeta().GetEventId()
	decisionID := "scale:" + pool.ID + ":" + cause
	var added []string
	err := s.states.update(ctx, pool.ID, func(rec *poolRecord) error {
		added = nil
		if s.withdrawn(pool, rec) {
			return errNoChange
		}
		st, fresh := policy.Observe(rec.State, sample)
		if !fresh {
			return errNoChange
		}
		d, next := policy.Decide(pool, st, sample.At)
		before := len(rec.Rentals)
		if err := s.apply(ctx, pool, rec, d, decisionID, cause); err != nil {
			return err
		}
		for _, r := range rec.Rentals[min(before, len(rec.Rentals)):] {
			added = append(added, r.ID)
		}
		rec.State = next
		return nil
	})
	if err != nil {
		return err
	}
	s.m.latency.Record(ctx, s.now().Sub(sample.At).Seconds())
	if pool.ProvisionAhead && len(added) > 0 {
		// Best effort: the scheduler's shortage report is the backstop.
		if err := s.provisionAhead(ctx, pool, added, decisionID); err != nil {
			s.log.WarnContext(ctx, "provisioning ahead of a scale-out failed", "pool", pool.ID, "err", err)
		}
	}
	return nil
}

// provisionAhead asks for nodes when the fleet's free capacity cannot hold
// the rentals a scale-out just requested.
func (s *scaler) provisionAhead(ctx context.Context, pool policy.Pool, added []string, decisionID string) error {
	if s.prov == nil || len(s.file.Fleet.InstanceTypes) == 0 {
		return nil
	}
	snap, err := s.caps.Snapshot(ctx)
	if err != nil {
		return err
	}
	free := make([]fleet.FreeNode, 0, len(snap.Nodes))
	for _, n := range snap.Nodes {
		fn := fleet.FreeNode{ID: n.ID, Ready: n.Status == capacity.StatusReady, Zone: n.Zone}
		for i, g := range n.FreeGPUs {
			fn.GPUs = append(fn.GPUs, fleet.FreeGPU{Model: n.GPUs[i].Model, Milli: g.Milli, VRAMMiB: g.VRAMMiB, Slots: g.MaxSharers - g.Sharers})
		}
		free = append(free, fn)
	}
	shape := fleet.Shape{GPUCount: int(pool.Rental.GPUCount), MilliGPU: int64(pool.Rental.MilliGPU), VRAMMiB: pool.Rental.VRAMMiB,
		Models: pool.Rental.Models, Zone: pool.Rental.Zone}
	fits := fleet.FreeSlots(free, shape)
	if fits >= len(added) {
		return nil
	}
	sh := fleet.Shortage{EventID: decisionID, GPUCount: shape.GPUCount, Models: shape.Models, Zone: shape.Zone, Rentals: added[fits:]}
	return s.provisionFor(ctx, sh, pool.ID, fmt.Sprintf("pool %s scale-out: free capacity holds %d of %d new replicas", pool.ID, fits, len(added)))
}

// tickPools re-evaluates every pool at now: pre-warm windows opening and
// closing, scale-to-zero after idleness.
func (s *scaler) tickPools(ctx context.Context, now time.Time) {
	pools, err := s.allPools(ctx)
	if err != nil {
		s.log.WarnContext(ctx, "could not read the pools declared through the bus", "err", err)
	}
	for _, pool := range pools {
		s.tickPool(ctx, pool, now)
	}
}

// tickPool re-evaluates pool, whose policy was read before, at now.
func (s *scaler) tickPool(ctx context.Context, pool policy.Pool, now time.Time) {
	id := "scale:" + pool.ID + ":tick:" + strconv.FormatInt(now.UnixMilli(), 10)
	var added []string
	err := s.states.update(ctx, pool.ID, func(rec *poolRecord) error {
		added = nil
		if s.withdrawn(pool, rec) {
			return errNoChange
		}
		d, next := policy.Decide(pool, rec.State, now)
		if !d.Changed() && next == rec.State {
			return errNoChange
		}
		before := len(rec.Rentals)
		if err := s.apply(ctx, pool, rec, d, id, ""); err != nil {
			return err
		}
		for _, r := range rec.Rentals[min(before, len(rec.Rentals)):] {
			added = append(added, r.ID)
		}
		rec.State = next
		return nil
	})
	if err != nil {
		s.log.WarnContext(ctx, "pool tick failed", "pool", pool.ID, "err", err)
		return
	}
	if pool.ProvisionAhead && len(added) > 0 {
		if err := s.provisionAhead(ctx, pool, added, id); err != nil {
			s.log.WarnContext(ctx, "provisioning ahead of a scale-out failed", "pool", pool.ID, "err", err)
		}
	}
}

// withdrawn reports that pool was withdrawn since its policy was read: the
// update must change nothing. The policy file's pools cannot be withdrawn
// (a flag left by a bus pool of the same id before the file named it does
// not stop them).
func (s *scaler) withdrawn(pool policy.Pool, rec *poolRecord) bool {
	if _, inFile := s.pools[pool.ID]; inFile {
		return false
	}
	return rec.Withdrawn
}

// apply publishes a changed decision and the rentals it requests or
// cancels, with ids derived from the pool's rental sequence, so a retried
// delivery publishes the same ids and the streams deduplicate them.
func (s *scaler) apply(ctx context.Context, pool policy.Pool, rec *poolRecord, d policy.Decision, decisionID, cause string) error {
	if !d.Changed() {
		return nil
	}
	// The pool's rentals are the truth for "from": a lost update elsewhere
	// must not make us request twice.
	d.From = len(rec.Rentals)
	if d.From == d.To {
		return nil
	}
	now := s.now()
	meta := func(id, correlation, causation string) *shizuv1.EventMeta {
		return &shizuv1.EventMeta{EventId: id, OccurredAt: timestamppb.New(now), Source: topology.Autoscaler,
			CausationId: causation, CorrelationId: correlation}
	}
	decided := &shizuv1.ScalingDecided{Meta: meta(decisionID, pool.ID, cause), PoolId: pool.ID,
		FromReplicas: int32(d.From), ToReplicas: int32(d.To), Rule: d.Rule, Metric: d.Metric,
		ObservedValue: d.Observed, Threshold: d.Threshold,
		Reason: fmt.Sprintf("%s; new replicas on %s (%s)", d.Reason, d.Market, d.MarketRule)}
	subj, err := subject.Format(subject.ScaleDecided, pool.ID)
	if err != nil {
		return fault.Invalid("pool %s: %w", pool.ID, err)
	}
	if _, err := s.pub.Publish(ctx, subj, decided); err != nil {
		return err
	}
	rentalSubj, err := subject.Format(subject.RentalRequested, pool.Tenant)
	if err != nil {
		return fault.Invalid("pool %s tenant: %w", pool.ID, err)
	}
	cancelSubj, _ := subject.Format(subject.RentalCancelRequested, pool.Tenant)
	for len(rec.Rentals) < d.To {
		rec.Seq++
		id := fmt.Sprintf("pool-%s-%d", pool.ID, rec.Seq)
		spec := pool.Rental.Spec(d.Market.Plan())
		spec.Labels = map[string]string{PoolLabel: pool.ID}
		ev := &shizuv1.RentalRequested{Meta: meta("pool:"+pool.ID+":"+strconv.Itoa(rec.Seq)+":requested", id, decisionID),
			RentalId: id, TenantId: pool.Tenant, Spec: spec}
		if _, err := s.pub.Publish(ctx, rentalSubj, ev); err != nil {
			return err
		}
		rec.Rentals = append(rec.Rentals, poolRental{ID: id, Seq: rec.Seq, Market: d.Market})
	}
	for len(rec.Rentals) > d.To {
		r := rec.Rentals[len(rec.Rentals)-1]
		ev := &shizuv1.RentalCancelRequested{Meta: meta("pool:"+pool.ID+":"+strconv.Itoa(r.Seq)+":cancel", r.ID, decisionID),
			RentalId: r.ID, TenantId: pool.Tenant, RequestedBy: topology.Autoscaler, Reason: "scale-in: " + d.Reason}
		if _, err := s.pub.Publish(ctx, cancelSubj, ev); err != nil {
			return err
		}
		rec.Rentals = rec.Rentals[:len(rec.Rentals)-1]
	}
	s.m.decisions.Add(ctx, 1, metric.WithAttributes(attribute.String("shizu.rule", ruleKind(d.Rule))))
	s.log.InfoContext(ctx, "pool scaled", "pool", pool.ID, "from", d.From, "to", d.To, "rule", d.Rule,
		"metric", d.Metric, "observed", d.Observed, "threshold", d.Threshold, "market", string(d.Market))
	return nil
}

// BusyUtilizationPercent is the GPU utilization from which a node counts
// as working. Idle GPUs report a few percent (monitoring, the driver's own
// work; the simulated hosts' idle walk reaches 6 %), so anything below it
// does not keep a node from being released.
const BusyUtilizationPercent = 10

// gpuBusy reports whether a GPU's utilization says it is working.
func gpuBusy(utilizationPercent float64) bool { return utilizationPercent >= BusyUtilizationPercent }

// onTelemetry remembers which nodes' GPUs are working.
func (s *scaler) onTelemetry(_ context.Context, ev *shizuv1.NodeTelemetry, _ bus.Delivery) error {
	for _, g := range ev.GetGpus() {
		if gpuBusy(float64(g.GetUtilizationPercent())) {
			at := ev.GetMeta().GetOccurredAt().AsTime()
			s.mu.Lock()
			if at.After(s.busyAt[ev.GetNodeId()]) {
				s.busyAt[ev.GetNodeId()] = at
			}
			s.mu.Unlock()
			break
		}
	}
	return nil
}

// onShortage provisions nodes for rentals the scheduler cannot place.
func (s *scaler) onShortage(ctx context.Context, ev *shizuv1.CapacityShortage, _ bus.Delivery) error {
	if len(s.file.Fleet.InstanceTypes) == 0 || s.prov == nil {
		s.log.WarnContext(ctx, "capacity shortage but no fleet provisioning configured", "rentals", len(ev.GetRentalIds()))
		return nil
	}
	miss := ev.GetMissing()
	sh := fleet.Shortage{EventID: ev.GetMeta().GetEventId(), GPUCount: int(miss.GetGpuCount()), Models: miss.GetModels(),
		Zone: miss.GetZone(), Market: rent.MarketOf(miss.GetMarket()), Rentals: ev.GetRentalIds()}
	return s.provisionFor(ctx, sh, subject.FleetPool, "")
}

// provisionFor provisions nodes for the waiting rentals of sh, for pool
// (the fleet or an autoscaled pool), and announces it. The rentals are
// claimed in Redis first, all or nothing, so replicas reporting the same
// rentals provision once; the nodes are recorded there once started.
func (s *scaler) provisionFor(ctx context.Context, sh fleet.Shortage, poolID, why string) error {
	now := s.now()
	var plan fleet.Provision
	claimed := false
	for range 3 {
		covered, err := s.fleet.covered(ctx, sh.Rentals)
		if err != nil {
			return err
		}
		size, err := s.fleetSize(ctx)
		if err != nil {
			return err
		}
		plan, err = fleet.PlanProvision(s.file.Fleet, sh, size, func(r string) bool { return covered[r] }, s.file.Fleet.DefaultMarket)
		if errors.Is(err, fleet.ErrNoInstanceType) || errors.Is(err, fleet.ErrFleetFull) {
			s.log.WarnContext(ctx, "capacity shortage cannot be provisioned", "err", err, "rentals", len(sh.Rentals))
			return nil
		}
		if err != nil {
			return err
		}
		if plan.Count == 0 {
			return nil
		}
		taken, err := s.fleet.claim(ctx, plan.Rentals, sh.EventID, 2*s.file.Fleet.RegisterTimeout.D())
		if err != nil {
			return err
		}
		if len(taken) == 0 {
			claimed = true
			break
		}
		// Another replica claimed some of them in between: plan again.
	}
	if !claimed {
		return fault.Unavailable("shortage %s: its rentals' claims kept changing", sh.EventID)
	}
	if why != "" {
		plan.Reason = why + "; " + plan.Reason
	}
	ids, err := s.prov.Provision(ctx, plan.InstanceType.Name, plan.Market, plan.Zone, plan.Count)
	if errors.Is(err, provider.ErrInsufficientCapacity) && plan.Market == fleet.Spot && sh.Market == "" {
		// Spot is short and the rentals take either market: on-demand.
		s.markSpotShort(ctx, now)
		plan.Market = fleet.OnDemand
		plan.Reason += "; spot short, fell back to on-demand"
		ids, err = s.prov.Provision(ctx, plan.InstanceType.Name, provider.OnDemand, plan.Zone, plan.Count)
	} else if errors.Is(err, provider.ErrInsufficientCapacity) && plan.Market == fleet.Spot {
		s.markSpotShort(ctx, now)
	}
	if err != nil {
		if uerr := s.fleet.unclaim(context.WithoutCancel(ctx), plan.Rentals, sh.EventID); uerr != nil {
			s.log.WarnContext(ctx, "could not give back provisioning claims", "err", uerr)
		}
		return fault.Unavailable("provision %d %s on %s: %w", plan.Count, plan.InstanceType.Name, plan.Market, err)
	}
	recs := make([]provisionedNode, len(ids))
	for i, id := range ids {
		recs[i] = provisionedNode{ID: id, InstanceType: plan.InstanceType.Name, Market: plan.Market,
			Zone: plan.Zone, Pool: poolID, CreatedAt: now}
	}
	if err := s.fleet.addNodes(context.WithoutCancel(ctx), recs); err != nil {
		// The provider still lists them; the next tick finds them there.
		s.log.WarnContext(ctx, "could not record provisioned nodes", "nodes", ids, "err", err)
	}
	s.m.provision.Add(ctx, int64(len(ids)), metric.WithAttributes(attribute.String("shizu.market", string(plan.Market))))
	s.log.InfoContext(ctx, "nodes provisioned", "instance_type", plan.InstanceType.Name, "market", string(plan.Market),
		"zone", plan.Zone, "count", len(ids), "reason", plan.Reason)
	subj, err := subject.Format(subject.ScaleProvisionRequested, poolID)
	if err != nil {
		return fault.Invalid("pool %s: %w", poolID, err)
	}
	m := plan.Market.Proto() // PlanProvision always names a market
	_, err = s.pub.Publish(ctx, subj, &shizuv1.NodeProvisionRequested{
		Meta: &shizuv1.EventMeta{EventId: "provision:" + sh.EventID, OccurredAt: timestamppb.New(now), Source: topology.Autoscaler,
			CausationId: sh.EventID, CorrelationId: poolID},
		PoolId: poolID, InstanceType: plan.InstanceType.Name, Market: m, Zone: plan.Zone,
		Count: int32(len(ids)), Reason: fmt.Sprintf("%s; nodes %v", plan.Reason, ids)})
	return err
}

// fleetNodes are the nodes the autoscaler provisioned: those recorded in
// Redis (by any replica, before any restart) and those the provider lists.
func (s *scaler) fleetNodes(ctx context.Context) ([]provisionedNode, error) {
	recorded, err := s.fleet.nodes(ctx)
	if err != nil {
		return nil, err
	}
	listed, err := s.prov.List(ctx)
	if err != nil {
		return nil, fault.Unavailable("provider list: %w", err)
	}
	out := recorded
	for _, n := range listed {
		if !slices.ContainsFunc(recorded, func(r provisionedNode) bool { return r.ID == n.ID }) {
			out = append(out, provisionedNode{ID: n.ID, InstanceType: n.InstanceType, Market: n.Market, Zone: n.Zone, CreatedAt: n.CreatedAt})
		}
	}
	return out, nil
}

func (s *scaler) fleetSize(ctx context.Context) (int, error) {
	nodes, err := s.fleetNodes(ctx)
	return len(nodes), err
}

// markSpotShort sends every pool with a market mix to on-demand for its
// fallback hold.
func (s *scaler) markSpotShort(ctx context.Context, now time.Time) {
	pools, err := s.allPools(ctx)
	if err != nil {
		s.log.WarnContext(ctx, "could not read the pools declared through the bus", "err", err)
	}
	for _, pool := range pools {
		if pool.MarketMix == nil {
			continue
		}
		err := s.states.update(ctx, pool.ID, func(rec *poolRecord) error {
			rec.State = policy.MarkSpotShort(pool, rec.State, now)
			return nil
		})
		if err != nil {
			s.log.WarnContext(ctx, "could not record the spot shortage", "pool", pool.ID, "err", err)
		}
	}
}

// tickFleet drains idle nodes and releases drained ones. A node is
// released only after a fresh read shows it holds nothing.
func (s *scaler) tickFleet(ctx context.Context, now time.Time) error {
	if s.prov == nil {
		return nil
	}
	nodes, err := s.fleetNodes(ctx)
	if err != nil {
		return err
	}
	views := make([]fleet.NodeView, 0, len(nodes))
	s.mu.Lock()
	busyAt := make(map[string]time.Time, len(s.busyAt))
	for k, v := range s.busyAt {
		busyAt[k] = v
	}
	s.mu.Unlock()
	for _, n := range nodes {
		v := fleet.NodeView{ID: n.ID, CreatedAt: n.CreatedAt}
		st, err := s.caps.Node(ctx, n.ID)
		switch {
		case errors.Is(err, capacity.ErrNotFound):
			v.Status = fleet.Unregistered
		case err != nil:
			return err
		default:
			v.Status, v.Epoch, v.Allocations = fleet.NodeStatus(st.Status), st.Epoch, len(st.Allocations)
		}
		v.Busy = now.Sub(busyAt[n.ID]) < time.Minute
		views = append(views, v)
	}
	s.mu.Lock()
	s.idle = fleet.TrackIdle(s.idle, views, now)
	for i := range views {
		views[i].IdleSince = s.idle[views[i].ID]
	}
	s.mu.Unlock()
	var errs []error
	for _, a := range fleet.PlanRelease(s.file.Fleet, views, now) {
		switch a.Kind {
		case fleet.Drain:
			errs = append(errs, s.drain(ctx, a, now))
		case fleet.Release:
			errs = append(errs, s.release(ctx, a, now))
		}
	}
	return errors.Join(errs...)
}

// drain marks the node draining in the capacity store (so the scheduler
// places nothing more there), commands its agent to drain, and announces
// the release.
func (s *scaler) drain(ctx context.Context, a fleet.Action, now time.Time) error {
	if err := s.caps.SetStatus(ctx, a.Node, capacity.StatusDraining, a.Epoch); err != nil {
		return fmt.Errorf("drain %s: %w", a.Node, err)
	}
	// The drain may race a placement made just before: a node that holds
	// a rental now stays draining until failover or the tenant empties it.
	epoch := int64(a.Epoch)
	id := "cmd:drain:" + a.Node + ":" + strconv.FormatInt(epoch, 10)
	subj, err := subject.Format(subject.AgentCmd, a.Node, "drain")
	if err != nil {
		return fault.Invalid("node %s: %w", a.Node, err)
	}
	if _, err := s.pub.Publish(ctx, subj, &shizuv1.DrainNode{
		Meta:   &shizuv1.EventMeta{EventId: id, OccurredAt: timestamppb.New(now), Source: topology.Autoscaler, CorrelationId: a.Node},
		NodeId: a.Node, Epoch: epoch, Deadline: timestamppb.New(now.Add(10 * time.Minute)), Reason: a.Reason}); err != nil {
		return err
	}
	relSubj, _ := subject.Format(subject.ScaleReleaseRequested, subject.FleetPool)
	_, err = s.pub.Publish(ctx, relSubj, &shizuv1.NodeReleaseRequested{
		Meta: &shizuv1.EventMeta{EventId: "release:" + a.Node + ":" + strconv.FormatInt(epoch, 10), OccurredAt: timestamppb.New(now),
			Source: topology.Autoscaler, CausationId: id, CorrelationId: a.Node},
		PoolId: subject.FleetPool, NodeId: a.Node, Reason: a.Reason})
	s.log.InfoContext(ctx, "node draining", "node", a.Node, "reason", a.Reason)
	return err
}

// release gives a node back once a fresh read shows it holds nothing.
func (s *scaler) release(ctx context.Context, a fleet.Action, now time.Time) error {
	st, err := s.caps.Node(ctx, a.Node)
	registered := err == nil
	if err != nil && !errors.Is(err, capacity.ErrNotFound) {
		return err
	}
	if registered && len(st.Allocations) > 0 {
		return nil // a rental arrived: never release a node in use
	}
	if err := s.prov.Release(ctx, a.Node); err != nil {
		return fmt.Errorf("release %s: %w", a.Node, err)
	}
	if registered {
		if err := s.caps.Remove(ctx, a.Node); err != nil && !errors.Is(err, capacity.ErrNotFound) {
			return fmt.Errorf("forget %s: %w", a.Node, err)
		}
	} else {
		// It never registered, so no drain announced it: announce now.
		relSubj, _ := subject.Format(subject.ScaleReleaseRequested, subject.FleetPool)
		if _, err := s.pub.Publish(ctx, relSubj, &shizuv1.NodeReleaseRequested{
			Meta: &shizuv1.EventMeta{EventId: "release:" + a.Node + ":unregistered", OccurredAt: timestamppb.New(now),
				Source: topology.Autoscaler, CorrelationId: a.Node},
			PoolId: subject.FleetPool, NodeId: a.Node, Reason: a.Reason}); err != nil {
			return err
		}
	}
	if err := s.fleet.removeNode(ctx, a.Node); err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.idle, a.Node)
	delete(s.busyAt, a.Node)
	s.mu.Unlock()
	s.m.release.Add(ctx, 1)
	s.log.InfoContext(ctx, "node released", "node", a.Node, "reason", a.Reason)
	return nil
}

// poolOfRental finds the pool a rental id ("pool-<pool>-<seq>") of tenant
// belongs to.
func (s *scaler) poolOfRental(ctx context.Context, rental, tenant string) (policy.Pool, bool, error) {
	if !strings.HasPrefix(rental, "pool-") {
		return policy.Pool{}, false, nil
	}
	pools, err := s.allPools(ctx)
	if fault.IsUnavailable(err) {
		return policy.Pool{}, false, err // Redis: try again
	}
	for _, p := range pools {
		rest, ok := strings.CutPrefix(rental, "pool-"+p.ID+"-")
		if !ok || p.Tenant != tenant || rest == "" {
			continue
		}
		if _, err := strconv.Atoi(rest); err == nil {
			return p, true, nil
		}
	}
	return policy.Pool{}, false, nil
}

// onRentalRejected forgets a pool replica the scheduler will never run
// (except the ones the autoscaler cancelled itself, already forgotten).
func (s *scaler) onRentalRejected(ctx context.Context, ev *shizuv1.RentalRejected, _ bus.Delivery) error {
	if ev.GetReason() == shizuv1.RejectReason_REJECT_REASON_CANCELLED {
		return nil
	}
	return s.forget(ctx, ev.GetRentalId(), ev.GetTenantId(), "rejected: "+ev.GetReason().String())
}

// onRentalStopped forgets a pool replica whose workload ended by itself;
// a rental stopped to migrate or by a node failure comes back elsewhere.
func (s *scaler) onRentalStopped(ctx context.Context, ev *shizuv1.RentalStopped, _ bus.Delivery) error {
	switch ev.GetExitReason() {
	case shizuv1.ExitReason_EXIT_REASON_COMPLETED, shizuv1.ExitReason_EXIT_REASON_FAILED:
		return s.forget(ctx, ev.GetRentalId(), ev.GetTenantId(), "stopped: "+ev.GetExitReason().String())
	}
	return nil
}

// forget removes a lost replica from its pool, so the next evaluation
// (a sample, or the tick for floors) replaces it if it is still needed.
func (s *scaler) forget(ctx context.Context, rental, tenant, why string) error {
	pool, ok, err := s.poolOfRental(ctx, rental, tenant)
	if err != nil || !ok {
		return err
	}
	return s.states.update(ctx, pool.ID, func(rec *poolRecord) error {
		i := slices.IndexFunc(rec.Rentals, func(r poolRental) bool { return r.ID == rental })
		if i < 0 {
			return errNoChange
		}
		rec.Rentals = slices.Delete(rec.Rentals, i, i+1)
		rec.State.Replicas = len(rec.Rentals)
		s.log.InfoContext(ctx, "pool replica lost", "pool", pool.ID, "rental", rental, "why", why, "replicas", len(rec.Rentals))
		return nil
	})
}
