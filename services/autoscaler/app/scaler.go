package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

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

	// ready says the state in Redis holds what the streams say
	// (rebuild.go); while it does not, nothing is decided.
	ready atomic.Bool

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
	if !s.ready.Load() {
		return errStateLost
	}
	pool, ok, err := s.pool(ctx, ev.GetPoolId())
	if err != nil {
		return err
	}
	if !ok {
		if err := intact(ctx, s.states.rdb, s.states.marker); err != nil {
			return err // the pool may be one a lost Redis forgot: redelivered after the rebuild
		}
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
	err := s.change(ctx, pool.ID, func(rec *poolRecord) error {
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
	if err := s.flush(ctx, pool.ID); err != nil {
		s.log.WarnContext(ctx, "publishing a pool's left events failed", "pool", pool.ID, "err", err)
	}
	var added []string
	err := s.change(ctx, pool.ID, func(rec *poolRecord) error {
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

// apply records a changed decision and the rentals it requests or cancels
// in rec's outbox (published once rec is committed: outbox.go), with ids
// derived from the pool's rental sequence, so a retried delivery publishes
// the same ids and the streams deduplicate them.
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
	if err := rec.enqueue(subj, decided); err != nil {
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
		if err := rec.enqueue(rentalSubj, ev); err != nil {
			return err
		}
		rec.Rentals = append(rec.Rentals, poolRental{ID: id, Seq: rec.Seq, Market: d.Market})
	}
	for len(rec.Rentals) > d.To {
		r := rec.Rentals[len(rec.Rentals)-1]
		ev := &shizuv1.RentalCancelRequested{Meta: meta("pool:"+pool.ID+":"+strconv.Itoa(r.Seq)+":cancel", r.ID, decisionID),
			RentalId: r.ID, TenantId: pool.Tenant, RequestedBy: topology.Autoscaler, Reason: "scale-in: " + d.Reason}
		if err := rec.enqueue(cancelSubj, ev); err != nil {
			return err
		}
		rec.Rentals = rec.Rentals[:len(rec.Rentals)-1]
	}
	return nil
}

// BusyUtilizationPercent is the GPU utilization from which a node counts
// as working. Idle GPUs report a few percent (monitoring, the driver's own
// work; the simulated hosts' idle walk reaches 6 %), so anything below it
// does not keep a node from being released.
const BusyUtilizationPercent = 10
