package service_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/shared/service"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

func TestLoopCallsItsFunctionEveryPeriodUntilStopped(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	l := service.StartLoop(t.Context(), time.Millisecond, func(ctx context.Context, now time.Time) {
		if now.IsZero() {
			t.Error("tick without a time")
		}
		calls.Add(1)
	})
	testkit.Eventually(t, 5*time.Second, func() error {
		if calls.Load() < 3 {
			return errors.New("fewer than 3 ticks")
		}
		return nil
	})
	if err := l.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	stopped := calls.Load()
	// A stopped loop calls nothing more: after Stop returned, the count
	// stays put while a later loop ticks many times.
	var later atomic.Int64
	l2 := service.StartLoop(t.Context(), time.Millisecond, func(context.Context, time.Time) { later.Add(1) })
	testkit.Eventually(t, 5*time.Second, func() error {
		if later.Load() < 5 {
			return errors.New("fewer than 5 ticks")
		}
		return nil
	})
	if err := l2.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := calls.Load(); got != stopped {
		t.Errorf("%d calls after Stop", got-stopped)
	}
}

func TestLoopStopWaitsForTheCallInProgressWithinItsContext(t *testing.T) {
	t.Parallel()
	entered := make(chan struct{})
	release := make(chan struct{})
	var once atomic.Bool
	l := service.StartLoop(t.Context(), time.Millisecond, func(ctx context.Context, _ time.Time) {
		if once.CompareAndSwap(false, true) {
			close(entered)
			<-release
		}
	})
	<-entered
	short, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if err := l.Stop(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop with a call in progress = %v, want the deadline", err)
	}
	close(release)
	if err := l.Stop(t.Context()); err != nil {
		t.Fatalf("Stop after the call finished: %v", err)
	}
}
