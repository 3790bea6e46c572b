package simgpu

import (
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/shizu-gpu/shizu/services/node-agent/gpu"
)

// SignalReason is the reason of a notice delivered by NoticeOnSignal.
const SignalReason = "simulated spot reclaim (SIGUSR1)"

// NoticeOnSignal plays the cloud provider of the simulated host: from now
// until stop is called, each of sigs (the agent uses SIGUSR1) delivers a
// spot interruption notice on the host's Notices whose deadline is lead
// after now(). Catching a signal replaces its default action (SIGUSR1's
// ends the process) from the moment NoticeOnSignal returns. stop returns
// once the signals are released. A real host has no such way in: its
// notices come from the provider only.
func (f *Fleet) NoticeOnSignal(lead time.Duration, now func() time.Time, log *slog.Logger, sigs ...os.Signal) (stop func()) {
	caught := make(chan os.Signal, 1)
	signal.Notify(caught, sigs...)
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		defer signal.Stop(caught)
		for {
			select {
			case <-done:
				return
			case <-caught:
				n := gpu.Notice{Deadline: now().Add(lead), Reason: SignalReason}
				log.Info("simulated spot interruption notice", "deadline", n.Deadline)
				select {
				case f.notices <- n:
				case <-done:
					return
				}
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(done) })
		<-exited
	}
}
