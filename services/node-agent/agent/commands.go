package agent

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
)

// Rental is a workload this node runs (or ran) for one placement attempt.
type Rental struct {
	RentalID  string
	TenantID  string
	Attempt   int32
	Epoch     int64
	GPUUUIDs  []string // what CUDA_VISIBLE_DEVICES lists (GPU or MIG UUIDs)
	MilliGPU  int32    // share of each of those GPUs
	StartedAt time.Time
	// Shares, CPUMilli and MemoryMiB are the placement's reservation, for
	// a restore into a capacity store that lost it (none for a workload
	// recorded before they were kept).
	Shares    []Share
	CPUMilli  int64
	MemoryMiB int64
}

// Share is the part of one GPU a rental was placed on.
type Share struct {
	Index       int
	Milli       int64
	VRAMMiB     int64
	MIGProfile  string
	MIGInstance string
}

// State is what the agent knows when it decides on a command.
type State struct {
	NodeID   string
	Epoch    int64
	Draining bool
	// GPUs by index: the physical UUID, the MIG instance UUIDs on it and
	// its health.
	GPUs    []GPUState
	Running map[string]Rental // by rental id
}

// GPUState is one GPU as the decisions need it.
type GPUState struct {
	UUID   string
	MIG    []string
	Health shizuv1.Health
}

// Verdict is what to do with a command.
type Verdict int

// Verdicts.
const (
	// Run: carry the command out.
	Run Verdict = iota + 1
	// AlreadyDone: it was carried out before (a redelivery); re-announce
	// the outcome, change nothing.
	AlreadyDone
	// Skip: it no longer applies (stale epoch or attempt, nothing to stop,
	// a draining node, a failed GPU); acknowledge it and change nothing.
	Skip
	// Invalid: it cannot apply to this node at all (wrong node, GPUs that
	// are not here); dead-letter it.
	Invalid
	// Retry: this agent is behind (a newer epoch than it knows); retry
	// later.
	Retry
)

// String is the verdict as the shizu.outcome label of
// shizu.agent.commands: run, already_done, skipped, invalid, retry.
func (v Verdict) String() string {
	switch v {
	case Run:
		return "run"
	case AlreadyDone:
		return "already_done"
	case Skip:
		return "skipped"
	case Invalid:
		return "invalid"
	case Retry:
		return "retry"
	}
	return ""
}

// Decision is a verdict with its reason.
type Decision struct {
	Verdict Verdict
	Reason  string
}

func decide(v Verdict, format string, args ...any) Decision {
	return Decision{Verdict: v, Reason: fmt.Sprintf(format, args...)}
}

// DecideStart decides on a StartRental: it must be for this node and its
// current epoch, name GPUs (and MIG instances) that are here and not
// failed, and arrive while the node takes work.
func DecideStart(s State, cmd *shizuv1.StartRental) Decision {
	sc := cmd.GetScheduled()
	if sc.GetNodeId() != s.NodeID {
		return decide(Invalid, "placement is for node %q, this is %q", sc.GetNodeId(), s.NodeID)
	}
	if r, ok := s.Running[sc.GetRentalId()]; ok {
		switch {
		case r.Attempt == sc.GetAttempt():
			return decide(AlreadyDone, "attempt %d already runs", r.Attempt)
		case r.Attempt > sc.GetAttempt():
			return decide(Skip, "attempt %d is older than the running attempt %d", sc.GetAttempt(), r.Attempt)
		default:
			return decide(Retry, "attempt %d still runs; attempt %d waits for its stop", r.Attempt, sc.GetAttempt())
		}
	}
	switch {
	case sc.GetNodeEpoch() < s.Epoch:
		return decide(Skip, "placement made against epoch %d; the node is at epoch %d (fenced since)", sc.GetNodeEpoch(), s.Epoch)
	case sc.GetNodeEpoch() > s.Epoch:
		return decide(Retry, "placement made against epoch %d, newer than this agent's %d", sc.GetNodeEpoch(), s.Epoch)
	case s.Draining:
		return decide(Skip, "node is draining and takes no new work")
	}
	for i, a := range sc.GetGpus() {
		idx := int(a.GetGpuIndex())
		if idx >= len(s.GPUs) {
			return decide(Invalid, "gpus[%d]: node has no GPU %d", i, idx)
		}
		g := s.GPUs[idx]
		if g.UUID != a.GetGpuUuid() {
			return decide(Invalid, "gpus[%d]: GPU %d is %s, not %s", i, idx, g.UUID, a.GetGpuUuid())
		}
		if mig := a.GetMigInstance(); mig != nil && !slices.Contains(g.MIG, mig.GetUuid()) {
			return decide(Invalid, "gpus[%d]: GPU %d has no MIG instance %s", i, idx, mig.GetUuid())
		}
		if g.Health == shizuv1.Health_HEALTH_FAILED {
			return decide(Skip, "GPU %d has failed", idx)
		}
	}
	return Decision{Verdict: Run}
}

// DecideStop decides on a StopRental: stop the running attempt it names;
// an older attempt or a rental not running here is skipped.
func DecideStop(s State, cmd *shizuv1.StopRental) Decision {
	if cmd.GetNodeId() != s.NodeID {
		return decide(Invalid, "stop is for node %q, this is %q", cmd.GetNodeId(), s.NodeID)
	}
	r, ok := s.Running[cmd.GetRentalId()]
	switch {
	case !ok:
		return decide(Skip, "rental does not run here")
	case cmd.GetAttempt() < r.Attempt:
		return decide(Skip, "stop for attempt %d; attempt %d runs", cmd.GetAttempt(), r.Attempt)
	}
	return Decision{Verdict: Run}
}

// DecideDrain decides on a DrainNode: it applies to this node's current
// epoch only; a repeated drain is already done.
func DecideDrain(s State, cmd *shizuv1.DrainNode) Decision {
	switch {
	case cmd.GetNodeId() != s.NodeID:
		return decide(Invalid, "drain is for node %q, this is %q", cmd.GetNodeId(), s.NodeID)
	case cmd.GetEpoch() < s.Epoch:
		return decide(Skip, "drain for epoch %d; the node is at epoch %d", cmd.GetEpoch(), s.Epoch)
	case cmd.GetEpoch() > s.Epoch:
		return decide(Retry, "drain for epoch %d, newer than this agent's %d", cmd.GetEpoch(), s.Epoch)
	case s.Draining:
		return decide(AlreadyDone, "already draining")
	}
	return Decision{Verdict: Run}
}

// WorkloadEnv is the environment that confines a workload to its GPUs:
// CUDA_VISIBLE_DEVICES (and NVIDIA_VISIBLE_DEVICES for containers) list the
// assigned MIG instance or GPU UUIDs; a fraction of one GPU also gets the
// CUDA MPS limits: the share of SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE,
// milli-GPU rounded up to a whole percent) and of memory
// (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, for device 0 as the workload sees it).
func WorkloadEnv(sc *shizuv1.RentalScheduled) (env map[string]string, uuids []string) {
	for _, a := range sc.GetGpus() {
		if mig := a.GetMigInstance(); mig != nil {
			uuids = append(uuids, mig.GetUuid())
		} else {
			uuids = append(uuids, a.GetGpuUuid())
		}
	}
	visible := strings.Join(uuids, ",")
	env = map[string]string{
		"CUDA_VISIBLE_DEVICES":   visible,
		"NVIDIA_VISIBLE_DEVICES": visible,
		"SHIZU_RENTAL_ID":        sc.GetRentalId(),
		"SHIZU_TENANT_ID":        sc.GetTenantId(),
		"SHIZU_ATTEMPT":          strconv.Itoa(int(sc.GetAttempt())),
	}
	if ck := sc.GetSpec().GetCheckpointUri(); ck != "" {
		env["SHIZU_CHECKPOINT_URI"] = ck
	}
	gpus := sc.GetGpus()
	if len(gpus) == 1 && gpus[0].GetMilliGpu() < 1000 && gpus[0].GetMigInstance() == nil {
		pct := (gpus[0].GetMilliGpu() + 9) / 10
		env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = strconv.Itoa(int(max(1, pct)))
		if vram := gpus[0].GetVramMib(); vram > 0 {
			env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = fmt.Sprintf("0=%dM", vram)
		}
	}
	return env, uuids
}

// Allocation is what the capacity store says about a running rental.
type Allocation int

// Allocation states.
const (
	// AllocationValid: the rental may keep running.
	AllocationValid Allocation = iota + 1
	// AllocationFenced: the node was fenced since the rental started; it is
	// a zombie (failover has moved or will move it).
	AllocationFenced
	// AllocationGone: the allocation was released (the rental ended
	// elsewhere, or was cancelled while the agent was away).
	AllocationGone
)

// Stop is a workload to stop and why.
type Stop struct {
	Rental  Rental
	Reason  shizuv1.ExitReason
	Message string
}

// Reconcile returns the workloads that must stop given what the store says
// of each (a workload the store says nothing of is treated as gone): a
// zombie never keeps running or billing.
func Reconcile(running []Rental, store map[string]Allocation) []Stop {
	var stops []Stop
	for _, r := range running {
		switch store[r.RentalID] {
		case AllocationValid:
		case AllocationFenced:
			stops = append(stops, Stop{Rental: r, Reason: shizuv1.ExitReason_EXIT_REASON_NODE_FAILED,
				Message: "node was fenced while the rental ran; the rental moves elsewhere"})
		default:
			stops = append(stops, Stop{Rental: r, Reason: shizuv1.ExitReason_EXIT_REASON_CANCELLED,
				Message: "the rental's allocation no longer exists"})
		}
	}
	slices.SortFunc(stops, func(a, b Stop) int { return strings.Compare(a.Rental.RentalID, b.Rental.RentalID) })
	return stops
}

// ExitReason says why a workload ended: the reason it was asked to stop
// for, else completed on exit code 0 and failed otherwise. The exit code is
// reported only for a workload that exited by itself.
func ExitReason(requested shizuv1.ExitReason, exitCode int) (shizuv1.ExitReason, int32) {
	if requested != shizuv1.ExitReason_EXIT_REASON_UNSPECIFIED {
		return requested, 0
	}
	if exitCode == 0 {
		return shizuv1.ExitReason_EXIT_REASON_COMPLETED, 0
	}
	return shizuv1.ExitReason_EXIT_REASON_FAILED, int32(exitCode)
}
