package app

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// limiter is one token bucket per API key id.
type limiter struct {
	every rate.Limit
	burst int
	mu    sync.Mutex
	keys  map[string]*rate.Limiter
}

func newLimiter(perSecond float64, burst int) *limiter {
	return &limiter{every: rate.Limit(perSecond), burst: burst, keys: map[string]*rate.Limiter{}}
}

// allow takes one token of key's bucket at now; when there is none it
// says how long until there is.
func (l *limiter) allow(key string, now time.Time) (time.Duration, bool) {
	l.mu.Lock()
	lim, ok := l.keys[key]
	if !ok {
		lim = rate.NewLimiter(l.every, l.burst)
		l.keys[key] = lim
	}
	l.mu.Unlock()
	res := lim.ReserveN(now, 1)
	if d := res.DelayFrom(now); d > 0 {
		res.CancelAt(now)
		return d, false
	}
	return 0, true
}
