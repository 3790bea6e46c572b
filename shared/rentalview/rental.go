// Package rentalview is the rental read model: a projection of the RENTALS
// stream into one KV record per (tenant, rental), kept current by a durable
// consumer (Projector.Run) and rebuildable from the stream (Rebuild). Get,
// List and Watch read the bucket, so they cost the same whatever the length
// of the stream's history. Apply, the fold of one event, is pure.
package rentalview

import (
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
)

// Rental states.
const (
	StateRequested = "requested"
	StatePending   = "pending"
	StateRejected  = "rejected"
	StateScheduled = "scheduled"
	StateRunning   = "running"
	StateStopping  = "stopping"
	StatePreempted = "preempted"
	StateMigrating = "migrating"
	StateStopped   = "stopped"
)

// Step is one line of a rental's timeline.
type Step struct {
	At     time.Time `json:"at"`
	Event  string    `json:"event"`
	Detail string    `json:"detail,omitempty"`
}

// Segment is one run of a rental on one node (one attempt).
type Segment struct {
	Attempt   int32      `json:"attempt"`
	Node      string     `json:"node"`
	StartedAt time.Time  `json:"started_at"`
	StoppedAt *time.Time `json:"stopped_at,omitempty"`
	Reason    string     `json:"exit_reason,omitempty"`
}

// Rental is a rental as its events tell it.
type Rental struct {
	ID          string            `json:"rental_id"`
	Tenant      string            `json:"tenant_id"`
	State       string            `json:"state"`
	Why         string            `json:"why,omitempty"`
	Node        string            `json:"node,omitempty"`
	GPUs        []int32           `json:"gpus,omitempty"`
	Model       string            `json:"model,omitempty"`
	Plan        string            `json:"plan,omitempty"`
	Shape       string            `json:"shape,omitempty"`
	GPUCount    int32             `json:"gpu_count,omitempty"`
	MilliGPU    int32             `json:"milli_gpu,omitempty"`
	VRAMMiB     int64             `json:"vram_mib,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Attempt     int32             `json:"attempt,omitempty"`
	RequestedAt time.Time         `json:"requested_at,omitzero"`
	UpdatedAt   time.Time         `json:"updated_at,omitzero"`
	Since       time.Time         `json:"since"`
	Segments    []Segment         `json:"segments,omitempty"`
	Timeline    []Step            `json:"timeline"`
	// Seq is the RENTALS stream sequence of the last event applied (0 for
	// a fold of events read without one).
	Seq uint64 `json:"seq"`
}

// Folds says whether msg is a rental event Apply folds.
func Folds(msg proto.Message) bool {
	switch msg.(type) {
	case *shizuv1.RentalRequested, *shizuv1.RentalPending, *shizuv1.RentalRejected, *shizuv1.RentalScheduled,
		*shizuv1.RentalStarted, *shizuv1.RentalCancelRequested, *shizuv1.RentalPreempted, *shizuv1.RentalMigrating,
		*shizuv1.RentalMigrated, *shizuv1.RentalStopped:
		return true
	}
	return false
}

// Apply folds one event of the rental r, which occurred at at. Events of
// other kinds change nothing. It does not touch r.Seq.
func Apply(r *Rental, msg proto.Message, at time.Time) {
	if !Folds(msg) {
		return
	}
	if at.After(r.UpdatedAt) {
		r.UpdatedAt = at
	}
	switch m := msg.(type) {
	case *shizuv1.RentalRequested:
		r.requested(m.GetSpec(), at)
	case *shizuv1.RentalPending:
		why := withMessage(enumWord(m.GetReason().String(), "PENDING_REASON_"), m.GetMessage())
		if r.State == StateRequested || r.State == StatePending || r.State == StateMigrating || r.State == "" {
			r.setState(StatePending, why, at)
		}
		r.add(at, "pending", why)
	case *shizuv1.RentalRejected:
		why := withMessage(enumWord(m.GetReason().String(), "REJECT_REASON_"), m.GetMessage())
		r.setState(StateRejected, why, at)
		r.add(at, "rejected", why)
	case *shizuv1.RentalScheduled:
		r.scheduled(m, at)
	case *shizuv1.RentalStarted:
		r.Segments = append(r.Segments, Segment{Attempt: m.GetAttempt(), Node: m.GetNodeId(), StartedAt: ts(m.GetStartedAt())})
		if m.GetAttempt() == r.Attempt && r.State != StateStopped {
			r.setState(StateRunning, "", at)
		}
		r.add(ts(m.GetStartedAt()), "started", fmt.Sprintf("on %s, attempt %d", m.GetNodeId(), m.GetAttempt()))
	case *shizuv1.RentalCancelRequested:
		if r.State != StateStopped && r.State != StateRejected {
			r.setState(StateStopping, "cancel requested", at)
		}
		r.add(at, "cancel requested", "by "+m.GetRequestedBy())
	case *shizuv1.RentalPreempted:
		why := enumWord(m.GetReason().String(), "PREEMPT_REASON_")
		if r.State != StateStopped {
			r.setState(StatePreempted, why, at)
		}
		r.add(at, "preempted", fmt.Sprintf("on %s: %s", m.GetNodeId(), why))
	case *shizuv1.RentalMigrating:
		why := enumWord(m.GetReason().String(), "MIGRATION_REASON_")
		if r.State != StateStopped {
			r.setState(StateMigrating, "from "+m.GetFromNodeId()+": "+why, at)
		}
		r.add(at, "migrating", fmt.Sprintf("from %s: %s", m.GetFromNodeId(), why))
	case *shizuv1.RentalMigrated:
		if r.State == StateMigrating || r.State == StateScheduled {
			r.setState(StateRunning, "", at)
		}
		r.add(at, "migrated", fmt.Sprintf("%s -> %s, down %s", m.GetFromNodeId(), m.GetToNodeId(), m.GetDowntime().AsDuration().Round(time.Millisecond)))
	case *shizuv1.RentalStopped:
		r.stopped(m, at)
	}
}

// requested folds the request: what is asked for.
func (r *Rental) requested(s *shizuv1.RentalSpec, at time.Time) {
	r.spec(s)
	r.Since, r.RequestedAt = at, at
	if r.State == "" {
		r.State = StateRequested
	}
	r.add(at, "requested", r.Shape+", "+r.Plan)
}

// spec copies what a spec asks for.
func (r *Rental) spec(s *shizuv1.RentalSpec) {
	r.Plan, r.Shape = PlanName(s.GetPlan()), Shape(s)
	r.GPUCount, r.MilliGPU, r.VRAMMiB = s.GetGpuCount(), s.GetMilliGpu(), s.GetVramMib()
	if len(s.GetLabels()) > 0 {
		r.Labels = make(map[string]string, len(s.GetLabels()))
		for k, v := range s.GetLabels() {
			r.Labels[k] = v
		}
	}
}

// scheduled folds a placement; one of an earlier attempt is stale.
func (r *Rental) scheduled(m *shizuv1.RentalScheduled, at time.Time) {
	if m.GetAttempt() < r.Attempt {
		return
	}
	prevModel := r.Model
	r.Attempt, r.Node, r.Model = m.GetAttempt(), m.GetNodeId(), m.GetGpuModel()
	r.GPUs = r.GPUs[:0]
	for _, g := range m.GetGpus() {
		r.GPUs = append(r.GPUs, g.GetGpuIndex())
	}
	if r.Plan == "" {
		r.spec(m.GetSpec())
	}
	r.setState(StateScheduled, "", at)
	detail := fmt.Sprintf("on %s GPU %s (%s), attempt %d", m.GetNodeId(), joinInts(r.GPUs), m.GetGpuModel(), m.GetAttempt())
	if prevModel != "" && prevModel != r.Model {
		detail += "; model changed from " + prevModel // a move onto another model
	}
	r.add(at, "scheduled", detail)
}

// stopped folds the end of a run: it closes the attempt's segment, and
// ends the rental unless an earlier placement ended or the run stopped to
// move.
func (r *Rental) stopped(m *shizuv1.RentalStopped, at time.Time) {
	reason := enumWord(m.GetExitReason().String(), "EXIT_REASON_")
	stopped := ts(m.GetStoppedAt())
	for i := range r.Segments {
		if s := &r.Segments[i]; s.Attempt == m.GetAttempt() && s.StoppedAt == nil {
			s.StoppedAt, s.Reason = &stopped, reason
		}
	}
	detail := fmt.Sprintf("on %s, attempt %d: %s", m.GetNodeId(), m.GetAttempt(), reason)
	if m.GetMessage() != "" {
		detail += " (" + m.GetMessage() + ")"
	}
	r.add(stopped, "stopped", detail)
	if m.GetAttempt() < r.Attempt || r.State == StateMigrating {
		return // an earlier placement ended; the rental lives on
	}
	why := withMessage(reason, m.GetMessage())
	switch m.GetExitReason() {
	case shizuv1.ExitReason_EXIT_REASON_MIGRATED, shizuv1.ExitReason_EXIT_REASON_NODE_FAILED:
		r.setState(StateMigrating, why, at)
	default:
		r.setState(StateStopped, why, at)
	}
}

func (r *Rental) setState(s, why string, at time.Time) {
	r.State, r.Why, r.Since = s, why, at
}

func (r *Rental) add(at time.Time, ev, detail string) {
	r.Timeline = append(r.Timeline, Step{At: at, Event: ev, Detail: detail})
}

// Shape says what a spec asks for, briefly: "2x GPU NVLink", "0.25 GPU 20480MiB", "MIG 1g.10gb".
func Shape(s *shizuv1.RentalSpec) string {
	if s == nil {
		return ""
	}
	var b strings.Builder
	switch {
	case s.GetMigProfile() != "":
		b.WriteString("MIG " + s.GetMigProfile())
	case s.GetMilliGpu() < 1000:
		fmt.Fprintf(&b, "%s GPU", milliString(s.GetMilliGpu()))
	default:
		fmt.Fprintf(&b, "%dx GPU", s.GetGpuCount())
	}
	if s.GetInterconnect() == shizuv1.Interconnect_INTERCONNECT_NVLINK {
		b.WriteString(" NVLink")
	}
	if s.GetVramMib() > 0 {
		fmt.Fprintf(&b, " %dMiB", s.GetVramMib())
	}
	if s.GetTeeRequired() {
		b.WriteString(" TEE")
	}
	return b.String()
}

// PlanName is a plan as people write it: "on-demand", "spot".
func PlanName(p shizuv1.Plan) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(p.String(), "PLAN_")), "_", "-")
}

func milliString(m int32) string {
	s := fmt.Sprintf("%d.%03d", m/1000, m%1000)
	return strings.TrimRight(strings.TrimRight(s, "0"), ".")
}

func enumWord(s, prefix string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(s, prefix)), "_", " ")
}

func withMessage(why, msg string) string {
	if msg == "" {
		return why
	}
	return why + ": " + msg
}

func ts(t *timestamppb.Timestamp) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.AsTime().UTC()
}

func joinInts(xs []int32) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprint(x)
	}
	return strings.Join(parts, ",")
}
