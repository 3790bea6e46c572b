// Package detect holds failover's decisions about nodes: when a node that
// stopped beating (or whose agent's connection closed, or that reported a
// fatal failure, or whose spot deadline passed) is confirmed lost, and which
// nodes flap and are quarantined. It imports neither NATS nor Redis; every
// decision takes the time as a value, so tests drive it with a fake clock.
package detect

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Reason says why a node is lost.
type Reason int

// Reasons, in the order a storm handles them: a node that failed outright
// or whose agent crashed is worse off than one whose heartbeat lapsed.
const (
	ReasonUnknown Reason = iota
	// ReasonFatalHealth: the agent reported the node failed as a whole.
	ReasonFatalHealth
	// ReasonDisconnected: the agent's connection closed and no beat came
	// within the grace period.
	ReasonDisconnected
	// ReasonDeadlinePassed: the spot interruption deadline passed.
	ReasonDeadlinePassed
	// ReasonHeartbeatExpired: the heartbeat key expired and no beat came
	// within the confirmation window.
	ReasonHeartbeatExpired
)

func (r Reason) String() string {
	switch r {
	case ReasonFatalHealth:
		return "fatal_health"
	case ReasonDisconnected:
		return "agent_disconnected"
	case ReasonDeadlinePassed:
		return "deadline_passed"
	case ReasonHeartbeatExpired:
		return "heartbeat_expired"
	}
	return "unknown"
}

// Config tunes detection and quarantine.
type Config struct {
	// Confirm is how long a node whose heartbeat key expired stays suspect
	// before it is declared lost; a beat within it clears the suspicion, so
	// one late heartbeat does not move anything.
	Confirm time.Duration
	// DisconnectGrace: after the agent's connection closed, the node is lost
	// unless it beats within this long of the disconnect. An agent beats at
	// once when its connection comes back (services/node-agent), so the
	// grace only has to cover a reconnect, not a heartbeat interval: a crash
	// is handled in about half a second instead of a TTL.
	DisconnectGrace time.Duration
	// FlapWindow and FlapThreshold: a node lost FlapThreshold times within
	// FlapWindow is quarantined when it comes back.
	FlapWindow    time.Duration
	FlapThreshold int
	// QuarantineBase is the first quarantine; each further loss within the
	// window doubles it, up to QuarantineMax.
	QuarantineBase time.Duration
	QuarantineMax  time.Duration
	// Grace: after a period in which failover could not observe the
	// heartbeats (its connection dropped, NATS restarted), every node gets
	// this long (one heartbeat TTL) from the moment it observes them again
	// before a missing beat is judged. A beat not seen while blind is not
	// missing: the outage was NATS's, not the node's.
	Grace time.Duration
}

// DefaultConfig fits the default 1 s heartbeat and 3 s TTL.
func DefaultConfig() Config {
	return Config{
		Confirm:         500 * time.Millisecond,
		DisconnectGrace: 500 * time.Millisecond,
		FlapWindow:      10 * time.Minute,
		FlapThreshold:   3,
		QuarantineBase:  time.Minute,
		QuarantineMax:   30 * time.Minute,
		Grace:           3 * time.Second,
	}
}

// Validate reports every problem.
func (c Config) Validate() error {
	var errs []error
	if c.Confirm < 0 {
		errs = append(errs, fmt.Errorf("confirm: %s, want >= 0", c.Confirm))
	}
	if c.DisconnectGrace <= 0 {
		errs = append(errs, fmt.Errorf("disconnect_grace: %s, want > 0", c.DisconnectGrace))
	}
	if c.FlapWindow <= 0 {
		errs = append(errs, fmt.Errorf("flap_window: %s, want > 0", c.FlapWindow))
	}
	if c.FlapThreshold < 1 {
		errs = append(errs, fmt.Errorf("flap_threshold: %d, want >= 1", c.FlapThreshold))
	}
	if c.QuarantineBase <= 0 || c.QuarantineMax < c.QuarantineBase {
		errs = append(errs, fmt.Errorf("quarantine: base %s, max %s, want 0 < base <= max", c.QuarantineBase, c.QuarantineMax))
	}
	if c.Grace < 0 {
		errs = append(errs, fmt.Errorf("grace: %s, want >= 0", c.Grace))
	}
	return errors.Join(errs...)
}

// Loss is a node confirmed lost.
type Loss struct {
	Node string
	// Epoch is the registration epoch to fence; 0 when no beat or
	// registration told it (the caller reads the store's).
	Epoch  uint64
	Reason Reason
	// LastBeat is the last sign of life seen; zero if none.
	LastBeat time.Time
	// SuspectedAt is when the first signal came; ConfirmedAt when the loss
	// was decided.
	SuspectedAt time.Time
	ConfirmedAt time.Time
}

// Quarantine keeps a flapping node out of service until Until.
type Quarantine struct {
	Node   string
	Epoch  uint64
	Until  time.Time
	Losses int
}

type node struct {
	epoch    uint64
	lastBeat time.Time
	// Suspicions, cleared by a later beat (expiry, disconnect) or a newer
	// registration (all).
	expiredAt      time.Time
	disconnectedAt time.Time
	failedAt       time.Time
	failedEpoch    uint64
	deadline       time.Time
	deadlineEpoch  uint64
	drained        bool
	// reported: the epoch a loss was reported for (reported once).
	reported uint64
	losses   []time.Time
	// quarantined until, for epoch qEpoch.
	until      time.Time
	qEpoch     uint64
	qLosses    int
	qAnnounced uint64
}

// Detector tracks every node's signals. Not safe for concurrent use: one
// goroutine owns it.
type Detector struct {
	cfg   Config
	nodes map[string]*node
	sight sight
}

// sight is what failover could see of the heartbeats: a missing beat is
// judged only while it sees them, and one Grace after it saw them again.
type sight struct {
	blind bool
	// lostAt is when the current blind period began.
	lostAt time.Time
	// judgeFrom: no missing beat is judged before it.
	judgeFrom time.Time
}

// New returns a detector.
func New(cfg Config) (*Detector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("detect: %w", err)
	}
	// A new detector sees the heartbeats; a caller that cannot yet calls
	// Unobserved.
	return &Detector{cfg: cfg, nodes: map[string]*node{}}, nil
}

// Unobserved records that failover stopped seeing the heartbeats at at
// (its connection to NATS dropped, its watch ended): from then until
// Observed and one Grace after it, no missing beat is judged.
func (d *Detector) Unobserved(at time.Time) {
	if !d.sight.blind {
		d.sight = sight{blind: true, lostAt: at, judgeFrom: d.sight.judgeFrom}
	}
}

// Observed records that failover sees the heartbeats again from at (a new
// watch replays every live key). Every node gets one Grace from at: a
// node whose last beat came before failover lost sight is suspected as if
// its key had expired then (its expiry may have come and gone unseen), so
// it is lost at at+Grace unless it beats meanwhile; a node that beat since
// is cleared by that beat.
func (d *Detector) Observed(at time.Time) {
	if !d.sight.blind {
		return
	}
	lostAt := d.sight.lostAt
	d.sight = sight{judgeFrom: at.Add(d.cfg.Grace)}
	for _, n := range d.nodes {
		if n.epoch != 0 && n.expiredAt.IsZero() && n.lastBeat.Before(lostAt) {
			n.expiredAt = lostAt
		}
	}
}

// judging reports whether a missing beat may be judged at now.
func (d *Detector) judging(now time.Time) bool {
	return !d.sight.blind && !now.Before(d.sight.judgeFrom)
}

// judgedBy is when a missing beat due at due can be judged: not before the
// grace after failover saw the heartbeats again; zero while blind.
func (d *Detector) judgedBy(due time.Time) time.Time {
	if d.sight.blind || due.IsZero() {
		return time.Time{}
	}
	if due.Before(d.sight.judgeFrom) {
		return d.sight.judgeFrom
	}
	return due
}

func (d *Detector) node(id string) *node {
	n := d.nodes[id]
	if n == nil {
		n = &node{}
		d.nodes[id] = n
	}
	return n
}

// Beat records a heartbeat of node at epoch (0 if the payload had none).
// It clears an expiry or disconnect suspicion.
func (d *Detector) Beat(id string, epoch uint64, at time.Time) {
	n := d.node(id)
	if epoch != 0 && epoch < n.epoch {
		return // a beat of an older registration
	}
	if epoch > n.epoch {
		// A registration this replica did not see: a new life.
		d.newLife(n, epoch, at)
	}
	if at.After(n.lastBeat) {
		n.lastBeat = at
	}
	if !n.expiredAt.IsZero() && !at.Before(n.expiredAt) {
		n.expiredAt = time.Time{}
	}
	if !n.disconnectedAt.IsZero() && at.After(n.disconnectedAt) {
		n.disconnectedAt = time.Time{}
	}
}

// Known records a node's epoch read from the capacity store, for a node
// this replica has seen no beat or registration of (so a loss found by
// the sweep can be fenced at the right epoch). It says nothing about
// liveness.
func (d *Detector) Known(id string, epoch uint64) {
	if n := d.node(id); n.epoch == 0 {
		n.epoch = epoch
	}
}

// Expired records that node's heartbeat key expired (or was removed) at at.
func (d *Detector) Expired(id string, at time.Time) {
	n := d.node(id)
	if !n.lastBeat.IsZero() && n.lastBeat.After(at) {
		return // beaten again since
	}
	if n.expiredAt.IsZero() {
		n.expiredAt = at
	}
}

// Disconnected records that node's agent connection closed at at.
func (d *Detector) Disconnected(id string, at time.Time) {
	n := d.node(id)
	if n.disconnectedAt.IsZero() {
		n.disconnectedAt = at
	}
}

// Failed records that the node reported itself failed as a whole (every
// GPU failed) at epoch: lost at once.
func (d *Detector) Failed(id string, epoch uint64, at time.Time) {
	n := d.node(id)
	if epoch < n.epoch {
		return
	}
	if epoch > n.epoch {
		d.newLife(n, epoch, at)
	}
	if n.failedAt.IsZero() {
		n.failedAt, n.failedEpoch = at, epoch
	}
}

// Interrupted records a spot interruption notice received at at: the node
// is lost at deadline unless it re-registers with a newer epoch first.
func (d *Detector) Interrupted(id string, epoch uint64, deadline, at time.Time) {
	n := d.node(id)
	if epoch < n.epoch {
		return
	}
	if epoch > n.epoch {
		d.newLife(n, epoch, at)
	}
	n.deadline, n.deadlineEpoch = deadline, epoch
}

// Drained records that a node emptied by a drain (reported at at) may go
// away: its key expiring (the node released) is no loss until it registers
// again.
func (d *Detector) Drained(id string, epoch uint64, at time.Time) {
	n := d.node(id)
	if epoch < n.epoch {
		return
	}
	if epoch > n.epoch {
		d.newLife(n, epoch, at)
	}
	n.drained = true
}

// Registered records a (re)registration. The same epoch is a sign of life
// (an agent restart keeps its epoch); a newer one starts a new life: every
// earlier signal is void. It returns the quarantine the node must serve,
// if it flapped: once per epoch, whether the new epoch was first seen here
// or in a beat.
func (d *Detector) Registered(id string, epoch uint64, at time.Time) (Quarantine, bool) {
	n := d.node(id)
	if epoch < n.epoch {
		return Quarantine{}, false
	}
	if epoch > n.epoch {
		d.newLife(n, epoch, at)
	}
	d.Beat(id, epoch, at)
	if n.qEpoch != epoch || !at.Before(n.until) || n.qAnnounced == epoch {
		return Quarantine{}, false
	}
	n.qAnnounced = epoch
	return Quarantine{Node: id, Epoch: epoch, Until: n.until, Losses: n.qLosses}, true
}

// newLife starts a new registration at: every signal of the old one is
// void, and a node lost too often lately is quarantined from at.
func (d *Detector) newLife(n *node, epoch uint64, at time.Time) {
	n.epoch = epoch
	// Signals from before this life belong to the old one; a signal seen
	// first but stamped after at (a disconnect advisory that overtook the
	// beat announcing the epoch) belongs to this one.
	for _, sig := range []*time.Time{&n.expiredAt, &n.disconnectedAt, &n.failedAt} {
		if sig.Before(at) {
			*sig = time.Time{}
		}
	}
	n.deadline = time.Time{}
	n.drained = false
	losses := n.recentLosses(at, d.cfg.FlapWindow)
	if losses < d.cfg.FlapThreshold {
		return
	}
	backoff := d.cfg.QuarantineBase
	for range losses - d.cfg.FlapThreshold {
		backoff *= 2
		if backoff >= d.cfg.QuarantineMax {
			break
		}
	}
	n.until, n.qEpoch, n.qLosses = at.Add(min(backoff, d.cfg.QuarantineMax)), epoch, losses
}

// disconnectDue is when a disconnected node without a newer beat is lost:
// grace after the disconnect. (Measured from the last beat instead, the
// grace would have to outlast a whole heartbeat interval for a reconnected
// agent's next regular beat to clear it, and detection would take between
// grace minus the interval and grace after a crash, depending on where in
// its interval the agent died.)
func (n *node) disconnectDue(grace time.Duration) time.Time {
	return n.disconnectedAt.Add(grace)
}

func (n *node) recentLosses(now time.Time, window time.Duration) int {
	n.losses = slices.DeleteFunc(n.losses, func(t time.Time) bool { return now.Sub(t) > window })
	return len(n.losses)
}

// Decisions is what a tick decided.
type Decisions struct {
	// Lost nodes, worst first (see Reason), then by node id.
	Lost []Loss
	// Released quarantines (their node may take work again).
	Released []Quarantine
}

// Tick decides, at now, which suspicions are confirmed and which
// quarantines are over. A loss is reported once per epoch.
func (d *Detector) Tick(now time.Time) Decisions {
	var out Decisions
	for id, n := range d.nodes {
		if !n.until.IsZero() && !now.Before(n.until) {
			out.Released = append(out.Released, Quarantine{Node: id, Epoch: n.qEpoch, Until: n.until})
			n.until = time.Time{}
		}
		if n.reported != 0 && n.reported >= n.epoch {
			continue
		}
		l, lost := d.confirm(id, n, now)
		if !lost {
			continue
		}
		n.reported = max(n.epoch, 1)
		n.losses = append(n.losses, now)
		out.Lost = append(out.Lost, l)
	}
	slices.SortFunc(out.Lost, func(a, b Loss) int {
		if a.Reason != b.Reason {
			return int(a.Reason) - int(b.Reason)
		}
		return strings.Compare(a.Node, b.Node)
	})
	slices.SortFunc(out.Released, func(a, b Quarantine) int { return strings.Compare(a.Node, b.Node) })
	return out
}

func (d *Detector) confirm(id string, n *node, now time.Time) (Loss, bool) {
	if n.epoch == 0 {
		return Loss{}, false // no beat or registration seen yet: nothing to fence
	}
	l := Loss{Node: id, Epoch: n.epoch, LastBeat: n.lastBeat, ConfirmedAt: now}
	// A disconnect or an expiry is a missing beat: judged only while
	// failover sees the heartbeats (see Observed).
	judge := d.judging(now)
	switch {
	case !n.failedAt.IsZero():
		l.Reason, l.SuspectedAt = ReasonFatalHealth, n.failedAt
	case judge && !n.disconnectedAt.IsZero() && !n.drained && !now.Before(n.disconnectDue(d.cfg.DisconnectGrace)):
		l.Reason, l.SuspectedAt = ReasonDisconnected, n.disconnectedAt
	case !n.deadline.IsZero() && !now.Before(n.deadline):
		l.Reason, l.SuspectedAt = ReasonDeadlinePassed, n.deadline
	case judge && !n.expiredAt.IsZero() && !n.drained && !now.Before(n.expiredAt.Add(d.cfg.Confirm)):
		l.Reason, l.SuspectedAt = ReasonHeartbeatExpired, n.expiredAt
	default:
		return Loss{}, false
	}
	return l, true
}

// NextWake is the earliest time after now at which Tick may decide
// something new; zero when nothing is pending.
func (d *Detector) NextWake(now time.Time) time.Time {
	var next time.Time
	consider := func(t time.Time) {
		if t.IsZero() {
			return
		}
		if t.Before(now) {
			t = now
		}
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	for _, n := range d.nodes {
		consider(n.until)
		if n.reported != 0 && n.reported >= n.epoch {
			continue
		}
		if !n.failedAt.IsZero() {
			consider(now)
		}
		if !n.disconnectedAt.IsZero() {
			consider(d.judgedBy(n.disconnectDue(d.cfg.DisconnectGrace)))
		}
		consider(n.deadline)
		if !n.expiredAt.IsZero() {
			consider(d.judgedBy(n.expiredAt.Add(d.cfg.Confirm)))
		}
	}
	return next
}

// LossesDueBy is the latest time, after now and at most by, at which a
// pending suspicion of a node whose epoch is known (a disconnect or an
// expiry) becomes a loss unless the node beats first; zero when none is
// due in that span. Agents killed together are found a few milliseconds
// apart: a caller that holds the moves of the first loss until then does
// not place rentals on nodes about to be found lost.
func (d *Detector) LossesDueBy(now, by time.Time) time.Time {
	var last time.Time
	for _, n := range d.nodes {
		if n.epoch == 0 || (n.reported != 0 && n.reported >= n.epoch) {
			continue
		}
		for _, due := range []time.Time{d.judgedBy(disconnectDueOf(n, d.cfg.DisconnectGrace)), d.judgedBy(expiryDueOf(n, d.cfg.Confirm))} {
			if due.After(now) && !due.After(by) && due.After(last) {
				last = due
			}
		}
	}
	return last
}

func disconnectDueOf(n *node, grace time.Duration) time.Time {
	if n.disconnectedAt.IsZero() || n.drained {
		return time.Time{}
	}
	return n.disconnectDue(grace)
}

func expiryDueOf(n *node, confirm time.Duration) time.Time {
	if n.expiredAt.IsZero() || n.drained {
		return time.Time{}
	}
	return n.expiredAt.Add(confirm)
}

// LastBeat is the last beat seen from node (zero if none).
func (d *Detector) LastBeat(id string) time.Time {
	if n := d.nodes[id]; n != nil {
		return n.lastBeat
	}
	return time.Time{}
}

// NodeFromClientName reads the node id out of a node agent's NATS
// connection name, "node-agent:<node>"; the disconnect advisory carries it.
func NodeFromClientName(name string) (string, bool) {
	id, ok := strings.CutPrefix(name, AgentClientPrefix)
	if !ok || id == "" || strings.ContainsAny(id, ".*> \t") {
		return "", false
	}
	return id, true
}

// AgentClientPrefix starts a node agent's connection name.
const AgentClientPrefix = "node-agent:"
