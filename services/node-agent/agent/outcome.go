package agent

import (
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
)

// Outcome is how one run of a rental ended, as RentalStopped reports it.
type Outcome struct {
	Reason    shizuv1.ExitReason
	ExitCode  int32 // only for a workload that exited by itself
	StoppedAt time.Time
	Message   string // for the tenant: the signal, the last log line, the start error
}

// Ended is the outcome of r's workload that ended at stoppedAt with
// exitCode (-1 when killed or unwatched) and detail, after it was asked to
// stop for requested (unspecified when it was not): the reason by
// ExitReason, and never a stop before the start (a clock step must not
// make a negative run).
func Ended(r Rental, requested shizuv1.ExitReason, exitCode int, stoppedAt time.Time, detail string) Outcome {
	reason, code := ExitReason(requested, exitCode)
	return Outcome{Reason: reason, ExitCode: code, StoppedAt: latest(stoppedAt, r.StartedAt), Message: detail}
}

// FailedToStart is the outcome of a workload that never ran: a
// zero-length run at at (so the scheduler frees the capacity) that tells
// the tenant why.
func FailedToStart(at time.Time, err error) Outcome {
	return Outcome{Reason: shizuv1.ExitReason_EXIT_REASON_FAILED, ExitCode: -1, StoppedAt: at, Message: err.Error()}
}

func latest(a, b time.Time) time.Time {
	if a.Before(b) {
		return b
	}
	return a
}

// MaxStopGrace is the longest grace a StopRental may ask for: the stop
// must end within the command consumer's ack wait.
const MaxStopGrace = 20 * time.Second

// StopGrace is the time between the polite signal and the kill for cmd:
// the grace it asks for, at most MaxStopGrace, else def.
func StopGrace(cmd *shizuv1.StopRental, def time.Duration) time.Duration {
	if g := cmd.GetGracePeriod(); g != nil {
		return min(g.AsDuration(), MaxStopGrace)
	}
	return def
}
