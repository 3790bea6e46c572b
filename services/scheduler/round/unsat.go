package round

import (
	"fmt"
	"time"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/view"
)

// Unsatisfiable is the judgement of a request that fits nowhere now:
// whether no registered node and no instance type the autoscaler may
// provision could ever hold it.
type Unsatisfiable struct {
	// Reject: the request can never be placed; Why names the constraint.
	Reject bool
	Why    string
	// Note is what the tenant is told while the request waits although
	// it looks unsatisfiable (the fleet may still be registering, or
	// there is no fleet to judge against yet); "" when nothing.
	Note string
}

// Judge decides whether a request r that fits nowhere now is rejected as
// unsatisfiable at now: every node of the view (the store's registered
// nodes, on their whole shape) and every offer in cfg.Offers are judged
// with placement.Unsatisfiable. Before cfg.JudgeFrom (the fleet may still
// be registering: nodes register after the scheduler starts) nothing is
// rejected, and a request that would be waits with a note naming the
// constraint. With no node and no offer nothing is judged: the request
// waits with a note saying so, and is rejected only by its pending timeout.
func Judge(v *view.View, r *placement.Request, now time.Time, cfg Config) Unsatisfiable {
	fleet := placement.Fleet{Nodes: v.Cluster().Nodes, Offers: cfg.Offers}
	if fleet.Empty() {
		return Unsatisfiable{Note: "no node has registered and the autoscaler offers no instance type"}
	}
	why := placement.Unsatisfiable(r, &fleet, cfg.Placer.Catalogue())
	switch {
	case why == "":
		return Unsatisfiable{}
	case now.Before(cfg.JudgeFrom):
		return Unsatisfiable{Why: why, Note: fmt.Sprintf("%s; not rejected before %s, while nodes may still be registering",
			why, cfg.JudgeFrom.UTC().Format(time.RFC3339))}
	}
	return Unsatisfiable{Reject: true, Why: why}
}
