package bus

import (
	"context"
	"strings"

	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// SubjectEvent names the one event type a subject carries.
type SubjectEvent struct {
	// Subject is the subscribe form (wildcards for routing keys).
	Subject string
	// Event is the protobuf full name.
	Event string
}

// carried is the bus's contract: every Shizu subject carries exactly one
// event type. Permissions are granted on subjects, so the subject, not the
// Shizu-Event header a publisher sets, decides what a message is; a header
// that disagrees makes the message unusable. A new event type gets a new
// subject, never a second type on an existing one.
var carried = func() []SubjectEvent {
	n := func(ev proto.Message) string { return EventName(ev) }
	return []SubjectEvent{
		{subject.RentalRequestedAll, n(&shizuv1.RentalRequested{})},
		{subject.RentalScheduledAll, n(&shizuv1.RentalScheduled{})},
		{subject.RentalPendingAll, n(&shizuv1.RentalPending{})},
		{subject.RentalRejectedAll, n(&shizuv1.RentalRejected{})},
		{subject.RentalStartedAll, n(&shizuv1.RentalStarted{})},
		{subject.RentalStoppedAll, n(&shizuv1.RentalStopped{})},
		{subject.RentalPreemptedAll, n(&shizuv1.RentalPreempted{})},
		{subject.RentalMigratingAll, n(&shizuv1.RentalMigrating{})},
		{subject.RentalMigratedAll, n(&shizuv1.RentalMigrated{})},
		{subject.RentalCancelRequestedAll, n(&shizuv1.RentalCancelRequested{})},
		{subject.NodeRegisteredAll, n(&shizuv1.NodeRegistered{})},
		{subject.NodeTelemetryAll, n(&shizuv1.NodeTelemetry{})},
		{subject.NodeHealthAll, n(&shizuv1.NodeHealthChanged{})},
		{subject.NodeInterruptionAll, n(&shizuv1.NodeInterruptionNoticed{})},
		{subject.NodeLostAll, n(&shizuv1.NodeLost{})},
		{subject.NodeDrainedAll, n(&shizuv1.NodeDrained{})},
		{agentCmd("start"), n(&shizuv1.StartRental{})},
		{agentCmd("stop"), n(&shizuv1.StopRental{})},
		{agentCmd("drain"), n(&shizuv1.DrainNode{})},
		{subject.TrafficSampleAll, n(&shizuv1.TrafficSampled{})},
		{subject.ScaleDecidedAll, n(&shizuv1.ScalingDecided{})},
		{subject.ScaleProvisionRequestedAll, n(&shizuv1.NodeProvisionRequested{})},
		{subject.ScaleReleaseRequestedAll, n(&shizuv1.NodeReleaseRequested{})},
		{subject.CapacityShortage, n(&shizuv1.CapacityShortage{})},
		{subject.ScalePoolDeclaredAll, n(&shizuv1.PoolDeclared{})},
		{subject.UsageRecordedAll, n(&shizuv1.UsageRecorded{})},
		{subject.UsageBudgetCrossedAll, n(&shizuv1.BudgetThresholdCrossed{})},
		{subject.InvoiceClosedAll, n(&shizuv1.InvoiceClosed{})},
		{subject.SpotPriceChangedAll, n(&shizuv1.SpotPriceChanged{})},
		{subject.LogAll, n(&shizuv1.RentalLogBatch{})},
	}
}()

// agentCmd is the subscribe form of one command verb (agent.*.cmd.<verb>).
func agentCmd(verb string) string {
	return strings.TrimSuffix(subject.AgentCmdAll, "*") + verb
}

// carriedTokens are carried's subjects split into tokens once: EventOn
// runs on every delivery.
var carriedTokens = func() [][]string {
	out := make([][]string, len(carried))
	for i, se := range carried {
		out[i] = strings.Split(se.Subject, ".")
	}
	return out
}()

// EventOn returns the event type subj carries, false for a subject outside
// Shizu's contract. (The contract's subjects use '*' only, never '>'.)
func EventOn(subj string) (string, bool) {
	toks := strings.Split(subj, ".")
next:
	for i, pat := range carriedTokens {
		if len(pat) != len(toks) {
			continue
		}
		for j, p := range pat {
			if p != "*" && p != toks[j] {
				continue next
			}
		}
		return carried[i].Event, true
	}
	return "", false
}

// typeOf decides the event type of d: the one its subject carries (want,
// when declared), which a Shizu-Event header must agree with; the header
// alone only on a subject outside the contract. A delivery with no type,
// or with a header its subject contradicts, is unusable (fault.ErrInvalid).
func typeOf(d Delivery, want string, declared bool) (string, error) {
	switch {
	case d.Event == "" && !declared:
		return "", fault.Invalid("no event type: no %s header, and subject %s carries no declared event", HeaderEvent, d.Subject)
	case d.Event == "":
		return want, nil
	case declared && d.Event != want:
		return "", fault.Invalid("event %q on subject %s, which carries %s", shizuv1.Truncate(d.Event, 128), d.Subject, want)
	}
	return d.Event, nil
}

// noHandler is the outcome of a delivery whose (consistent) type the
// consumer has no handler for: dead-lettered, never acknowledged unread.
func noHandler(d Delivery, event string) error {
	return fault.Invalid("no handler for event %s on subject %s in this consumer", event, d.Subject)
}

// Unhandled is what a batch handler returns for a delivery whose event it
// does not handle: the delivery is dead-lettered with that reason.
func Unhandled(d Delivery) error { return noHandler(d, d.Event) }

// reject is a handler that dead-letters every delivery with err.
func reject(err error) HandlerFunc { return func(context.Context, Delivery) error { return err } }
