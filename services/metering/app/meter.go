package app

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/services/metering/pricing"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/service"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Meter is the running metering: it merges rental and spot events into
// segment state, closes usage records (at every interval boundary for
// running rentals, at once when a rental stops), publishes them, and folds
// the published records into the aggregates. Its decisions are the
// ledger's (Merge, Close, TariffOf, DueAlerts, Cutoff); this package reads
// their inputs, commits their results and publishes their events.
type Meter struct {
	cat   *pricing.Catalogue
	rules ledger.Rules
	grace time.Duration
	// parkGrace is how long a start or stop waits for its RentalScheduled.
	parkGrace time.Duration
	accounts  ledger.Accounts
	store     Store
	pub       Publisher
	conn      *bus.Conn
	log       *slog.Logger
	now       func() time.Time
	source    string
	opts      bus.ConsumeOptions
	batch     int
	metrics   *metrics
	// consumed bounds how far running rentals are billed: no later than
	// every rental and spot price event stored has been handled.
	consumed watermark
	// subs are the running consumers (Start), paused by a store rebuild.
	subs *consumerSet
	// lost wakes the store's recovery (noteLost).
	lost chan struct{}
	// budgets holds the budget states exhausted budgets put in force
	// (nil: budgets only alert).
	budgets BudgetStates
}

// Deps are what a Meter runs on.
type Deps struct {
	// Store is the segment and usage state (a *redisstore.Store).
	Store Store
	// Conn is the bus the consumers run on; Start needs it.
	Conn *bus.Conn
	// Publisher publishes records and alerts (default: on Conn).
	Publisher Publisher
	// Log receives the meter's logs (default: discarded).
	Log *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Meter receives metering's metrics (default none).
	Meter metric.MeterProvider
	// Budgets holds the hard stops of exhausted budgets (the BUDGETS
	// bucket, a *budgetkv.Store); nil, a budget's policy is not enforced
	// (its crossings are published all the same).
	Budgets BudgetStates
}

// NewMeter builds a Meter from a validated configuration.
func NewMeter(cfg Config, d Deps) (*Meter, error) {
	cat, accounts, err := cfg.load()
	if err != nil {
		return nil, err
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	if d.Publisher == nil {
		if d.Conn == nil {
			return nil, errors.New("metering: a meter needs a bus connection or a publisher")
		}
		d.Publisher = NewBusPublisher(d.Conn)
	}
	ms, err := newMetrics(d.Meter)
	if err != nil {
		return nil, err
	}
	return &Meter{metrics: ms, cat: cat, rules: cfg.Rules, grace: cfg.CloseGrace, parkGrace: cfg.ParkGrace, accounts: accounts, store: d.Store,
		pub: d.Publisher, conn: d.Conn, log: d.Log, now: d.Now, source: topology.Metering,
		opts: bus.ConsumeOptions{Concurrency: cfg.Concurrency, FastAck: cfg.FastAck}, batch: cfg.Batch, lost: make(chan struct{}, 1), budgets: d.Budgets}, nil
}

// Start starts the consumers and, when tick is positive, the interval
// closer; service.Run stops the returned parts in reverse order. Rental
// events and usage records are handled in batches (HandleRentals,
// HandleUsage); spot prices one by one (HandleSpotPrice).
func (m *Meter) Start(ctx context.Context, consumers []bus.Consumer, tick time.Duration) ([]service.Part, error) {
	if m.conn == nil {
		return nil, errors.New("metering: starting consumers needs a bus connection")
	}
	// The watermark follows the durables whose events end or reprice a
	// running rental; set before any handler runs.
	for _, c := range consumers {
		if c.Stream == topology.StreamRentals || c.Stream == topology.StreamMarket {
			m.consumed.of = append(m.consumed.of, newConsumedTime(m.conn.JetStream(), c))
		}
	}
	m.subs = &consumerSet{m: m, specs: consumers, ctx: ctx}
	if err := m.subs.start(ctx); err != nil {
		return nil, err
	}
	parts := []service.Part{m.subs}
	if tick > 0 {
		// Stopped in its turn by the caller, not when ctx ends.
		parts = append(parts, service.StartLoop(context.WithoutCancel(ctx), tick, m.closeTick))
	}
	return parts, nil
}
