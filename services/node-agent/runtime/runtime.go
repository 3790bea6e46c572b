// Package runtime runs rental workloads on the node. Runtime is the
// interface the agent uses, so a container runtime can be added later;
// Process runs each workload as a child process group.
package runtime

import (
	"context"
	"errors"
	"time"
)

// Spec is one workload to run: a placement attempt of a rental.
type Spec struct {
	RentalID string
	TenantID string
	Attempt  int32
	Epoch    int64
	// GPUUUIDs are the GPU or MIG UUIDs the workload sees.
	GPUUUIDs []string
	// MilliGPU is the share of each of those GPUs, 1..1000.
	MilliGPU int32
	// Shares, CPUMilli and MemoryMiB are what the placement reserved for
	// the workload, kept with its record so that an agent (a later one,
	// after a restart) can put the allocation back into a capacity store
	// that lost it. Records written before they were kept have none.
	Shares    []Share
	CPUMilli  int64
	MemoryMiB int64
	// Command is the argv to run.
	Command []string
	// Env is added to a minimal environment (PATH, HOME, LANG); the agent's
	// own environment (credentials) is never passed on.
	Env map[string]string
}

// Share is the part of one GPU a workload was placed on.
type Share struct {
	Index       int
	Milli       int64
	VRAMMiB     int64
	MIGProfile  string `json:",omitempty"`
	MIGInstance string `json:",omitempty"`
}

// Workload is a started workload.
type Workload struct {
	Spec      Spec
	PID       int
	StartedAt time.Time // by the agent's clock, right after the start
	LogPath   string
	// Adopted is true for a workload found running at start (left by an
	// earlier agent process).
	Adopted bool
}

// Exit is how a workload ended.
type Exit struct {
	Workload Workload
	// StoppedAt is StartedAt plus the run's monotonic duration, never
	// before StartedAt whatever the wall clock did.
	StoppedAt time.Time
	// ExitCode is the process's exit code, also for a workload adopted
	// after an agent restart (its status shell recorded it); -1 when it was
	// killed by a signal, or when its status is unknown (the status shell
	// was SIGKILLed with it, or the record predates status files).
	ExitCode int
	// Detail is for the tenant: the signal, or the last log line.
	Detail string
}

// ErrNotRunning means no such workload runs.
var ErrNotRunning = errors.New("workload not running")

// Runtime starts, stops and lists workloads. Every workload's end is
// reported exactly once on Exits, whether it stopped by itself or was
// stopped; Forget then drops its record.
type Runtime interface {
	// Start runs spec. Starting a rental that already runs returns the
	// running workload and changes nothing.
	Start(ctx context.Context, spec Spec) (Workload, error)
	// Stop asks the workload to stop (a polite signal), kills it after
	// grace, and returns once it has ended.
	Stop(ctx context.Context, rentalID string, grace time.Duration) error
	// List returns the running workloads.
	List() []Workload
	// Exits reports ended workloads.
	Exits() <-chan Exit
	// Forget drops an ended workload's record, once its end was reported.
	Forget(rentalID string) error
	// Close stops watching; workloads keep running (an agent restart must
	// not kill tenants' work).
	Close() error
}
