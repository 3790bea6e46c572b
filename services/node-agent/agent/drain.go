package agent

import "time"

// Drain is a node's drain: whether the node takes no new work, since when
// and why, and whether NodeDrained went out for it.
type Drain struct {
	Active    bool
	StartedAt time.Time
	Reason    string
	Announced bool
}

// RestartReason is the drain reason of a node found draining when its
// agent (re)registers, when this agent did not start the drain itself.
const RestartReason = "draining before the agent restarted"

// Begin starts draining at now for reason; a drain in progress keeps its
// start and reason.
func (d *Drain) Begin(now time.Time, reason string) {
	if !d.Active {
		d.Active, d.StartedAt, d.Reason = true, now, reason
	}
}

// Registered applies a (re)registration at now: the store says whether
// the node is draining (a drain outlives a restart of its agent), and a
// new registration is owed a NodeDrained of its own.
func (d *Drain) Registered(draining bool, now time.Time) {
	d.Announced = false
	d.Active = draining
	if d.Active && d.StartedAt.IsZero() {
		d.StartedAt, d.Reason = now, RestartReason
	}
}

// Due reports whether NodeDrained is owed now that running workloads run:
// the node drains, has not announced it, and runs nothing. (The store must
// also hold no allocation of the node; the caller checks that.)
func (d Drain) Due(running int) bool {
	return d.Active && !d.Announced && running == 0
}
