package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/autoscaler/policy"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Losing Redis. The autoscaler's state (pool records with their replicas
// and rental sequence, the pools declared through the bus, the nodes it
// provisioned) lives in Redis, which as shipped keeps nothing on disk.
// Forgotten replicas would be requested again under reused ids (the
// sequence restarts) and the live ones never scaled in. So a marker key (<prefix>:autoscaler:state) is written
// last by each rebuild; a replica looks for it before it starts and then
// every tick, and while it is missing it decides nothing (ticks skip, its
// handlers redeliver) until the state is rebuilt: the declared pools from
// the SCALING stream (onPoolDeclared's checks), each pool's replicas and
// sequence from the RENTALS stream (PoolReplicas). The provisioned nodes
// need no rebuild: the fleet is the recorded nodes together with what the
// provider lists (fleetNodes), so nodes the autoscaler started are still
// counted, drained and released. Not rebuilt, and harmless: the policy state's
// cooldowns and last sample (the next samples set them again), the
// provisioning claims (they expire; a shortage reported again is covered
// by the nodes already listed), and the outbox (events committed with a
// record that is lost too: neither reached the bus).

// errStateLost is what a handler returns while the state is rebuilt:
// transient, so the delivery comes back.
var errStateLost = fmt.Errorf("autoscaler state lost: waiting for its rebuild: %w", fault.ErrUnavailable)

func (s *scaler) markerKey() string { return s.states.prefix + ":autoscaler:state" }
func (s *scaler) lockKey() string   { return s.states.prefix + ":autoscaler:rebuilding" }

// ensureState returns once the state holds what the streams say: at once
// when the marker is there, else after this replica rebuilt it (holding
// the rebuild lock) or another one did.
func (s *scaler) ensureState(ctx context.Context, js jetstream.JetStream) error {
	rdb := s.states.rdb
	if n, err := rdb.Exists(ctx, s.markerKey()).Result(); err != nil || n == 1 {
		s.ready.Store(err == nil)
		return err
	}
	s.ready.Store(false)
	s.log.WarnContext(ctx, "autoscaler state lost (its marker is missing): rebuilding it from the streams")
	var b [8]byte
	_, _ = rand.Read(b[:])
	owner := hex.EncodeToString(b[:])
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if n, err := rdb.Exists(ctx, s.markerKey()).Result(); err != nil || n == 1 {
			s.ready.Store(err == nil)
			return err
		}
		locked, err := rdb.SetNX(ctx, s.lockKey(), owner, 10*time.Minute).Result()
		if err != nil {
			return err
		}
		if locked {
			err := s.rebuildState(ctx, js)
			if cur, _ := rdb.Get(context.WithoutCancel(ctx), s.lockKey()).Result(); cur == owner {
				rdb.Del(context.WithoutCancel(ctx), s.lockKey())
			}
			if err != nil {
				return err
			}
			s.ready.Store(true)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

func (s *scaler) rebuildState(ctx context.Context, js jetstream.JetStream) error {
	pools, err := s.rebuildDeclared(ctx, js)
	if err != nil {
		return err
	}
	replicas := NewPoolReplicas()
	_, err = bus.ScanStream(ctx, js, topology.StreamRentals, subject.RentalAll, func(msg *jetstream.RawStreamMsg) error {
		replicas.Fold(msg.Subject, msg.Data)
		return nil
	})
	if err != nil {
		return err
	}
	states := s.states
	states.marker = "" // the rebuild writes before the marker is back
	for id, rs := range replicas.Pools() {
		decl := pools[id]
		if err := states.update(ctx, id, func(rec *poolRecord) error {
			rec.Seq = max(rec.Seq, rs.Seq)
			rec.Rentals, rec.State.Replicas = rs.Rentals, len(rs.Rentals)
			rec.Withdrawn, rec.DeclSeq = decl.Withdrawn, max(rec.DeclSeq, decl.Seq)
			return nil
		}); err != nil {
			return err
		}
	}
	if err := s.states.rdb.Set(ctx, s.markerKey(), s.now().UTC().Format(time.RFC3339Nano), 0).Err(); err != nil {
		return err
	}
	s.log.WarnContext(ctx, "autoscaler state rebuilt", "declared_pools", len(pools), "pools_with_replicas", len(replicas.Pools()))
	return nil
}

// rebuildDeclared stores every pool declaration of SCALING again, in
// stream order, checked as onPoolDeclared checks them, and returns the
// last stored of each pool.
func (s *scaler) rebuildDeclared(ctx context.Context, js jetstream.JetStream) (map[string]declaredPool, error) {
	out := map[string]declaredPool{}
	_, err := bus.ScanStream(ctx, js, topology.StreamScaling, subject.ScalePoolDeclaredAll, func(msg *jetstream.RawStreamMsg) error {
		var ev shizuv1.PoolDeclared
		if proto.Unmarshal(msg.Data, &ev) != nil || ev.Validate() != nil {
			return nil
		}
		rec, err := s.declaration(&ev, msg.Subject, msg.Sequence)
		if err != nil {
			return nil // dead-lettered by the live consumer
		}
		stale, err := s.declared.put(ctx, ev.GetPoolId(), rec)
		if errors.Is(err, errPoolOwned) || stale {
			return nil
		}
		if err == nil {
			out[ev.GetPoolId()] = rec
		}
		return err
	})
	return out, err
}

// watchState is the state's watch loop body: ensureState, logging a
// failure (the next tick tries again).
func (s *scaler) watchState(js jetstream.JetStream) func(ctx context.Context, _ time.Time) {
	return func(ctx context.Context, _ time.Time) {
		if err := s.ensureState(ctx, js); err != nil && ctx.Err() == nil {
			s.log.ErrorContext(ctx, "autoscaler state recovery failed; retrying", "err", err)
		}
	}
}

// PoolReplicas folds the RENTALS stream into each pool's replicas as the
// live handlers keep them: a RentalRequested the autoscaler published
// (its source) of a pool rental id ("pool-<pool>-<seq>", with the pool
// label) adds it and moves the pool's
// sequence on; the autoscaler's own RentalCancelRequested removes it
// (apply drops a replica when it cancels it), as do a RentalRejected for
// any other reason than a cancel and a RentalStopped whose workload
// completed or failed (onRentalRejected, onRentalStopped).
type PoolReplicas struct {
	pools map[string]*RebuiltPool
	owner map[string]string // rental -> pool
}

// RebuiltPool is one pool's rebuilt replicas (oldest first) and sequence.
type RebuiltPool struct {
	Seq     int
	Rentals []poolRental
}

// NewPoolReplicas is an empty fold.
func NewPoolReplicas() *PoolReplicas {
	return &PoolReplicas{pools: map[string]*RebuiltPool{}, owner: map[string]string{}}
}

// Fold folds one RENTALS message in (others are ignored).
func (p *PoolReplicas) Fold(subj string, data []byte) {
	event, _ := bus.EventOn(subj)
	switch event {
	case bus.EventName(&shizuv1.RentalRequested{}):
		var ev shizuv1.RentalRequested
		if proto.Unmarshal(data, &ev) != nil {
			return
		}
		pool := ev.GetSpec().GetLabels()[PoolLabel]
		seq, ok := poolSeq(ev.GetRentalId(), pool)
		if !ok || ev.GetMeta().GetSource() != topology.Autoscaler {
			return // not a replica the autoscaler requested (apply)
		}
		rp := p.pools[pool]
		if rp == nil {
			rp = &RebuiltPool{}
			p.pools[pool] = rp
		}
		rp.Seq = max(rp.Seq, seq)
		if !slices.ContainsFunc(rp.Rentals, func(r poolRental) bool { return r.ID == ev.GetRentalId() }) {
			market := policy.OnDemand
			if ev.GetSpec().GetPlan() == shizuv1.Plan_PLAN_SPOT {
				market = policy.Spot
			}
			rp.Rentals = append(rp.Rentals, poolRental{ID: ev.GetRentalId(), Seq: seq, Market: market})
			p.owner[ev.GetRentalId()] = pool
		}
	case bus.EventName(&shizuv1.RentalCancelRequested{}):
		var ev shizuv1.RentalCancelRequested
		if proto.Unmarshal(data, &ev) == nil && ev.GetRequestedBy() == topology.Autoscaler {
			p.drop(ev.GetRentalId())
		}
	case bus.EventName(&shizuv1.RentalRejected{}):
		var ev shizuv1.RentalRejected
		if proto.Unmarshal(data, &ev) == nil && ev.GetReason() != shizuv1.RejectReason_REJECT_REASON_CANCELLED {
			p.drop(ev.GetRentalId())
		}
	case bus.EventName(&shizuv1.RentalStopped{}):
		var ev shizuv1.RentalStopped
		if proto.Unmarshal(data, &ev) != nil {
			return
		}
		switch ev.GetExitReason() {
		case shizuv1.ExitReason_EXIT_REASON_COMPLETED, shizuv1.ExitReason_EXIT_REASON_FAILED:
			p.drop(ev.GetRentalId())
		}
	}
}

func (p *PoolReplicas) drop(rental string) {
	pool, ok := p.owner[rental]
	if !ok {
		return
	}
	rp := p.pools[pool]
	rp.Rentals = slices.DeleteFunc(rp.Rentals, func(r poolRental) bool { return r.ID == rental })
	delete(p.owner, rental)
}

// Pools are the rebuilt pools, by id.
func (p *PoolReplicas) Pools() map[string]RebuiltPool {
	out := make(map[string]RebuiltPool, len(p.pools))
	for id, rp := range p.pools {
		out[id] = *rp
	}
	return out
}

// poolSeq is the sequence of a pool rental id "pool-<pool>-<seq>".
func poolSeq(rental, pool string) (int, bool) {
	if pool == "" {
		return 0, false
	}
	rest, ok := strings.CutPrefix(rental, "pool-"+pool+"-")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	return n, err == nil && n > 0
}
