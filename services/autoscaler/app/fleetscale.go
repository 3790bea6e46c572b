package app

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
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

// Fleet scaling: telemetry marks nodes busy, shortages provision nodes,
// the fleet tick drains and releases idle ones (decided by package fleet).

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
	if !s.ready.Load() {
		return errStateLost
	}
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
