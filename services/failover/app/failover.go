package app

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shizu-gpu/shizu/services/failover/detect"
	"github.com/shizu-gpu/shizu/services/failover/migrate"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
)

// Deps are what a failover replica runs on.
type Deps struct {
	Bus        *bus.Conn
	Heartbeats *bus.Heartbeats
	Store      *capacity.Store
	Redis      redis.UniversalClient
	// Log may be nil (nothing is logged).
	Log *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Metrics may be nil.
	Metrics *Metrics
	// Source names this replica in EventMeta.source (default "failover").
	Source string
}

// Failover is one replica. Every replica watches every heartbeat and
// decides losses on its own; the capacity store's fence lets exactly one of
// them act on each loss. Node and rental events are work-shared between
// replicas through the durable consumers.
type Failover struct {
	cfg Config
	d   Deps

	// rec is the Redis behind placements, moves and quarantines; ready
	// says they hold what the rental stream says (rebuild.go).
	rec         records
	ready       atomic.Bool
	placements  placementRecords
	moves       moveRecords
	quarantines quarantineRecords
	releases    releases
	newBatch    func() eventBatch

	mu    sync.Mutex // guards det and queue
	det   *detect.Detector
	queue *migrate.Queue
	wake  chan struct{}
	// holdUntil: the moves wait until then for losses about to be
	// confirmed (see step); owned by the Run loop.
	holdUntil time.Time
}

// New builds a replica.
func New(cfg Config, d Deps) (*Failover, error) {
	if d.Bus == nil || d.Heartbeats == nil || d.Store == nil || d.Redis == nil {
		return nil, errors.New("failover: bus, heartbeats, store and redis are required")
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	if d.Source == "" {
		d.Source = "failover"
	}
	// After failover could not see the heartbeats, every node gets one
	// TTL to beat again (see sight.go).
	cfg.Detect.Grace = d.Heartbeats.TTL()
	det, err := detect.New(cfg.Detect)
	if err != nil {
		return nil, err
	}
	q, err := migrate.NewQueue(cfg.Pace)
	if err != nil {
		return nil, err
	}
	prefix := cfg.KeyPrefix
	if prefix == "" {
		prefix = "shizu"
	}
	rec := records{rdb: d.Redis, prefix: prefix}
	return &Failover{cfg: cfg, d: d, rec: rec, placements: redisPlacements{rec}, moves: redisMoves{rec}, quarantines: redisQuarantines{rec},
		releases: d.Store, newBatch: func() eventBatch { return newBusBatch(d.Bus) },
		det: det, queue: q, wake: make(chan struct{}, 1)}, nil
}

// nodeRouter handles the "failover" consumer (node events).
func (f *Failover) nodeRouter() *bus.Router {
	r := bus.NewRouter()
	bus.On(r, f.onHealth)
	bus.On(r, f.onInterruption)
	bus.On(r, f.onRegistered)
	bus.On(r, f.onDrained)
	return r
}

// rentalRouter handles the "failover-rentals" consumer.
func (f *Failover) rentalRouter() *bus.Router {
	r := bus.NewRouter()
	bus.On(r, f.onScheduled)
	bus.On(r, f.onStarted)
	r.Handle(rentalStoppedName, f.onStoppedRaw) // bus.On, but a clock-stepped stop is a stop (stopped.go)
	return r
}

func (f *Failover) kick() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// run watches heartbeats (and disconnects, when given) and acts on
// decisions until ctx ends.
func (f *Failover) run(ctx context.Context, disconnects <-chan Disconnect) error {
	reconnected := f.watchConnection()
	served := f.watchJetStream(ctx, f.cfg.Detect.Grace/4)
	w, err := f.watchHeartbeats(ctx, heartbeatWatch{})
	if err != nil {
		return err
	}
	defer func() { w.stop() }()
	tick := time.NewTicker(f.cfg.Tick)
	defer tick.Stop()
	sweep := time.NewTicker(f.cfg.Sweep)
	defer sweep.Stop()
	// due fires when the detector's next decision is due (a disconnect's
	// grace ending, say), so a loss is not left waiting for the next tick.
	due := time.NewTimer(f.cfg.Sweep)
	defer due.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-reconnected:
			// A new watch replays every live key; the old one would resume
			// only after its idle heartbeats were missed (see sight.go).
			if w, err = f.watchHeartbeats(ctx, w); err != nil {
				return nil // ctx ended
			}
		case <-served:
			if w, err = f.watchHeartbeats(ctx, w); err != nil {
				return nil
			}
		case ch, ok := <-w.changes:
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return errors.New("failover: heartbeat watch ended")
			}
			f.observe(ch)
			if ch.Alive {
				continue // a beat decides nothing: the next tick looks
			}
		case dc := <-disconnects:
			f.mu.Lock()
			f.det.Disconnected(dc.Node, dc.At)
			f.mu.Unlock()
		case <-tick.C:
		case <-due.C:
		case <-f.wake:
		case <-sweep.C:
			if err := f.sweep(ctx); err != nil {
				f.d.Log.WarnContext(ctx, "failover sweep failed", "err", err)
			}
		}
		f.step(ctx)
		if wait, ok := f.nextDecision(); ok {
			due.Reset(wait)
		}
	}
}

// nextDecision is how long until the detector's next decision (or the end
// of a hold on the moves), if that comes before the next tick. Only a
// decision still ahead counts: one overdue but undecidable (a node whose
// epoch is not known yet) would otherwise spin the loop. The tick stays
// the fallback.
func (f *Failover) nextDecision() (time.Duration, bool) {
	now := f.d.Now()
	f.mu.Lock()
	next := f.det.NextWake(now)
	if f.holdUntil.After(now) && (next.IsZero() || f.holdUntil.Before(next)) {
		next = f.holdUntil // moves held for an imminent loss
	}
	f.mu.Unlock()
	if next.After(now) && next.Sub(now) < f.cfg.Tick {
		return next.Sub(now), true
	}
	return 0, false
}

// Disconnect is a node agent's connection closing, from the server's
// advisory.
type Disconnect struct {
	Node string
	At   time.Time
}

// observe feeds a heartbeat change to the detector. Beats, expiries and
// disconnects are stamped by the NATS server's clock, so they order
// correctly among themselves however late each reaches this replica; the
// detector's windows compare them with this replica's clock (hosts are
// expected to be NTP-synchronized: skew adds to the windows).
func (f *Failover) observe(ch bus.HeartbeatChange) {
	at := ch.At
	if at.IsZero() {
		at = f.d.Now()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if ch.Alive {
		epoch, _ := strconv.ParseUint(string(ch.Payload), 10, 64)
		f.det.Beat(ch.Node, epoch, at)
		return
	}
	f.det.Expired(ch.Node, at)
}

// step acts on what the detector and the queue decided at now. The
// NodeLost events of the tick and the hand-over of every move due go out
// in one async publish batch, acknowledged together.
func (f *Failover) step(ctx context.Context) {
	if !f.ready.Load() {
		return // records lost: nothing is decided until they are rebuilt
	}
	now := f.d.Now()
	f.mu.Lock()
	ds := f.det.Tick(now)
	f.mu.Unlock()
	b := f.newBatch()
	for _, l := range ds.Lost {
		if err := f.lose(ctx, l, b); err != nil {
			f.d.Log.WarnContext(ctx, "acting on a lost node failed; the sweep retries", "node", l.Node, "err", err)
		}
	}
	for _, q := range ds.Released {
		if err := f.unquarantine(ctx, q.Node, q.Epoch); err != nil {
			f.d.Log.WarnContext(ctx, "ending a quarantine failed; the sweep retries", "node", q.Node, "err", err)
		}
	}
	ms := f.due(now, len(ds.Lost) > 0)
	if err := f.moveAll(ctx, ms, b); err != nil {
		f.d.Log.WarnContext(ctx, "handing rentals over failed; the sweep retries", "rentals", len(ms), "err", err)
	}
}

// due pops the moves that may go at now. Agents killed together are found
// lost a few milliseconds apart (each at its own disconnect plus the
// grace). Moves handed over at the first loss could be placed on a node
// found lost a moment later, and move twice; so after a loss they wait (at
// most a tick) for the losses due that soon.
func (f *Failover) due(now time.Time, lost bool) []migrate.Record {
	f.mu.Lock()
	defer f.mu.Unlock()
	if lost {
		if by := f.det.LossesDueBy(now, now.Add(f.cfg.Tick)); by.After(f.holdUntil) {
			f.holdUntil = by
		}
	}
	if now.Before(f.holdUntil) {
		return nil
	}
	moves := f.queue.Pop(f.d.Now())
	ms := make([]migrate.Record, len(moves))
	for i, m := range moves {
		ms[i] = m.Value.(migrate.Record)
	}
	return ms
}

// push queues moves.
func (f *Failover) push(moves ...migrate.Move) {
	f.mu.Lock()
	f.queue.Push(moves...)
	f.mu.Unlock()
}
