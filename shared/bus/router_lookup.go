package bus

// Lookup names the event a delivery carries (its Shizu-Event header, or
// the event registered for its subject with EventForSubject) and returns
// its handler, nil when none is registered. A batch handler uses it to
// give deliveries it does not batch to the handlers a Router holds.
func (r *Router) Lookup(d Delivery) (string, HandlerFunc) { return r.route(d) }
