package app_test

import (
	"sync"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// steppedClock is a wall clock that an operator (or NTP) can step: its
// readings carry no monotonic part (Round(0)), as a wall clock read after
// a step looks.
type steppedClock struct {
	mu     sync.Mutex
	offset time.Duration
}

func (c *steppedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset).Round(0)
}

func (c *steppedClock) Step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset += d
}

// checkDuration fails unless stopped runs from started for at least least
// and at most most (what the test itself measured around the run).
func checkDuration(t *testing.T, started *shizuv1.RentalStarted, stopped *shizuv1.RentalStopped, least, most time.Duration) {
	t.Helper()
	from, to := stopped.GetStartedAt().AsTime(), stopped.GetStoppedAt().AsTime()
	if !from.Equal(started.GetStartedAt().AsTime()) {
		t.Fatalf("stopped says started at %v, the start said %v", from, started.GetStartedAt().AsTime())
	}
	if to.Before(from) {
		t.Fatalf("stopped_at %v is before started_at %v", to, from)
	}
	if d := to.Sub(from); d < least || d > most {
		t.Fatalf("the run lasted %v by its timestamps; it ran at least %v and at most %v", d, least, most)
	}
}

// A wall clock stepped back during a short rental must not make a stop
// before the start (which every consumer refuses) nor a zero-length run:
// the stop is the start plus the time that really passed.
func TestAWallClockSteppedBackDuringARentalStillGivesTheRunItsTrueDuration(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := t.TempDir()
	killWorkloads(t, dir)
	clock := &steppedClock{}
	cfg := e.config(t, "n-clock", "rtx4090x8", dir)
	cfg.Now = clock.Now
	e.start(t, cfg)
	e.registered(t, "n-clock", 1)

	before := time.Now()
	e.send(t, "n-clock", "start", e.place(t, "n-clock", 1, "r-clock", 1000, 0, "sh", "-c", "sleep 0.6"))
	started := await(t, e, topology.StreamRentals, "rental.acme.started", func(ev *shizuv1.RentalStarted) error { return nil })
	clock.Step(-time.Hour)
	stopped := stoppedOf(t, e, "r-clock")
	if err := stopped.Validate(); err != nil {
		t.Fatal(err)
	}
	checkDuration(t, started, stopped, 500*time.Millisecond, time.Since(before)) // a 0.6 s sleep, less its own start
}

// The same across an agent restart: the second agent's wall clock is an
// hour behind the first's, and the workload it adopted still ends after
// it started, with the time it really ran.
func TestAWallClockSteppedBackAcrossAnAgentRestartStillGivesTheRunItsTrueDuration(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := t.TempDir()
	killWorkloads(t, dir)
	first := e.start(t, e.config(t, "n-clock2", "rtx4090x8", dir))
	e.registered(t, "n-clock2", 1)

	before := time.Now()
	e.send(t, "n-clock2", "start", e.place(t, "n-clock2", 1, "r-clock2", 1000, 0, "sh", "-c", "sleep 2"))
	started := await(t, e, topology.StreamRentals, "rental.acme.started", func(ev *shizuv1.RentalStarted) error { return nil })
	first.stop(t)

	clock := &steppedClock{}
	clock.Step(-time.Hour)
	cfg := e.config(t, "n-clock2", "rtx4090x8", dir)
	cfg.Now = clock.Now
	e.start(t, cfg)
	stopped := stoppedOf(t, e, "r-clock2")
	if err := stopped.Validate(); err != nil {
		t.Fatal(err)
	}
	checkDuration(t, started, stopped, 1800*time.Millisecond, time.Since(before)) // a 2 s sleep, less its own start
}
