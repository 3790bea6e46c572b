package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/queue"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// Deps are what a Scheduler runs on.
type Deps struct {
	Bus   *bus.Conn
	Store *capacity.Store
	Redis redis.UniversalClient
	Log   *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Metrics may be nil.
	Metrics *Metrics
}

// Scheduler is one replica: it takes rental requests from the bus, places
// them from an in-memory view of the capacity store, commits through the
// store's atomic reserve and publishes the outcome. Several replicas run at
// once on one durable consumer; the store's reserve and the outcome record
// keep them from double booking.
type Scheduler struct {
	cfg    Config
	d      Deps
	rec    records
	placer *placement.Placer
	// catalogue is read by handlers concurrently; never written.
	catalogue placement.Catalogue
	window    *placement.Window
	// in carries requests to the loop, a delivered batch at a time.
	in   chan []*job
	kick chan struct{}
	// changed names nodes the loop should re-read before its next round
	// (a GPU's health changed).
	changed chan string
	// publishing bounds the rounds whose events are still being acked;
	// publishers waits for them at shutdown.
	publishing chan struct{}
	publishers sync.WaitGroup
	source     string
	metrics    *Metrics

	// Owned by the loop goroutine.
	cluster     placement.Cluster
	index       map[string]int
	version     uint64
	refreshedAt time.Time
	stale       map[string]bool
	// lastRetry is the store version the pending set was last tried at;
	// nextDeadline the earliest pending deadline (or preemption notice) then.
	lastRetry    uint64
	nextDeadline time.Time
	// meter keeps the view's fragmentation measure node by node, against
	// the window's workload of generation meterGen.
	meter    placement.FragMeter
	meterGen uint64
	// facts caches each node's nodeFacts, dropped when the node is re-read.
	facts map[string]*nodeFacts

	// fixes are the view changes found off the loop (a reservation given
	// back, one found recorded elsewhere, a migrating rental's release);
	// the loop applies them before it next places.
	fixMu sync.Mutex
	fixes []viewFix
	// claimed is closed once the last round handed off has recorded its
	// outcomes: rounds record in the order they placed (see finishRound).
	claimed chan struct{}
}

// viewFix is a change to the loop's view found after a round left it: the
// rental placed on node in the view is not there in the store, and stale
// (when set) names a node whose view is to be re-read.
type viewFix struct {
	node, rental, stale string
}

// job is one request in a scheduling round.
type job struct {
	ev       *shizuv1.RentalRequested
	r        placement.Request
	enqueued time.Time
	deadline time.Time
	// fromPending: the request was already acknowledged and waits in the
	// pending set; nobody waits on done.
	fromPending  bool
	preemptUntil time.Time
	reason       shizuv1.PendingReason
	done         chan error
	// attempt is the placement number: 1 for a new request, n+1 for a
	// rental failover moves off its node after attempt n.
	attempt int32

	// round state
	placed   placement.Placement
	alloc    capacity.Allocation
	facts    *nodeFacts
	err      error
	outcome  string
	tries    int
	noFit    bool
	received time.Time
}

// New builds a scheduler replica.
func New(cfg Config, d Deps) (*Scheduler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Log == nil {
		d.Log = slog.Default()
	}
	catalogue := placement.DefaultCatalogue()
	pl, err := placement.NewPlacer(placement.Options{Policy: placement.Policy(cfg.Policy), Catalogue: catalogue, MaxCandidates: cfg.MaxCandidates})
	if err != nil {
		return nil, err
	}
	return &Scheduler{
		cfg: cfg, d: d, placer: pl, catalogue: catalogue,
		rec:        records{rdb: d.Redis, prefix: cfg.KeyPrefix, ttl: cfg.OutcomeTTL},
		window:     placement.NewWindow(cfg.WorkloadWindow, max(1, cfg.WorkloadWindow/10)),
		in:         make(chan []*job, cfg.Concurrency/cfg.BatchSize+1),
		kick:       make(chan struct{}, 1),
		changed:    make(chan string, 64),
		publishing: make(chan struct{}, maxPublishing),
		source:     "scheduler",
		metrics:    d.Metrics,
		index:      map[string]int{},
		stale:      map[string]bool{},
		facts:      map[string]*nodeFacts{},
	}, nil
}

// Router returns the handlers of the scheduler's durable consumer.
func (s *Scheduler) Router() *bus.Router {
	r := bus.NewRouter()
	r.Handle(bus.EventName(&shizuv1.RentalRequested{}), s.onRequested)
	r.EventForSubject(subject.RentalRequestedAll, bus.EventName(&shizuv1.RentalRequested{}))
	bus.On(r, s.onCancel)
	bus.On(r, s.onStopped)
	bus.On(r, s.onMigrating)
	bus.On(r, s.onHealth)
	return r
}

// onRequested takes a request delivered on its own (see onBatch).
func (s *Scheduler) onRequested(ctx context.Context, d bus.Delivery) error {
	j, err := s.admit(ctx, d)
	if j == nil {
		return err
	}
	return s.await(ctx, []*job{j})[0]
}

// admit decodes a request: a spec that fails validation is rejected at
// once with the reason, and admit returns no job and the error that
// decides the delivery (a request whose ids are unusable is
// dead-lettered); anything else becomes a job for the next round.
func (s *Scheduler) admit(ctx context.Context, d bus.Delivery) (*job, error) {
	ev := &shizuv1.RentalRequested{}
	if err := proto.Unmarshal(d.Data, ev); err != nil {
		return nil, fault.Invalid("decode RentalRequested: %v", err)
	}
	if err := ev.Validate(); err != nil {
		if !headerValid(ev) {
			return nil, fault.Invalid("RentalRequested: %v", err)
		}
		return nil, s.rejectNow(ctx, ev, 1, shizuv1.RejectReason_REJECT_REASON_INVALID_SPEC, err.Error())
	}
	r := requestOf(ev)
	if err := r.Validate(s.catalogue); err != nil {
		return nil, s.rejectNow(ctx, ev, 1, shizuv1.RejectReason_REJECT_REASON_INVALID_SPEC, err.Error())
	}
	return s.newJob(ev, r, 1), nil
}

func (s *Scheduler) newJob(ev *shizuv1.RentalRequested, r placement.Request, attempt int32) *job {
	enq := ev.GetMeta().GetOccurredAt().AsTime()
	return &job{ev: ev, r: r, enqueued: enq, deadline: enq.Add(s.cfg.PendingTimeout), done: make(chan error, 1),
		received: s.d.Now(), attempt: attempt}
}

// onBatch handles a batch of deliveries of one consumer: its requests go
// to the loop together (one round places them all, or a few rounds when
// the loop merges batches), every other event to its handler in the
// router, concurrently. Each delivery's outcome is its handler's error,
// or for a request nil once its outcome is published.
//
// Acking a batch together keeps every guarantee of acking one by one: a
// request is acknowledged only after its outcome is recorded (SET NX) and
// its events are stored, and a redelivery (an ack lost in a crash) finds
// the recorded outcome and the store's idempotent reserve, so it
// republishes the same events under the same ids, which the stream
// deduplicates.
func (s *Scheduler) onBatch(router *bus.Router) bus.BatchHandlerFunc {
	requested := bus.EventName(&shizuv1.RentalRequested{})
	return func(ctx context.Context, ds []bus.Delivery) []error {
		errs := make([]error, len(ds))
		jobs := make([]*job, 0, len(ds))
		at := make([]int, 0, len(ds))
		var others sync.WaitGroup
		for i, d := range ds {
			event, h := router.Lookup(d)
			switch {
			case event == requested:
				j, err := s.admit(ctx, d)
				if j == nil {
					errs[i] = err
					continue
				}
				jobs, at = append(jobs, j), append(at, i)
			case h != nil:
				others.Go(func() { errs[i] = h(ctx, d) })
			}
		}
		for k, err := range s.await(ctx, jobs) {
			errs[at[k]] = err
		}
		others.Wait()
		return errs
	}
}

// await hands jobs to the loop and returns each one's outcome once it is
// published.
func (s *Scheduler) await(ctx context.Context, jobs []*job) []error {
	errs := make([]error, len(jobs))
	if len(jobs) == 0 {
		return errs
	}
	select {
	case s.in <- jobs:
	case <-ctx.Done():
		for i := range errs {
			errs[i] = ctx.Err()
		}
		return errs
	}
	for i, j := range jobs {
		select {
		case errs[i] = <-j.done:
		case <-ctx.Done():
			errs[i] = ctx.Err()
		}
	}
	return errs
}

// submit hands one request to the next scheduling round and waits until
// its outcome is published.
func (s *Scheduler) submit(ctx context.Context, ev *shizuv1.RentalRequested, r placement.Request, attempt int32) error {
	return s.await(ctx, []*job{s.newJob(ev, r, attempt)})[0]
}

// headerValid reports whether a request's envelope and ids are usable to
// answer it (its spec aside).
func headerValid(ev *shizuv1.RentalRequested) bool {
	probe := &shizuv1.RentalRequested{Meta: ev.GetMeta(), RentalId: ev.GetRentalId(), TenantId: ev.GetTenantId(),
		Spec: &shizuv1.RentalSpec{GpuCount: 1, MilliGpu: 1000, Plan: shizuv1.Plan_PLAN_ON_DEMAND}}
	return probe.Validate() == nil
}

// rejectNow records and publishes a rejection for a request that never
// reached a round.
func (s *Scheduler) rejectNow(ctx context.Context, ev *shizuv1.RentalRequested, attempt int32, reason shizuv1.RejectReason, msg string) error {
	got, err := s.rec.claim(ctx, []string{claimKey(ev.GetRentalId(), attempt)}, outcomeRejected, nil, nil)
	if err != nil {
		return err
	}
	if got[0].Outcome != outcomeRejected {
		return nil // already decided otherwise
	}
	b := s.d.Bus.NewBatch()
	if err := s.queueRejected(ctx, b, ev, reason, msg); err != nil {
		return err
	}
	_, err = b.Wait(ctx)
	s.metrics.outcome(ctx, "rejected")
	return err
}

func (s *Scheduler) queueRejected(ctx context.Context, b *bus.Batch, ev *shizuv1.RentalRequested, reason shizuv1.RejectReason, msg string) error {
	subj, err := subject.Format(subject.RentalRejected, ev.GetTenantId())
	if err != nil {
		return fault.Invalid("%v", err)
	}
	return b.Publish(ctx, subj, &shizuv1.RentalRejected{
		Meta:     meta("rental:"+ev.GetRentalId()+":rejected", s.source, ev.GetMeta(), ev.GetRentalId(), s.d.Now()),
		RentalId: ev.GetRentalId(), TenantId: ev.GetTenantId(), Reason: reason, Message: truncate(msg, 1000),
	})
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// onCancel ends a rental the tenant cancelled: not placed yet, it is
// rejected (REJECT_REASON_CANCELLED); placed, its node agent is told to
// stop it, and its capacity comes back with RentalStopped.
func (s *Scheduler) onCancel(ctx context.Context, ev *shizuv1.RentalCancelRequested, _ bus.Delivery) error {
	got, err := s.rec.claim(ctx, []string{ev.GetRentalId()}, outcomeCancelled, nil, nil)
	if err != nil {
		return err
	}
	b := s.d.Bus.NewBatch()
	switch got[0].Outcome {
	case outcomeCancelled:
		subj, err := subject.Format(subject.RentalRejected, ev.GetTenantId())
		if err != nil {
			return fault.Invalid("%v", err)
		}
		if err := b.Publish(ctx, subj, &shizuv1.RentalRejected{
			Meta:     meta("rental:"+ev.GetRentalId()+":rejected", s.source, ev.GetMeta(), ev.GetRentalId(), s.d.Now()),
			RentalId: ev.GetRentalId(), TenantId: ev.GetTenantId(), Reason: shizuv1.RejectReason_REJECT_REASON_CANCELLED,
			Message: "cancelled before it was placed",
		}); err != nil {
			return err
		}
	case outcomeScheduled:
		a, err := s.d.Store.Allocation(ctx, ev.GetRentalId())
		if capacity.IsNotFound(err) {
			// Stopped and released, or between two attempts: failover
			// released the lost run and the next one is not placed yet.
			// Its outcome is claimed as cancelled, so that placement gives
			// its reservation back instead of starting it.
			return s.cancelNextAttempt(ctx, ev)
		}
		if err != nil {
			return err
		}
		subj, err := subject.Format(subject.AgentCmd, a.NodeID, "stop")
		if err != nil {
			return fault.Invalid("%v", err)
		}
		attempt, err := s.rec.currentAttempt(ctx, ev.GetRentalId())
		if err != nil {
			return err
		}
		if err := b.Publish(ctx, subj, &shizuv1.StopRental{
			Meta:     meta(fmt.Sprintf("cmd:stop:%s:%d", ev.GetRentalId(), attempt), s.source, ev.GetMeta(), ev.GetRentalId(), s.d.Now()),
			RentalId: ev.GetRentalId(), TenantId: ev.GetTenantId(), NodeId: a.NodeID, Attempt: attempt,
			Reason: shizuv1.ExitReason_EXIT_REASON_CANCELLED, GracePeriod: durationpb.New(30 * time.Second),
		}); err != nil {
			return err
		}
	default:
		return nil // rejected already
	}
	_, err = b.Wait(ctx)
	return err
}

// cancelNextAttempt records a cancel for the attempt after a rental's
// current one. When the rental was being moved, the tenant hears the
// rental is cancelled; when it had stopped, nothing will ever place that
// attempt and the record only expires.
func (s *Scheduler) cancelNextAttempt(ctx context.Context, ev *shizuv1.RentalCancelRequested) error {
	attempt, err := s.rec.currentAttempt(ctx, ev.GetRentalId())
	if err != nil {
		return err
	}
	got, err := s.rec.claim(ctx, []string{claimKey(ev.GetRentalId(), attempt+1)}, outcomeCancelled, nil, nil)
	if err != nil || !got[0].Won {
		return err
	}
	moving, err := s.rec.placed(ctx, ev.GetRentalId())
	if err != nil || !moving {
		return err
	}
	subj, err := subject.Format(subject.RentalRejected, ev.GetTenantId())
	if err != nil {
		return fault.Invalid("%v", err)
	}
	_, err = s.d.Bus.Publish(ctx, subj, &shizuv1.RentalRejected{
		Meta:     meta("rental:"+ev.GetRentalId()+":rejected", s.source, ev.GetMeta(), ev.GetRentalId(), s.d.Now()),
		RentalId: ev.GetRentalId(), TenantId: ev.GetTenantId(), Reason: shizuv1.RejectReason_REJECT_REASON_CANCELLED,
		Message: "cancelled while being moved to another node",
	})
	return err
}

// onStopped gives a stopped rental's capacity back (only the allocation on
// the node that reports the stop: a rental re-placed elsewhere keeps its
// new one), then wakes the pending requests.
func (s *Scheduler) onStopped(ctx context.Context, ev *shizuv1.RentalStopped, _ bus.Delivery) error {
	a, err := s.d.Store.Allocation(ctx, ev.GetRentalId())
	if capacity.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if a.NodeID != ev.GetNodeId() {
		return nil
	}
	// A rental moved off a failed GPU may land on the same node again: the
	// old run's stop must not release the new placement.
	if newer, err := s.rec.placedAfter(ctx, ev.GetRentalId(), max(ev.GetAttempt(), 1)); err != nil {
		return err
	} else if newer {
		return nil
	}
	if _, err := s.d.Store.Release(ctx, ev.GetRentalId()); err != nil {
		return err
	}
	if err := s.rec.forget(ctx, ev.GetRentalId()); err != nil {
		return err
	}
	select {
	case s.kick <- struct{}{}:
	default:
	}
	return nil
}

// onHealth records a GPU's reported health in the capacity store, so that
// every replica stops placing on a degraded or failed GPU (the store's
// reserve refuses it too) and places on it again once it is reported
// healthy. A failed node as a whole (gpu_index -1) is failover's: it
// fences the node. Reports about an older registration change nothing.
func (s *Scheduler) onHealth(ctx context.Context, ev *shizuv1.NodeHealthChanged, _ bus.Delivery) error {
	if ev.GetGpuIndex() < 0 {
		return nil
	}
	var h capacity.GPUHealth
	switch ev.GetHealth() {
	case shizuv1.Health_HEALTH_HEALTHY:
		h = capacity.HealthHealthy
	case shizuv1.Health_HEALTH_DEGRADED:
		h = capacity.HealthDegraded
	case shizuv1.Health_HEALTH_FAILED:
		h = capacity.HealthFailed
	default:
		return fault.Invalid("NodeHealthChanged: health %v", ev.GetHealth())
	}
	if ev.GetEpoch() < 1 {
		return fault.Invalid("NodeHealthChanged: epoch %d", ev.GetEpoch())
	}
	changed, err := s.d.Store.SetGPUHealth(ctx, ev.GetNodeId(), uint64(ev.GetEpoch()), int(ev.GetGpuIndex()), h)
	switch {
	case capacity.IsNotFound(err), capacity.IsFenced(err):
		return nil // gone, or about an older registration
	case capacity.IsInvalid(err):
		return fault.Invalid("%v", err)
	case err != nil:
		return err
	}
	if changed {
		s.d.Log.InfoContext(ctx, "GPU health changed", "node", ev.GetNodeId(), "gpu", ev.GetGpuIndex(), "health", string(h))
	}
	select {
	case s.changed <- ev.GetNodeId():
	default: // the loop is busy; the store refuses the GPU meanwhile
	}
	if h == capacity.HealthHealthy && changed {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// maxPublishing is how many rounds may await their acks at once.
const maxPublishing = 4

// Run is the scheduling loop; it returns when ctx ends, once the events of
// every round are acknowledged.
func (s *Scheduler) Run(ctx context.Context) {
	tick := time.NewTicker(s.cfg.PendingRetry)
	defer tick.Stop()
	defer s.publishers.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case jobs := <-s.in:
			batch := append(make([]*job, 0, max(len(jobs), s.cfg.BatchSize)), jobs...)
		fill:
			for len(batch) < s.cfg.BatchSize {
				select {
				case jobs := <-s.in:
					batch = append(batch, jobs...)
				default:
					break fill
				}
			}
			for start := 0; start < len(batch); start += s.cfg.BatchSize {
				s.round(ctx, batch[start:min(len(batch), start+s.cfg.BatchSize)])
			}
		case id := <-s.changed:
			if err := s.refreshNode(ctx, id); err != nil {
				s.d.Log.WarnContext(ctx, "refresh node", "node", id, "err", err)
			}
		case <-tick.C:
			s.retryPending(ctx, false)
		case <-s.kick:
			s.retryPending(ctx, true)
		}
	}
}

// refresh reads the whole store into the in-memory view.
func (s *Scheduler) refresh(ctx context.Context) error {
	snap, err := s.d.Store.Snapshot(ctx)
	if err != nil {
		return err
	}
	var ids []string
	for i := range snap.Nodes {
		for _, a := range snap.Nodes[i].Allocations {
			ids = append(ids, a.RentalID)
		}
	}
	classes, err := s.rec.classes(ctx, ids)
	if err != nil {
		return err
	}
	s.cluster.Nodes = s.cluster.Nodes[:0]
	clear(s.index)
	for i := range snap.Nodes {
		s.index[snap.Nodes[i].ID] = len(s.cluster.Nodes)
		s.cluster.Nodes = append(s.cluster.Nodes, nodeOf(&snap.Nodes[i], classes))
	}
	s.version, s.refreshedAt = snap.Version, s.d.Now()
	clear(s.stale)
	clear(s.facts)
	s.meter.Reset(&s.cluster, s.window.Workload())
	s.meterGen = s.window.Generation()
	s.metrics.fragmentation(s.meter.Stats())
	s.metrics.refreshed(ctx)
	return nil
}

// refreshNode re-reads one node after a refused reserve.
func (s *Scheduler) refreshNode(ctx context.Context, id string) error {
	st, err := s.d.Store.Node(ctx, id)
	i, known := s.index[id]
	if capacity.IsNotFound(err) {
		if known {
			s.cluster.Nodes[i].Ready = false
		}
		return nil
	}
	if err != nil {
		return err
	}
	var ids []string
	for _, a := range st.Allocations {
		ids = append(ids, a.RentalID)
	}
	classes, err := s.rec.classes(ctx, ids)
	if err != nil {
		return err
	}
	n := nodeOf(&st, classes)
	delete(s.facts, id)
	if known {
		s.cluster.Nodes[i] = n
	} else {
		i = len(s.cluster.Nodes)
		s.index[id] = i
		s.cluster.Nodes = append(s.cluster.Nodes, n)
	}
	s.meter.Update(&s.cluster, i)
	return nil
}

// ensureFresh refreshes the view when the store moved and the view is
// older than SnapshotMaxAge (or at once with force).
func (s *Scheduler) ensureFresh(ctx context.Context, force bool) error {
	if s.refreshedAt.IsZero() {
		return s.refresh(ctx)
	}
	if !force && s.d.Now().Sub(s.refreshedAt) < s.cfg.SnapshotMaxAge {
		return nil
	}
	v, err := s.d.Store.Version(ctx)
	if err != nil {
		return err
	}
	if v == s.version {
		return nil
	}
	return s.refresh(ctx)
}

// retryPending runs a round over the pending set when capacity may have
// freed (the store moved) or a deadline may have passed.
func (s *Scheduler) retryPending(ctx context.Context, kicked bool) {
	v, err := s.d.Store.Version(ctx)
	if err != nil {
		s.d.Log.WarnContext(ctx, "read store version", "err", err)
		return
	}
	now := s.d.Now()
	if v == s.lastRetry && !kicked && now.Before(s.nextDeadline) {
		return // nothing freed and no deadline passed: skip reading the set
	}
	entries, bad, err := s.rec.pending(ctx)
	if err != nil {
		s.d.Log.WarnContext(ctx, "read pending requests", "err", err)
		return
	}
	if len(bad) > 0 {
		s.d.Log.ErrorContext(ctx, "dropping undecodable pending entries", "count", len(bad))
		_ = s.rec.dropPending(ctx, bad...)
	}
	s.lastRetry = v
	s.nextDeadline = now.Add(s.cfg.PendingTimeout)
	var jobs []*job
	for _, e := range entries {
		enq := e.ev.GetMeta().GetOccurredAt().AsTime()
		j := &job{ev: e.ev, r: requestOf(e.ev), enqueued: enq, deadline: enq.Add(s.cfg.PendingTimeout),
			fromPending: true, preemptUntil: e.PreemptUntil, reason: shizuv1.PendingReason(e.Reason), done: make(chan error, 1),
			attempt: max(e.Attempt, 1)}
		if j.deadline.Before(s.nextDeadline) {
			s.nextDeadline = j.deadline
		}
		if !e.PreemptUntil.IsZero() && now.Before(e.PreemptUntil) && e.PreemptUntil.Before(s.nextDeadline) {
			s.nextDeadline = e.PreemptUntil
		}
		jobs = append(jobs, j)
	}
	for start := 0; start < len(jobs); start += s.cfg.BatchSize {
		s.round(ctx, jobs[start:min(len(jobs), start+s.cfg.BatchSize)])
	}
}

// maxPasses bounds how often one round re-places requests whose reserve
// was refused (another replica took the capacity first).
const maxPasses = 4

// round places a batch of requests: order them (level one), place each on
// the in-memory view (level two), commit the reservations in parallel,
// re-place the refused ones on fresh node state, record the outcomes, and
// publish. Each job's done gets nil once its outcome is published, or the
// error that should redeliver it.
func (s *Scheduler) round(ctx context.Context, batch []*job) {
	// A rental asked for twice in one round (a redelivery) is placed once
	// here; its copies follow in a round of their own, which finds its
	// reservation and its recorded outcome.
	batch, again := firstOfEach(batch)
	if len(again) > 0 {
		defer s.round(ctx, again)
	}
	start := s.d.Now()
	s.applyFixes()
	if err := s.ensureFresh(ctx, false); err != nil {
		finish(batch, err)
		return
	}
	s.order(batch, start)
	for _, j := range batch {
		if !j.fromPending {
			s.window.Add(placement.ShapeOf(&j.r))
		}
	}
	w := s.window.Workload()
	s.placer.SetWorkload(&w)
	if g := s.window.Generation(); g != s.meterGen {
		s.meter.Reset(&s.cluster, w)
		s.meterGen = g
	}
	defer func() { s.metrics.fragmentation(s.meter.Stats()) }()

	todo := batch
	var placed, noFit []*job
	refreshed := false
	for pass := 0; pass < maxPasses && len(todo) > 0; pass++ {
		// Each chunk of commitChunk placements is reserved while the next
		// chunk is being placed.
		var commit []*job
		cm := s.startCommit(ctx)
		chunk := 0
		for _, j := range todo {
			p, err := s.placer.Place(&s.cluster, &j.r)
			switch {
			case err == nil:
				j.placed = p
				k := s.index[p.NodeID]
				s.cluster.Nodes[k].Apply(&j.r, p, start)
				s.meter.Update(&s.cluster, k)
				commit = append(commit, j)
				if len(commit)-chunk == commitChunk {
					cm.send(commit[chunk:])
					chunk = len(commit)
				}
			case errors.Is(err, placement.ErrNoFit):
				j.noFit = true
				noFit = append(noFit, j)
			default:
				j.err = fault.Invalid("%v", err)
				placed = append(placed, j) // finished with an error
			}
		}
		todo = nil
		cm.send(commit[chunk:])
		cm.wait()
		for _, j := range commit {
			switch {
			case j.err == nil:
				placed = append(placed, j)
			case capacity.IsInsufficient(j.err) || capacity.IsFenced(j.err) || capacity.IsConflict(j.err) || capacity.IsNotFound(j.err):
				s.metrics.conflict(ctx)
				s.removeLocal(j.placed.NodeID, j.r.ID)
				s.stale[j.placed.NodeID] = true
				j.err = nil
				todo = append(todo, j)
			default:
				placed = append(placed, j) // transient: redeliver
			}
		}
		for id := range s.stale {
			if err := s.refreshNode(ctx, id); err != nil {
				s.d.Log.WarnContext(ctx, "refresh node", "node", id, "err", err)
			}
			delete(s.stale, id)
		}
		// Requests that found no room while the store moved get one more
		// pass on a fresh view.
		if len(todo) == 0 && len(noFit) > 0 && !refreshed && pass < maxPasses-1 {
			refreshed = true
			if v, err := s.d.Store.Version(ctx); err == nil && v != s.version {
				if err := s.refresh(ctx); err == nil {
					todo, noFit = noFit, nil
					for _, j := range todo {
						j.noFit = false
					}
				}
			}
		}
	}
	for _, j := range todo { // still refused after maxPasses: try again later
		j.err = fault.Unavailable("placement of %s refused %d times; retrying", j.r.ID, maxPasses)
		placed = append(placed, j)
	}
	s.finishRound(ctx, placed, noFit, start)
}

// firstOfEach splits a batch into the first job of each placement (rental
// and attempt) and the repeats.
func firstOfEach(batch []*job) (first, again []*job) {
	type key struct {
		rental  string
		attempt int32
	}
	seen := make(map[key]bool, len(batch))
	first = batch[:0:len(batch)]
	for _, j := range batch {
		k := key{j.r.ID, max(j.attempt, 1)}
		if seen[k] {
			again = append(again, j)
			continue
		}
		seen[k] = true
		first = append(first, j)
	}
	return first, again
}

// order sorts a batch by the level-one queue order.
func (s *Scheduler) order(batch []*job, now time.Time) {
	items := make([]queue.Item, len(batch))
	for i, j := range batch {
		items[i] = queue.Item{ID: j.r.ID, Tenant: j.r.Tenant, Class: j.r.Class, Priority: j.r.Priority, Enqueued: j.enqueued, Value: j}
	}
	queue.Order(items, now, queue.Options{AgingStep: s.cfg.AgingStep})
	for i, it := range items {
		batch[i] = it.Value.(*job)
	}
}

// commitChunk is how many reserves one pipeline carries.
const commitChunk = 64

// committer reserves chunks of placed jobs in the store while the loop
// places the next ones: each chunk is one capacity.Store.ReserveMany
// pipeline (its reserves run in round order), up to CommitWorkers
// pipelines at once. The loop must not touch a sent job's alloc, err or
// tries until wait returns.
type committer struct {
	s       *Scheduler
	ctx     context.Context
	chunks  chan []*job
	workers int
	wg      sync.WaitGroup
}

func (s *Scheduler) startCommit(ctx context.Context) *committer {
	return &committer{s: s, ctx: ctx, chunks: make(chan []*job, s.cfg.BatchSize/commitChunk+1)}
}

// send queues a chunk, starting a worker while fewer than CommitWorkers
// run.
func (c *committer) send(chunk []*job) {
	if len(chunk) == 0 {
		return
	}
	if c.workers < c.s.cfg.CommitWorkers {
		c.workers++
		c.wg.Go(c.work)
	}
	c.chunks <- chunk
}

func (c *committer) work() {
	ps := make([]capacity.Placement, 0, commitChunk)
	for chunk := range c.chunks {
		ps = ps[:0]
		for _, j := range chunk {
			j.tries++
			ps = append(ps, placementOf(&j.r, j.placed))
		}
		for i, r := range c.s.d.Store.ReserveMany(c.ctx, ps) {
			chunk[i].alloc, chunk[i].err = r.Allocation, r.Err
		}
	}
}

// wait returns once every sent chunk is reserved (or refused).
func (c *committer) wait() {
	close(c.chunks)
	c.wg.Wait()
}

// finishRound decides for the requests that found no room (on the loop:
// it reads the view), then records the placed ones' outcomes and
// publishes off the loop, so the next round places while this one's
// outcomes are being recorded and its events stored; at most
// maxPublishing rounds at once. What that finds about the view (a
// reservation given back, one recorded elsewhere) comes back as fixes.
func (s *Scheduler) finishRound(ctx context.Context, placed, noFit []*job, now time.Time) {
	b := s.d.Bus.NewBatch()
	var ok []*job
	for _, j := range placed {
		if j.err == nil {
			j.facts = s.factsFor(j.alloc.NodeID)
			ok = append(ok, j)
		}
	}
	s.handleNoFit(ctx, b, noFit, now)
	// Rounds record their outcomes in the order they placed: a repeat of
	// a request placed one round earlier finds that reservation (Existing)
	// and must find its outcome recorded too, or it would take the
	// outcome and the earlier round, seeing the outcome taken by another,
	// would give back the one reservation both announce.
	prev, mine := s.claimed, make(chan struct{})
	s.claimed = mine
	s.publishing <- struct{}{}
	s.publishers.Go(func() {
		defer func() { <-s.publishing }()
		if prev != nil {
			<-prev
		}
		fixes := s.recordScheduled(ctx, b, ok, now)
		close(mine)
		s.postFixes(fixes...)
		_, err := b.Wait(ctx)
		for _, j := range append(placed, noFit...) {
			if j.err == nil {
				j.err = err
			}
			if j.err != nil && !fault.IsInvalid(j.err) {
				s.d.Log.WarnContext(ctx, "scheduling failed; the request is retried", "rental", j.r.ID, "err", j.err)
			}
			if j.outcome == outcomeScheduled && j.err == nil {
				s.metrics.latency(ctx, j, s.d.Now())
			}
			j.done <- j.err
		}
	})
}

// recordScheduled records the outcome of reserved requests and queues
// their events. Where another replica or a cancel decided first, it gives
// the capacity back. It runs off the loop: it reads only the jobs and
// their nodeFacts, and returns the fixes for the loop's view.
func (s *Scheduler) recordScheduled(ctx context.Context, b *bus.Batch, ok []*job, now time.Time) []viewFix {
	if len(ok) == 0 {
		return nil
	}
	ids := make([]string, len(ok))
	allocs := make([]string, len(ok))
	classes := make([]classRecord, len(ok))
	for i, j := range ok {
		ids[i], allocs[i], classes[i] = claimKey(j.r.ID, j.attempt), allocToken(j.alloc), classRecord{j.r.Class, j.r.Priority}
	}
	outcomes, err := s.rec.claim(ctx, ids, outcomeScheduled, allocs, classes)
	if err != nil {
		for _, j := range ok {
			j.err = err
		}
		return nil
	}
	var fixes []viewFix
	for i, j := range ok {
		j.outcome = outcomes[i].Outcome
		if !keepReservation(outcomes[i], j.alloc) {
			j.outcome = ""
			if _, rerr := s.d.Store.Release(ctx, j.r.ID); rerr != nil {
				j.err = rerr
			}
			fixes = append(fixes, viewFix{node: j.placed.NodeID, rental: j.r.ID})
			continue
		}
		if j.alloc.Existing {
			// Placed before (a redelivery, or another replica): publish
			// what the store recorded; the view is fixed on next refresh.
			fixes = append(fixes, viewFix{node: j.placed.NodeID, rental: j.r.ID, stale: j.alloc.NodeID})
		}
		sched := scheduledOf(j.ev, j.alloc, j.facts, max(j.attempt, 1), s.source, now)
		if j.err = s.queueScheduled(ctx, b, sched); j.err != nil {
			continue
		}
		if outcomes[i].Won { // a redelivery publishes again but is not a new outcome
			s.metrics.outcome(ctx, "scheduled")
		}
	}
	return fixes
}

// keepReservation says whether a reservation stays after its outcome
// claim. It is given back when another outcome was recorded first (a
// cancel, a timeout), and when this is a redelivery of a rental scheduled
// before whose allocation is gone (it ran and stopped): the new reservation
// must not outlive it. A scheduled outcome that names this very allocation
// is another replica's announcement of it (that replica got this
// reservation back as Existing and recorded first): it stays, it is the
// one the rental runs on.
func keepReservation(c claimed, a capacity.Allocation) bool {
	switch {
	case c.Outcome != outcomeScheduled:
		return false
	case c.Won:
		return true
	case c.Alloc == "": // recorded before outcomes named their allocation
		return a.Existing
	default:
		// An Existing allocation carries the stored creation time, so a
		// true redelivery matches; one reserved after the announced
		// allocation was released does not, Existing or not.
		return c.Alloc == allocToken(a)
	}
}

// postFixes queues fixes for the loop's view; any goroutine may post.
func (s *Scheduler) postFixes(fixes ...viewFix) {
	if len(fixes) == 0 {
		return
	}
	s.fixMu.Lock()
	s.fixes = append(s.fixes, fixes...)
	s.fixMu.Unlock()
}

// applyFixes takes into the view what the rounds being published found.
func (s *Scheduler) applyFixes() {
	s.fixMu.Lock()
	fixes := s.fixes
	s.fixes = nil
	s.fixMu.Unlock()
	for _, f := range fixes {
		s.removeLocal(f.node, f.rental)
		if f.stale != "" {
			s.stale[f.stale] = true
		}
	}
}

// factsFor is the nodeFacts of a node in the view (nil when it is not in
// the view).
func (s *Scheduler) factsFor(id string) *nodeFacts {
	if f, ok := s.facts[id]; ok {
		return f
	}
	k, ok := s.index[id]
	if !ok {
		return nil
	}
	f := factsOf(&s.cluster.Nodes[k])
	s.facts[id] = f
	return f
}

func (s *Scheduler) queueScheduled(ctx context.Context, b *bus.Batch, sched *shizuv1.RentalScheduled) error {
	subj, err := subject.Format(subject.RentalScheduled, sched.GetTenantId())
	if err != nil {
		return fault.Invalid("%v", err)
	}
	if err := b.Publish(ctx, subj, sched); err != nil {
		return err
	}
	cmdSubj, err := subject.Format(subject.AgentCmd, sched.GetNodeId(), "start")
	if err != nil {
		return fault.Invalid("%v", err)
	}
	return b.Publish(ctx, cmdSubj, &shizuv1.StartRental{
		Meta:      meta(fmt.Sprintf("cmd:start:%s:%d", sched.GetRentalId(), sched.GetAttempt()), s.source, sched.GetMeta(), sched.GetRentalId(), sched.GetMeta().GetOccurredAt().AsTime()),
		Scheduled: sched,
	})
}

// handleNoFit decides for requests that fit nowhere: past the deadline,
// rejected; an on-demand or reserved request that evicting spot rentals
// makes fit, preemption; otherwise pending with a capacity shortage.
func (s *Scheduler) handleNoFit(ctx context.Context, b *bus.Batch, jobs []*job, now time.Time) {
	// A request decided already (a duplicate delivery of a rental
	// scheduled, rejected or cancelled meanwhile) is not pending: nothing
	// to say.
	keys := make([]string, len(jobs))
	for i, j := range jobs {
		keys[i] = claimKey(j.r.ID, j.attempt)
	}
	decided, err := s.rec.decided(ctx, keys)
	if err != nil {
		for _, j := range jobs {
			j.err = err
		}
		return
	}
	var expired []*job
	var pending []pendingEntry
	for i, j := range jobs {
		if decided[i] {
			continue
		}
		if now.After(j.deadline) {
			expired = append(expired, j)
			continue
		}
		reason := shizuv1.PendingReason_PENDING_REASON_NO_CAPACITY
		preemptUntil := j.preemptUntil
		if now.Before(j.preemptUntil) {
			reason = shizuv1.PendingReason_PENDING_REASON_AWAITING_PREEMPTION
		} else if plan, ok := s.placer.PlanPreemption(&s.cluster, &j.r, now); ok {
			if err := s.queuePreemption(ctx, b, j, plan, now); err != nil {
				j.err = err
				continue
			}
			reason = shizuv1.PendingReason_PENDING_REASON_AWAITING_PREEMPTION
			preemptUntil = now.Add(2 * s.cfg.PreemptionNotice)
		}
		if j.fromPending && reason == j.reason && preemptUntil.Equal(j.preemptUntil) {
			continue // nothing new to say
		}
		raw, err := proto.Marshal(j.ev)
		if err != nil {
			j.err = fault.Invalid("encode request: %v", err)
			continue
		}
		pending = append(pending, pendingEntry{Request: raw, Reason: int32(reason), PreemptUntil: preemptUntil, Attempt: j.attempt, ev: j.ev})
		if s.nextDeadline.IsZero() || j.deadline.Before(s.nextDeadline) {
			s.nextDeadline = j.deadline
		}
		missing := s.placer.Shortage(&s.cluster, &j.r)
		vec := vectorOf(&j.r, missing)
		if err := s.queuePending(ctx, b, j, reason, vec, now); err != nil {
			j.err = err
			continue
		}
		s.metrics.outcome(ctx, "pending")
	}
	if err := s.rec.putPending(ctx, pending); err != nil {
		for _, j := range jobs {
			j.err = err
		}
		return
	}
	if len(expired) == 0 {
		return
	}
	ids := make([]string, len(expired))
	for i, j := range expired {
		ids[i] = claimKey(j.r.ID, j.attempt)
	}
	got, err := s.rec.claim(ctx, ids, outcomeRejected, nil, nil)
	if err != nil {
		for _, j := range expired {
			j.err = err
		}
		return
	}
	for i, j := range expired {
		if got[i].Outcome != outcomeRejected {
			continue
		}
		msg := fmt.Sprintf("no capacity for %s within %s", describe(&j.r), s.cfg.PendingTimeout)
		j.err = s.queueRejected(ctx, b, j.ev, shizuv1.RejectReason_REJECT_REASON_PENDING_TIMEOUT, msg)
		s.metrics.outcome(ctx, "rejected")
	}
}

func describe(r *placement.Request) string {
	s := fmt.Sprintf("%d GPU(s) of %d milli", r.GPUCount, r.MilliPerGPU)
	if r.NVLink {
		s += " over NVLink"
	}
	if r.MIGProfile != "" {
		s += " as MIG " + r.MIGProfile
	}
	if len(r.Models) > 0 {
		s += fmt.Sprintf(" of %v", r.Models)
	}
	return s
}

func (s *Scheduler) queuePending(ctx context.Context, b *bus.Batch, j *job, reason shizuv1.PendingReason, vec *shizuv1.ResourceVector, now time.Time) error {
	subj, err := subject.Format(subject.RentalPending, j.ev.GetTenantId())
	if err != nil {
		return fault.Invalid("%v", err)
	}
	msg := "waiting for capacity: " + describe(&j.r)
	if reason == shizuv1.PendingReason_PENDING_REASON_AWAITING_PREEMPTION {
		msg = "waiting for spot rentals to be preempted: " + describe(&j.r)
	}
	if err := b.Publish(ctx, subj, &shizuv1.RentalPending{
		Meta:     meta(fmt.Sprintf("rental:%s:pending:%d", j.r.ID, reason), s.source, j.ev.GetMeta(), j.r.ID, now),
		RentalId: j.r.ID, TenantId: j.r.Tenant, Reason: reason, Missing: vec,
		Deadline: timestamppb.New(j.deadline), Message: msg,
	}); err != nil {
		return err
	}
	if reason != shizuv1.PendingReason_PENDING_REASON_NO_CAPACITY {
		return nil
	}
	return b.Publish(ctx, subject.CapacityShortage, &shizuv1.CapacityShortage{
		Meta:    meta("shortage:"+j.r.ID, s.source, j.ev.GetMeta(), j.r.ID, now),
		Missing: vec, RentalIds: []string{j.r.ID},
	})
}

func (s *Scheduler) queuePreemption(ctx context.Context, b *bus.Batch, j *job, plan placement.Preemption, now time.Time) error {
	k, ok := s.index[plan.NodeID]
	if !ok {
		return fault.Unavailable("node %s left the view", plan.NodeID)
	}
	node := &s.cluster.Nodes[k]
	for _, v := range plan.Victims {
		subj, err := subject.Format(subject.RentalPreempted, v.Tenant)
		if err != nil {
			return fault.Invalid("%v", err)
		}
		if err := b.Publish(ctx, subj, &shizuv1.RentalPreempted{
			Meta:     meta(fmt.Sprintf("rental:%s:preempted:%s", v.RentalID, j.r.ID), s.source, j.ev.GetMeta(), v.RentalID, now),
			RentalId: v.RentalID, TenantId: v.Tenant, NodeId: node.ID, NodeEpoch: int64(node.Epoch),
			NoticeDeadline: timestamppb.New(now.Add(s.cfg.PreemptionNotice)),
			Reason:         shizuv1.PreemptReason_PREEMPT_REASON_HIGHER_PRIORITY, PreemptingRentalId: j.r.ID,
			Message: fmt.Sprintf("preempted for a %s rental", j.r.Class),
		}); err != nil {
			return err
		}
		s.metrics.preempted(ctx)
	}
	return nil
}

// removeLocal takes a rental out of the in-memory view.
func (s *Scheduler) removeLocal(node, rental string) {
	if k, ok := s.index[node]; ok {
		s.cluster.Nodes[k].Remove(rental)
		s.meter.Update(&s.cluster, k)
	}
}

func finish(jobs []*job, err error) {
	for _, j := range jobs {
		j.done <- err
	}
}
