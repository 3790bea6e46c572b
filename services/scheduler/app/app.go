// Package app wires the scheduler service to the bus and Redis and runs it.
// Its decisions live in packages beside it that import neither NATS nor
// Redis: round (what one scheduling round decides: admission, order,
// placement, pending, preemption, rejection, whether a reservation stays),
// view (the loop's in-memory state), placement (level two: where a rental
// goes) and queue (level one: in which order waiting requests are tried).
// The app reaches the world through the ports (Reserver, OutcomeRecords,
// Publisher): handlers.go turns deliveries into jobs, loop.go runs the
// rounds, commit.go reserves and records, publish.go builds the events.
package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/round"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/quota"
	"github.com/shizu-gpu/shizu/shared/service"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Config is the scheduler's configuration.
type Config struct {
	Service service.Config
	// Policy ranks nodes: shizu (default: FGD plus CPU-stranded GPU and scarce-model costs, see docs/replay.md), fgd, bestfit, firstfit, random, dotprod, packing or clustering
	// (fixed is a replay baseline only: it books whole GPUs for fractions).
	Policy string
	// MaxCandidates bounds the feasible nodes scored per decision (0 = all);
	// see placement.Options.MaxCandidates.
	MaxCandidates int
	// BatchSize is the most requests placed in one round.
	BatchSize int
	// Concurrency is how many deliveries are in flight at once; it bounds
	// how many requests a round can gather.
	Concurrency int
	// CommitWorkers reserve in parallel.
	CommitWorkers int
	// PendingTimeout: a request not placed this long after it was made is
	// rejected (REJECT_REASON_PENDING_TIMEOUT).
	PendingTimeout time.Duration
	// MaxPendingTimeout is the longest pending timeout a request may
	// choose (RentalSpec.pending_timeout); a longer one is rejected as an
	// invalid spec. Below PendingTimeout it is PendingTimeout.
	MaxPendingTimeout time.Duration
	// FleetPolicyPath is the autoscaler's policy file (its -policy, the
	// same file), whose fleet instance types count as capacity a request
	// may wait for; empty means none: requests are judged against the
	// registered nodes alone.
	FleetPolicyPath string
	// UnsatisfiableGrace: for this long after the replica starts, a
	// request no node could ever hold is not rejected yet (nodes may
	// still be registering); it waits with a note naming the constraint.
	UnsatisfiableGrace time.Duration
	// PendingRetry is how often pending requests are tried again.
	PendingRetry time.Duration
	// PreemptionNotice is the time a preempted spot rental gets to stop.
	PreemptionNotice time.Duration
	// SnapshotMaxAge: a view older than this is re-read when the store
	// moved.
	SnapshotMaxAge time.Duration
	// AgingStep is the wait worth one priority point.
	AgingStep time.Duration
	// WorkloadWindow is how many recent requests FGD measures against.
	WorkloadWindow int
	// KeyPrefix is the capacity store's Redis prefix; the scheduler's own
	// keys live under <prefix>:sched.
	KeyPrefix string
	// OutcomeTTL is how long a rental's outcome record is kept.
	OutcomeTTL time.Duration
	// AccountsPath is the accounts file (metering's -accounts, the same
	// file) whose reserved commitments admit reserved requests; empty
	// means none: every reserved request is refused.
	AccountsPath string
	// ReconcileInterval is how often the replica looks for allocations no
	// live rental owns; ReconcileAge is how old such an allocation must be
	// before it is freed (younger ones may be a reservation in flight).
	ReconcileInterval time.Duration
	ReconcileAge      time.Duration
	// RecordsCheck is how often the replica checks that its Redis records
	// are whole (their marker is there), rebuilding them from the rentals
	// stream when Redis lost them (every batch checks too).
	RecordsCheck time.Duration
}

// DefaultConfig is the configuration on a developer machine.
func DefaultConfig() Config {
	return Config{
		Service: service.Defaults(topology.Scheduler), Policy: string(placement.PolicyShizu),
		MaxCandidates: 64, BatchSize: 512, Concurrency: 4096, CommitWorkers: 32,
		PendingTimeout: 10 * time.Minute, MaxPendingTimeout: time.Hour, UnsatisfiableGrace: time.Minute, PendingRetry: 500 * time.Millisecond, PreemptionNotice: 30 * time.Second,
		SnapshotMaxAge: 5 * time.Second, AgingStep: time.Second, WorkloadWindow: 5000,
		KeyPrefix: "shizu", OutcomeTTL: 7 * 24 * time.Hour,
		ReconcileInterval: 30 * time.Second, ReconcileAge: 2 * time.Minute, RecordsCheck: 2 * time.Second,
	}
}

// RegisterFlags binds the scheduler's own flags (the common ones are bound by
// service.Main). Each defaults to its SHIZU_SCHEDULER_<FLAG> environment
// variable (SHIZU_SCHEDULER_BATCH_SIZE for -batch-size); a value there that
// does not parse is reported by Validate.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	f := c.Service.Flags(fs)
	f.String(&c.Policy, "policy", "placement policy: shizu, fgd, bestfit, firstfit, random, dotprod, packing, clustering")
	f.Int(&c.MaxCandidates, "max-candidates", "feasible nodes scored per decision (0 = all)")
	f.Int(&c.BatchSize, "batch-size", "most requests placed per round")
	f.Int(&c.Concurrency, "concurrency", "deliveries in flight")
	f.Int(&c.CommitWorkers, "commit-workers", "parallel reserves")
	f.Duration(&c.PendingTimeout, "pending-timeout", "reject requests pending longer (unless the request chooses its own)")
	f.Duration(&c.MaxPendingTimeout, "max-pending-timeout", "longest pending timeout a request may choose")
	f.String(&c.FleetPolicyPath, "fleet-policy", "the autoscaler's policy file: its fleet instance types count as capacity a request may wait for")
	f.Duration(&c.UnsatisfiableGrace, "unsatisfiable-grace", "after start, how long a request no node could ever hold waits before such requests are rejected")
	f.Duration(&c.PendingRetry, "pending-retry", "retry pending requests this often")
	f.Duration(&c.PreemptionNotice, "preemption-notice", "notice given to preempted spot rentals")
	f.Duration(&c.SnapshotMaxAge, "snapshot-max-age", "re-read the store when the view is older and the store moved")
	f.Duration(&c.AgingStep, "aging-step", "wait worth one priority point")
	f.Int(&c.WorkloadWindow, "workload-window", "recent requests the fragmentation measure is taken against")
	f.Duration(&c.OutcomeTTL, "outcome-ttl", "how long a rental's outcome record is kept")
	f.String(&c.KeyPrefix, "key-prefix", "capacity store Redis key prefix")
	f.String(&c.AccountsPath, "accounts", "reserved commitments (metering's accounts JSON); none: reserved requests are refused")
	f.Duration(&c.ReconcileInterval, "reconcile-interval", "how often allocations no live rental owns are looked for")
	f.Duration(&c.ReconcileAge, "reconcile-age", "how old an allocation no live rental owns must be to be freed")
	f.Duration(&c.RecordsCheck, "records-check", "how often the Redis records are checked whole (rebuilt from the rentals stream when lost)")
}

// commitments reads the reserved commitments of the accounts file.
func (c Config) commitments() (round.Commitments, error) {
	if c.AccountsPath == "" {
		return nil, nil
	}
	data, err := os.ReadFile(c.AccountsPath)
	if err != nil {
		return nil, fmt.Errorf("scheduler.accounts: %w", err)
	}
	cs, err := round.ParseAccounts(data)
	if err != nil {
		return nil, fmt.Errorf("scheduler.accounts %s: %w", c.AccountsPath, err)
	}
	return cs, nil
}

// Validate reports every problem in the configuration.
func (c Config) Validate() error {
	var errs []error
	if err := c.Service.Validate(); err != nil {
		errs = append(errs, err)
	}
	if p, err := placement.ParsePolicy(c.Policy); err != nil {
		errs = append(errs, fmt.Errorf("scheduler.policy: %w", err))
	} else if p == placement.PolicyFixed {
		errs = append(errs, errors.New("scheduler.policy: fixed is a replay baseline (it books whole GPUs for fractions); use shizu, fgd, bestfit, firstfit, random, dotprod, packing or clustering"))
	}
	positive := func(name string, v int) {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("scheduler.%s: must be positive, got %d", name, v))
		}
	}
	if c.MaxCandidates < 0 {
		errs = append(errs, fmt.Errorf("scheduler.max-candidates: must not be negative, got %d", c.MaxCandidates))
	}
	positive("batch-size", c.BatchSize)
	positive("concurrency", c.Concurrency)
	positive("commit-workers", c.CommitWorkers)
	positive("workload-window", c.WorkloadWindow)
	for name, d := range map[string]time.Duration{"pending-timeout": c.PendingTimeout, "pending-retry": c.PendingRetry,
		"preemption-notice": c.PreemptionNotice, "reconcile-interval": c.ReconcileInterval, "reconcile-age": c.ReconcileAge, "records-check": c.RecordsCheck, "snapshot-max-age": c.SnapshotMaxAge, "aging-step": c.AgingStep, "outcome-ttl": c.OutcomeTTL} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("scheduler.%s: must be positive, got %s", name, d))
		}
	}
	if c.OutcomeTTL > 0 && c.OutcomeTTL < time.Second {
		errs = append(errs, fmt.Errorf("scheduler.outcome-ttl: must be at least 1s (Redis expires keys in whole seconds), got %s", c.OutcomeTTL))
	}
	if c.MaxPendingTimeout < 0 {
		errs = append(errs, fmt.Errorf("scheduler.max-pending-timeout: must not be negative, got %s", c.MaxPendingTimeout))
	}
	if c.UnsatisfiableGrace < 0 {
		errs = append(errs, fmt.Errorf("scheduler.unsatisfiable-grace: must not be negative, got %s", c.UnsatisfiableGrace))
	}
	if c.KeyPrefix == "" {
		errs = append(errs, errors.New("scheduler.key-prefix: must not be empty"))
	}
	return errors.Join(errs...)
}

// Run runs the scheduler until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	return service.Run(ctx, cfg.Service, func(ctx context.Context, rt *service.Runtime) ([]service.Part, error) {
		if rt.Redis == nil {
			return nil, errors.New("scheduler: redis.url is required")
		}
		store, err := capacity.New(rt.Redis, capacity.WithPrefix(cfg.KeyPrefix))
		if err != nil {
			return nil, err
		}
		m, err := NewMetrics(rt.Telemetry.MeterProvider())
		if err != nil {
			return nil, err
		}
		quotas, err := quota.Open(ctx, rt.Bus.JetStream())
		if err != nil {
			return nil, err
		}
		cache, err := quotas.Watch(ctx, rt.Log)
		if err != nil {
			return nil, err
		}
		watch := service.PartFunc(func(context.Context) error { cache.Stop(); return nil })
		s, err := New(cfg, Deps{Bus: rt.Bus, Store: store, Redis: rt.Redis, Log: rt.Log, Metrics: m, Quotas: cache})
		if err != nil {
			cache.Stop()
			return nil, err
		}
		svc, _ := topology.ServiceNamed(topology.Scheduler)
		if err := service.EnsureConsumers(ctx, rt, svc.Consumers...); err != nil {
			cache.Stop()
			return nil, err
		}
		parts, err := s.Start(ctx, svc.Consumers...)
		if err != nil {
			cache.Stop()
			return nil, err
		}
		// Stopped last: the loop reserves with the quotas until it ends.
		return append([]service.Part{watch}, parts...), nil
	})
}

// Start runs the scheduling loop and consumes specs (the topology's
// scheduler consumers: rentals, and node health); the parts stop in
// reverse: the subscriptions drain first (in-flight requests finish
// through the loop), then the loop stops.
func (s *Scheduler) Start(ctx context.Context, specs ...bus.Consumer) ([]service.Part, error) {
	loopCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Run(loopCtx)
	}()
	loop := service.PartFunc(func(context.Context) error {
		cancel()
		<-done
		return nil
	})
	parts := []service.Part{loop, s.startBudgets(ctx)}
	// The records are whole before the first delivery is handled; a
	// check that fails here is repeated before each batch.
	if err := s.ensureRecords(ctx); err != nil {
		s.d.Log.WarnContext(ctx, "check scheduler records", "err", err)
	}
	checkCtx, stopCheck := context.WithCancel(context.WithoutCancel(ctx))
	checked := make(chan struct{})
	go func() {
		defer close(checked)
		s.checkRecordsLoop(checkCtx)
	}()
	parts = append(parts, service.PartFunc(func(context.Context) error {
		stopCheck()
		<-checked
		return nil
	}))
	// Deliveries come in batches of up to BatchSize, Concurrency in flight
	// in all, so the loop has the next batch at hand while the previous
	// one's events are being stored.
	opts := bus.BatchOptions{MaxBatch: s.cfg.BatchSize, Concurrency: max(1, s.cfg.Concurrency/s.cfg.BatchSize), FastAck: true,
		Unusable: s.onForged}
	for _, spec := range specs {
		sub, err := s.d.Bus.ConsumeBatch(ctx, spec, s.gated(s.onBatch(s.Router())), opts)
		if err != nil {
			for i := len(parts) - 1; i >= 0; i-- {
				_ = parts[i].Stop(ctx)
			}
			return nil, err
		}
		parts = append(parts, service.Subscription{Subscription: sub})
	}
	return parts, nil
}
