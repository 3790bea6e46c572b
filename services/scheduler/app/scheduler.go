package app

import (
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/ports"
	"github.com/shizu-gpu/shizu/services/scheduler/records"
	"github.com/shizu-gpu/shizu/services/scheduler/round"
	"github.com/shizu-gpu/shizu/services/scheduler/view"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// Deps are what a Scheduler runs on.
type Deps struct {
	// Bus carries the deliveries, and the events unless Publisher is set.
	Bus *bus.Conn
	// Store is the capacity store; the loop's view is read from it and its
	// reserve (a ports.Reserver) commits the rounds.
	Store *capacity.Store
	// Redis holds the outcome records unless Records is set.
	Redis redis.UniversalClient
	// Records and Publisher replace the Redis records and the bus
	// publisher (both optional).
	Records   ports.OutcomeRecords
	Publisher ports.Publisher
	// Owners records which tenant owns each rental id; unset, the Records
	// when they are one (the Redis records are).
	Owners ports.Owners
	// Market holds the spot prices; unset, the Records when they are one
	// (the Redis records are), else spot prices are not followed.
	Market ports.SpotMarket
	Log    *slog.Logger
	// Quotas are the tenants' quotas, handed to the store with each
	// reservation; nil: no tenant has one.
	Quotas ports.Quotas
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
	cfg Config
	d   Deps
	// reserve is d.Store's reserve (a fake in tests of the round).
	reserve ports.Reserver
	rec     ports.OutcomeRecords
	pub     ports.Publisher
	market  ports.SpotMarket
	owners  ports.Owners // nil: ownership not kept (test fakes only)
	plan    round.Config
	source  string
	metrics *Metrics
	// catalogue is read by handlers concurrently; never written.
	catalogue placement.Catalogue

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

	// Owned by the loop goroutine (view.Post aside).
	view *view.View
	// prices are the spot prices last read into the view.
	prices map[round.SpotKey]placement.Price
	// lastRetry is the store version the pending set was last tried at;
	// nextDeadline the earliest pending deadline (or preemption notice) then.
	lastRetry    uint64
	nextDeadline time.Time
	// afterReserve, when set (tests only), runs off the loop between a
	// round's reservations and the record of their outcomes, with the
	// rentals reserved: an error there is a replica that died after its
	// reserve (nothing recorded, the deliveries not acknowledged).
	afterReserve func(rentals []string) error
	reconciling  reconciler
	stopping     victimStopper
	sweeping     spotSweeper
	// claimed is closed once the last round handed off has recorded its
	// outcomes: rounds record in the order they placed (see finishRound).
	claimed chan struct{}
	// rebuild keeps decisions off records Redis lost (rebuild.go).
	rebuild rebuild
	// budgets are the budget hard stops in force (budget.go).
	budgets budgets
}

// job is one request in a scheduling round: what the round decides on, and
// what committing, recording and publishing it finds.
type job struct {
	round.Job
	done chan error

	alloc capacity.Allocation
	// adopted: the job fit nowhere, but the store holds a reservation
	// under its rental id (see roundCommit.adopt), which is its placement.
	adopted bool
	facts   *view.Facts
	err     error
	outcome string
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
		d.Log = slog.New(slog.DiscardHandler)
	}
	if d.Records == nil {
		d.Records = records.New(d.Redis, cfg.KeyPrefix, cfg.OutcomeTTL)
	}
	if m, ok := d.Records.(ports.SpotMarket); ok && d.Market == nil {
		d.Market = m
	}
	if d.Publisher == nil {
		d.Publisher = BusPublisher{Conn: d.Bus}
	}
	commitments, err := cfg.commitments()
	if err != nil {
		return nil, err
	}
	offers, err := cfg.offers()
	if err != nil {
		return nil, err
	}
	catalogue := placement.DefaultCatalogue()
	pl, err := placement.NewPlacer(placement.Options{Policy: placement.Policy(cfg.Policy), Catalogue: catalogue, MaxCandidates: cfg.MaxCandidates})
	if err != nil {
		return nil, err
	}
	s := &Scheduler{
		cfg: cfg, d: d, reserve: d.Store, rec: d.Records, pub: d.Publisher, market: d.Market, owners: ownersOf(d), catalogue: catalogue,
		plan: round.Config{Placer: pl, AgingStep: cfg.AgingStep, PendingTimeout: cfg.PendingTimeout,
			PreemptionNotice: cfg.PreemptionNotice, Commitments: commitments, MaxPendingTimeout: cfg.MaxPendingTimeout,
			Offers: offers, JudgeFrom: d.Now().Add(cfg.UnsatisfiableGrace)},
		in:         make(chan []*job, cfg.Concurrency/cfg.BatchSize+1),
		kick:       make(chan struct{}, 1),
		changed:    make(chan string, 64),
		publishing: make(chan struct{}, maxPublishing),
		source:     "scheduler",
		metrics:    d.Metrics,
		view:       view.New(cfg.WorkloadWindow),
	}
	if m, ok := d.Records.(recordsMarker); ok && d.Bus != nil {
		s.rebuild.marker = m
	}
	return s, nil
}

// Router returns the handlers of the scheduler's durable consumer.
func (s *Scheduler) Router() *bus.Router {
	r := bus.NewRouter()
	r.Handle(bus.EventName(&shizuv1.RentalRequested{}), s.onRequested)
	r.EventForSubject(subject.RentalRequestedAll, bus.EventName(&shizuv1.RentalRequested{}))
	bus.On(r, s.onCancel)
	r.Handle(bus.EventName(&shizuv1.RentalStopped{}), s.onStoppedRaw) // bus.On, but a clock-stepped stop is a stop
	bus.On(r, s.onMigrating)
	bus.On(r, s.onHealth)
	bus.On(r, s.onSpotPrice)
	return r
}

func (s *Scheduler) newJob(ev *shizuv1.RentalRequested, r placement.Request, attempt int32) *job {
	return &job{Job: round.NewJob(ev, r, attempt, s.plan), done: make(chan error, 1)}
}
