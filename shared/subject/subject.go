// Package subject names every NATS subject Shizu publishes or consumes.
//
// Each event has a subscribe form (wildcards, for consumers and permissions)
// and a publish form (a format string taking the routing key) side by side.
// Routing keys (tenant, node, pool) become subject tokens, so they are checked
// with Token before use: a tenant named "a.b" or "*" must never widen a
// subscription or escape a permission.
package subject

import (
	"fmt"
	"strings"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
)

// Rental lifecycle: rental.<tenant>.<event>.
const (
	RentalAll                = "rental.>"
	RentalRequestedAll       = "rental.*.requested"
	RentalRequested          = "rental.%s.requested"
	RentalScheduledAll       = "rental.*.scheduled"
	RentalScheduled          = "rental.%s.scheduled"
	RentalPendingAll         = "rental.*.pending"
	RentalPending            = "rental.%s.pending"
	RentalRejectedAll        = "rental.*.rejected"
	RentalRejected           = "rental.%s.rejected"
	RentalStartedAll         = "rental.*.started"
	RentalStarted            = "rental.%s.started"
	RentalStoppedAll         = "rental.*.stopped"
	RentalStopped            = "rental.%s.stopped"
	RentalPreemptedAll       = "rental.*.preempted"
	RentalPreempted          = "rental.%s.preempted"
	RentalMigratingAll       = "rental.*.migrating"
	RentalMigrating          = "rental.%s.migrating"
	RentalMigratedAll        = "rental.*.migrated"
	RentalMigrated           = "rental.%s.migrated"
	RentalCancelRequestedAll = "rental.*.cancel_requested"
	RentalCancelRequested    = "rental.%s.cancel_requested"
)

// Node lifecycle: node.<node>.<event>. Telemetry lives in its own stream
// (high volume, short retention), the rest in NODES.
const (
	NodeRegisteredAll   = "node.*.registered"
	NodeRegistered      = "node.%s.registered"
	NodeTelemetryAll    = "node.*.telemetry"
	NodeTelemetry       = "node.%s.telemetry"
	NodeHealthAll       = "node.*.health"
	NodeHealth          = "node.%s.health"
	NodeInterruptionAll = "node.*.interruption"
	NodeInterruption    = "node.%s.interruption"
	NodeLostAll         = "node.*.lost"
	NodeLost            = "node.%s.lost"
	NodeDrainedAll      = "node.*.drained"
	NodeDrained         = "node.%s.drained"
)

// Commands to one node's agent: agent.<node>.cmd.<verb>.
const (
	AgentCmdAll     = "agent.*.cmd.*"
	AgentCmdForNode = "agent.%s.cmd.*"
	AgentCmd        = "agent.%s.cmd.%s"
)

// Traffic samples and scaling: traffic.<pool>.sample, scale.<pool>.<event>.
// The fleet itself is the pool named FleetPool.
const (
	TrafficSampleAll           = "traffic.*.sample"
	TrafficSample              = "traffic.%s.sample"
	ScaleAll                   = "scale.>"
	ScaleDecidedAll            = "scale.*.decided"
	ScaleDecided               = "scale.%s.decided"
	ScaleProvisionRequestedAll = "scale.*.provision_requested"
	ScaleProvisionRequested    = "scale.%s.provision_requested"
	ScaleReleaseRequestedAll   = "scale.*.release_requested"
	ScaleReleaseRequested      = "scale.%s.release_requested"
	CapacityShortage           = "scale." + FleetPool + ".shortage"
	ScalePoolDeclaredAll       = "scale.*.declared"
	ScalePoolDeclared          = "scale.%s.declared"
	FleetPool                  = "fleet"
)

// Money: usage.<tenant>.recorded, usage.<tenant>.budget_crossed,
// invoice.<tenant>.closed, and the spot market feed
// spot.<zone>.<model>.price.
const (
	UsageAll              = "usage.>"
	UsageRecordedAll      = "usage.*.recorded"
	UsageRecorded         = "usage.%s.recorded"
	UsageBudgetCrossedAll = "usage.*.budget_crossed"
	UsageBudgetCrossed    = "usage.%s.budget_crossed"
	InvoiceAll            = "invoice.>"
	InvoiceClosedAll      = "invoice.*.closed"
	InvoiceClosed         = "invoice.%s.closed"
	SpotPriceChangedAll   = "spot.*.*.price"
	SpotPriceChanged      = "spot.%s.%s.price"
)

// Money queries metering answers by request-reply (JSON, shared/billing):
// metering.<tenant>.<query>. The tenant is the subject's, never the
// body's; no stream stores them.
const (
	MeteringQueryAll = "metering.*.*"
	UsageQueryAll    = "metering.*.usage"
	UsageQuery       = "metering.%s.usage"
	InvoicesQueryAll = "metering.*.invoices"
	InvoicesQuery    = "metering.%s.invoices"
	BudgetQueryAll   = "metering.*.budget"
	BudgetQuery      = "metering.%s.budget"
)

// Audit records of the tenant API: audit.<tenant>.<action>, one per
// state-changing call the gateway answered (the tenant "operator" for an
// operator key's calls).
const (
	AuditAll         = "audit.>"
	AuditRecordedAll = "audit.*.*"
	AuditRecorded    = "audit.%s.%s"
)

// Rental output logs: log.<tenant>.<rental>, the tenant the second token
// as on every tenant subject, so a tenant's permission or filter
// (log.<tenant>.>) stays valid. Each message is one batch of lines of one
// run of the rental (shizuv1.RentalLogBatch).
const (
	LogAll = "log.*.*"
	Log    = "log.%s.%s"
)

// Dead letters: dlq.<stream>.<consumer>. The server's advisory that a
// consumer gave up on a message (max deliveries without an ack) is captured
// too, so such a message reaches the dead letters even when the process
// handling its last delivery died.
const (
	DeadLetterAll            = "dlq.>"
	DeadLetter               = "dlq.%s.%s"
	MaxDeliveriesAdvisoryAll = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.>"
	MaxDeliveriesAdvisory    = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.%s.%s"
)

// Token checks that s can stand as one subject token: non-empty, at most
// 128 bytes, printable ASCII without '.', '*', '>' or whitespace. The rule
// is the event contract's (shizuv1.ValidToken), so an id that validates in
// an event always fits its subject.
func Token(s string) error {
	if err := shizuv1.ValidToken(s); err != nil {
		return fmt.Errorf("subject token: %w", err)
	}
	return nil
}

// Format fills a publish form with routing keys, checking each one.
func Format(form string, keys ...string) (string, error) {
	for _, k := range keys {
		if err := Token(k); err != nil {
			return "", err
		}
	}
	args := make([]any, len(keys))
	for i, k := range keys {
		args[i] = k
	}
	s := fmt.Sprintf(form, args...)
	if strings.Contains(s, "%!") {
		return "", fmt.Errorf("subject form %q does not take %d keys", form, len(keys))
	}
	return s, nil
}

// Matches reports whether subject matches pattern, with NATS wildcard rules:
// '*' matches one token, a trailing '>' matches one or more.
func Matches(pattern, subject string) bool {
	p := strings.Split(pattern, ".")
	s := strings.Split(subject, ".")
	for i, tok := range p {
		if tok == ">" {
			return i == len(p)-1 && len(s) > i
		}
		if i >= len(s) {
			return false
		}
		if tok != "*" && tok != s[i] {
			return false
		}
	}
	return len(p) == len(s)
}
