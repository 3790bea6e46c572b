package simgpu_test

import (
	"log/slog"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/services/node-agent/gpu/simgpu"
)

func TestASignalDeliversASpotNoticeWithTheLeadAheadOfTheClock(t *testing.T) {
	t.Parallel()
	f, h := open(t, "h100x8", 1)
	at := time.Date(2026, 11, 30, 15, 0, 0, 0, time.UTC)
	stop := f.NoticeOnSignal(45*time.Second, func() time.Time { return at }, slog.New(slog.DiscardHandler), syscall.SIGUSR2)
	defer stop()
	if err := syscall.Kill(os.Getpid(), syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-h.Notices():
		if !n.Deadline.Equal(at.Add(45*time.Second)) || n.Reason != simgpu.SignalReason {
			t.Fatalf("notice = %+v, want one 45 s after %s", n, at)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no notice 10 s after the signal")
	}
}

func TestStoppingTheSignalSourceReturnsEvenWhenNoOneReadsTheNotices(t *testing.T) {
	t.Parallel()
	f, _ := open(t, "h100x8", 2)
	stop := f.NoticeOnSignal(time.Minute, time.Now, slog.New(slog.DiscardHandler), syscall.SIGUSR2)
	// Fill the notice buffer so a further signal's notice would block.
	for range 4 {
		if err := f.NoticeInterruption(t.Context(), time.Now(), "filler"); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		stop()
		stop() // a second stop is harmless
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("stop blocked on an unread notice")
	}
}
