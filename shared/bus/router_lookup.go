package bus

// Lookup names the event a delivery carries (the one its subject carries,
// which a Shizu-Event header must agree with) and returns its handler. For
// a delivery the router cannot use (no type, a contradicting header, no
// handler) the handler returned dead-letters it with the reason, and the
// event is "" unless only the handler was missing. A batch handler uses it
// to give deliveries it does not batch to the handlers a Router holds.
func (r *Router) Lookup(d Delivery) (string, HandlerFunc) { return r.route(d) }
