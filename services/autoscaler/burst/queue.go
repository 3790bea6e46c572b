package burst

import "math"

// Queue is an M/M/c model of a pool: Poisson arrivals at rate Lambda (req/s),
// c = Servers identical slots each serving at rate Mu (1 / mean service
// time), first come first served, plus Offset seconds of extra waiting that
// every request sees (the fluid backlog left by an overload). Response time
// T = Offset + W + S, where W is the Erlang-C waiting time (0 with
// probability 1-C, else exponential with rate c·Mu-Lambda) and S the
// exponential service time.
type Queue struct {
	Lambda  float64
	Mu      float64
	Servers int
	Offset  float64
	erlangC float64
	theta   float64
}

// NewQueue precomputes the Erlang-C probability. Utilization must be below
// 1; callers cap it and carry the excess as a backlog (Offset).
func NewQueue(lambda, mu float64, servers int, offset float64) Queue {
	q := Queue{Lambda: lambda, Mu: mu, Servers: servers, Offset: offset}
	if servers <= 0 || lambda <= 0 {
		q.theta = math.Inf(1)
		return q
	}
	q.erlangC = ErlangC(servers, lambda/mu)
	q.theta = float64(servers)*mu - lambda
	return q
}

// ErlangC is the probability that an arrival waits in an M/M/c queue with
// c servers and offered load a = lambda/mu (< c), computed through the
// numerically stable Erlang-B recursion.
func ErlangC(c int, a float64) float64 {
	if a <= 0 {
		return 0
	}
	if a >= float64(c) {
		return 1
	}
	b := 1.0
	for k := 1; k <= c; k++ {
		b = a * b / (float64(k) + a*b)
	}
	rho := a / float64(c)
	return b / (1 - rho*(1-b))
}

// Tail is P(T > t).
func (q Queue) Tail(t float64) float64 {
	if t < q.Offset {
		return 1
	}
	t -= q.Offset
	mu := q.Mu
	service := math.Exp(-mu * t)
	if q.erlangC == 0 || math.IsInf(q.theta, 1) {
		return service
	}
	th := q.theta
	var waitThenServe float64
	if math.Abs(th-mu) < 1e-9*mu {
		waitThenServe = (1 + mu*t) * math.Exp(-mu*t)
	} else {
		waitThenServe = (th*math.Exp(-mu*t) - mu*math.Exp(-th*t)) / (th - mu)
	}
	return (1-q.erlangC)*service + q.erlangC*waitThenServe
}

// Mean is E[T].
func (q Queue) Mean() float64 {
	m := q.Offset + 1/q.Mu
	if q.erlangC > 0 && !math.IsInf(q.theta, 1) {
		m += q.erlangC / q.theta
	}
	return m
}

// Quantile is the p-quantile of T (e.g. 0.99), by bisection on Tail.
func (q Queue) Quantile(p float64) float64 {
	return quantile(func(t float64) float64 { return q.Tail(t) }, p)
}

// quantile finds t with tail(t) = 1-p for a non-increasing tail.
func quantile(tail func(float64) float64, p float64) float64 {
	target := 1 - p
	lo, hi := 0.0, 0.01
	for tail(hi) > target {
		lo, hi = hi, hi*2
		if hi > 1e6 {
			return hi
		}
	}
	for range 60 {
		mid := (lo + hi) / 2
		if tail(mid) > target {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi
}
