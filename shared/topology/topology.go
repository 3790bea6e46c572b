// Package topology declares Shizu's JetStream layout in one place: the
// streams, each service's durable consumers, the heartbeat bucket, and the
// NATS permissions of every service user, derived from what that service
// publishes and consumes. Provisioning (bus.EnsureStreams), the embedded
// server of `shizu dev` and deploy/nats/users.conf all read it from here.
package topology

import (
	"fmt"
	"time"

	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// Stream names.
const (
	StreamRentals    = "RENTALS"
	StreamNodes      = "NODES"
	StreamTelemetry  = "TELEMETRY"
	StreamAgentCmds  = "AGENT_CMDS"
	StreamTraffic    = "TRAFFIC"
	StreamScaling    = "SCALING"
	StreamBilling    = "BILLING"
	StreamMarket     = "MARKET"
	StreamDeadLetter = "DEADLETTER"
	// StreamAudit keeps the gateway's record of every state-changing call.
	StreamAudit = "AUDIT"
	StreamLogs  = "LOGS"
	// StreamAdvisories captures the server's max-deliveries advisories.
	StreamAdvisories = bus.AdvisoryStream
	// HeartbeatBucket is the KV bucket of node heartbeats (stream KV_HEARTBEATS).
	HeartbeatBucket = "HEARTBEATS"
	// IdentityBucket holds the tenants and the API keys (hashes only) of
	// the tenant API: the system of record of who may call it.
	IdentityBucket = "IDENTITY"
	// IdempotencyBucket holds the first answer to each POST that carried an
	// Idempotency-Key, for IdempotencyTTL.
	IdempotencyBucket = "IDEMPOTENCY"
	// RentalViewBucket is the rental read model (shared/rentalview).
	RentalViewBucket = "RENTAL_VIEW"
	// BudgetsBucket is the KV bucket of budgets exhausted under a policy
	// that stops (stream KV_BUDGETS): metering creates and writes it, the
	// scheduler watches it.
	BudgetsBucket = "BUDGETS"
	// QuotaBucket is the KV bucket of per-tenant quotas (stream
	// KV_QUOTAS; shared/quota), written by operators, watched by the
	// scheduler.
	QuotaBucket = "QUOTAS"
	// WebhooksBucket holds the tenants' webhooks (with their signing
	// secrets), one key "<tenant>.<webhook id>" each.
	WebhooksBucket = "WEBHOOKS"
)

// IdempotencyTTL is how long a POST's first answer is replayed.
const IdempotencyTTL = 24 * time.Hour

// DuplicateWindow is how long a stream remembers event ids. Producers that
// retry for longer must re-derive the same id and rely on consumer
// idempotency as well.
const DuplicateWindow = 10 * time.Minute

// Bounds of the LOGS stream (rental output): each rental keeps at most
// LogBatchesPerRental batches of at most LogMaxBatchBytes, the stream at
// most LogsMaxBytes, and nothing older than LogsMaxAge; the oldest go
// first. The node agent cuts a line at LogMaxLineBytes and a batch below
// LogMaxBatchBytes (services/node-agent/logship).
const (
	LogsMaxAge          = 7 * 24 * time.Hour
	LogsMaxBytes        = 1 << 30
	LogBatchesPerRental = 2000
	LogMaxBatchBytes    = 64 << 10
	LogMaxLineBytes     = 16 << 10
	// logsMaxMsgBytes leaves room for the batch's envelope and headers.
	logsMaxMsgBytes = LogMaxBatchBytes + 8<<10
)

// Streams returns every stream with the given replica count (1 on a single
// server, 3 on a cluster). Records of what happened (rentals, billing,
// scaling decisions, dead letters) are kept; high-volume or short-lived
// feeds age out.
func Streams(replicas int) []bus.Stream {
	day := 24 * time.Hour
	return []bus.Stream{
		{Name: StreamRentals, Description: "rental lifecycle: the system of record of every rental",
			Subjects: []string{subject.RentalAll}, Duplicates: DuplicateWindow, Replicas: replicas},
		{Name: StreamNodes, Description: "node lifecycle and health",
			Subjects: []string{subject.NodeRegisteredAll, subject.NodeHealthAll, subject.NodeInterruptionAll,
				subject.NodeLostAll, subject.NodeDrainedAll},
			Duplicates: DuplicateWindow, Replicas: replicas},
		{Name: StreamTelemetry, Description: "per-GPU telemetry samples (high volume, short retention)",
			Subjects: []string{subject.NodeTelemetryAll}, MaxAge: 6 * time.Hour, Duplicates: time.Minute, Replicas: replicas},
		{Name: StreamAgentCmds, Description: "commands to node agents (start, stop, drain)",
			Subjects: []string{subject.AgentCmdAll}, MaxAge: 7 * day, Duplicates: DuplicateWindow, Replicas: replicas},
		{Name: StreamTraffic, Description: "traffic samples of autoscaled pools",
			Subjects: []string{subject.TrafficSampleAll}, MaxAge: day, Duplicates: time.Minute, Replicas: replicas},
		{Name: StreamScaling, Description: "scaling decisions, capacity shortages, provision and release requests",
			Subjects: []string{subject.ScaleAll}, Duplicates: DuplicateWindow, Replicas: replicas},
		{Name: StreamBilling, Description: "usage records and invoices: never expire",
			Subjects: []string{subject.UsageAll, subject.InvoiceAll}, Duplicates: DuplicateWindow, Replicas: replicas},
		{Name: StreamMarket, Description: "spot price changes",
			Subjects: []string{subject.SpotPriceChangedAll}, Duplicates: DuplicateWindow, Replicas: replicas},
		{Name: StreamDeadLetter, Description: "messages a consumer could not process, with the reason in headers",
			Subjects: []string{subject.DeadLetterAll}, Duplicates: DuplicateWindow, Replicas: replicas},
		{Name: StreamAudit, Description: "the tenant API's audit log: who changed what, when, from where; never expires",
			Subjects: []string{subject.AuditAll}, Duplicates: DuplicateWindow, Replicas: replicas},
		{Name: StreamLogs, Description: "rental output logs: bounded per rental and in all, aged out after 7 days",
			Subjects: []string{subject.LogAll}, MaxAge: LogsMaxAge, MaxBytes: LogsMaxBytes,
			MaxMsgsPerSubject: LogBatchesPerRental, MaxMsgSize: logsMaxMsgBytes, AllowDirect: true,
			Duplicates: 2 * time.Minute, Replicas: replicas},
		{Name: StreamAdvisories, Description: "the server's notices that a consumer gave up on a message; forwarded to DEADLETTER",
			Subjects: []string{subject.MaxDeliveriesAdvisoryAll}, MaxAge: 7 * day, Replicas: replicas},
	}
}

// Buckets returns the key-value buckets of the tenant API (the heartbeat
// bucket is Heartbeats; the rental read model's bucket is created by
// shared/rentalview).
func Buckets(replicas int) []bus.Bucket {
	return []bus.Bucket{
		{Name: IdentityBucket, Description: "tenants and API keys (sha256 hashes only)", History: 5, Replicas: replicas},
		{Name: IdempotencyBucket, Description: "first answers to POSTs with an Idempotency-Key", TTL: IdempotencyTTL, Replicas: replicas},
		{Name: WebhooksBucket, Description: "tenants' webhooks and their signing secrets", Replicas: replicas},
	}
}

// Heartbeats declares the node heartbeat bucket (default TTL 3 s).
func Heartbeats(replicas int, ttl time.Duration) bus.HeartbeatBucket {
	return bus.HeartbeatBucket{Name: HeartbeatBucket, TTL: ttl, Replicas: replicas}
}

// Heartbeat access levels.
type HeartbeatAccess int

const (
	NoHeartbeats HeartbeatAccess = iota
	// WritesHeartbeats may beat and read keys (node agents).
	WritesHeartbeats
	// WatchesHeartbeats may read and watch keys (failover).
	WatchesHeartbeats
)

// Service is what one service user may do on the bus.
type Service struct {
	Name string
	// Publishes lists subscribe-form subjects the service emits.
	Publishes []string
	// Consumers are the durables it pulls from.
	Consumers []bus.Consumer
	// ConsumerPrefixes are durable name prefixes it may create per instance
	// (e.g. one agent-<node> durable per node) on a stream, or durables it
	// declares itself.
	ConsumerPrefixes []StreamConsumer
	Heartbeats       HeartbeatAccess
	// ReadsLogs lets the service read rentals' output from LOGS as
	// shared/rentallogs does (direct gets, ordered consumers it deletes).
	ReadsLogs bool
	// Buckets are the KV buckets (other than the heartbeats) it uses.
	Buckets []BucketAccess
	// Reads are streams it reads by subject: stream info (with a subject
	// filter) and last or numbered messages, no consumer.
	Reads []string
	// Answers are request subjects (subscribe forms, in no stream) it
	// answers in a queue group named after it: it subscribes to them and
	// may publish one reply to each request it receives.
	Answers []string
	// Asks are request subjects (subscribe forms) it may send requests on;
	// replies arrive on _INBOX.
	Asks []string
}

// BucketAccess is a service's use of a KV bucket: Writes creates it and
// reads and writes keys; otherwise it reads and watches them.
type BucketAccess struct {
	Bucket string
	Writes bool
}

// StreamConsumer names a stream and a durable (or a wildcard '*' durable).
type StreamConsumer struct{ Stream, Durable string }

// Service names; each is also its NATS user name.
const (
	Scheduler  = "scheduler"
	Metering   = "metering"
	Autoscaler = "autoscaler"
	Failover   = "failover"
	NodeAgent  = "node-agent"
	// Gateway is the tenant API (services/gateway).
	Gateway = "gateway"
	// Admin provisions streams and acts for tenants and operators in the
	// CLI; it may do anything.
	Admin = "admin"
	// FailoverAdvisories is the system-account user failover's disconnect
	// fast path connects as (its -advisory-user): it may only read the
	// server's client-disconnect advisories (DisconnectAdvisories).
	FailoverAdvisories = "failover-advisories"
	// SystemAccount is the NATS system account of deploy/nats (the server's
	// own events live there).
	SystemAccount = "SYS"
	// DisconnectAdvisories is every account's client-disconnect advisory;
	// its publish form is $SYS.ACCOUNT.<account>.DISCONNECT.
	DisconnectAdvisories = "$SYS.ACCOUNT.*.DISCONNECT"
)

// AgentCommands is the durable consumer of one node's command queue.
func AgentCommands(node string) (bus.Consumer, error) {
	filter, err := subject.Format(subject.AgentCmdForNode, node)
	if err != nil {
		return bus.Consumer{}, fmt.Errorf("agent commands: %w", err)
	}
	return bus.Consumer{Stream: StreamAgentCmds, Durable: "agent-" + node, FilterSubjects: []string{filter},
		AckWait: 30 * time.Second, MaxDeliver: 10}, nil
}

// Services returns the declared services.
func Services() []Service {
	return []Service{
		{
			Name: Scheduler,
			// A budget exhausted under stop-running cancels its tenant's
			// running rentals as the tenant would (rental.*.cancel_requested).
			Publishes: []string{subject.RentalScheduledAll, subject.RentalPendingAll, subject.RentalRejectedAll,
				subject.RentalPreemptedAll, subject.CapacityShortage, subject.AgentCmdAll, subject.RentalCancelRequestedAll},
			// Each reservation carries the tenant's quota (QuotaBucket).
			Buckets: []BucketAccess{{Bucket: BudgetsBucket}, {Bucket: QuotaBucket}},
			Consumers: []bus.Consumer{{Stream: StreamRentals, Durable: "scheduler", MaxAckPending: 8192,
				FilterSubjects: []string{subject.RentalRequestedAll, subject.RentalCancelRequestedAll,
					subject.RentalStoppedAll, subject.RentalMigratingAll}},
				// A GPU reported degraded or failed takes no new rental.
				{Stream: StreamNodes, Durable: "scheduler-nodes", FilterSubjects: []string{subject.NodeHealthAll}},
				// A spot price rise above a running rental's maximum
				// interrupts it; the price also gates placement.
				{Stream: StreamMarket, Durable: "scheduler-spot", FilterSubjects: []string{subject.SpotPriceChangedAll}}},
		},
		{
			Name:      Metering,
			Publishes: []string{subject.UsageRecordedAll, subject.UsageBudgetCrossedAll, subject.InvoiceClosedAll},
			Buckets:   []BucketAccess{{Bucket: BudgetsBucket, Writes: true}},
			// Usage, invoices and budgets of a tenant, from its aggregates
			// and the BILLING stream (services/metering/app/query.go).
			Answers: []string{subject.UsageQueryAll, subject.InvoicesQueryAll, subject.BudgetQueryAll},
			Consumers: []bus.Consumer{
				// RentalScheduled carries the spec, model and zone a rental is
				// priced by; started/stopped carry the billing times.
				// Both are handled in batches (up to 4 × 500 in flight).
				{Stream: StreamRentals, Durable: "metering", MaxAckPending: 4000,
					FilterSubjects: []string{subject.RentalScheduledAll, subject.RentalStartedAll, subject.RentalStoppedAll,
						subject.RentalPreemptedAll, subject.RentalMigratingAll, subject.RentalMigratedAll}},
				{Stream: StreamMarket, Durable: "metering-spot", FilterSubjects: []string{subject.SpotPriceChangedAll}},
				// Metering's own usage records, folded into the Redis aggregates.
				{Stream: StreamBilling, Durable: "metering-usage", MaxAckPending: 4000, FilterSubjects: []string{subject.UsageRecordedAll}},
			},
		},
		{
			Name: Autoscaler,
			// Pools grow and shrink by requesting and cancelling rentals.
			Publishes: []string{subject.ScaleDecidedAll, subject.ScaleProvisionRequestedAll,
				subject.ScaleReleaseRequestedAll, subject.AgentCmdAll,
				subject.RentalRequestedAll, subject.RentalCancelRequestedAll},
			Consumers: []bus.Consumer{
				{Stream: StreamTraffic, Durable: "autoscaler-traffic", FilterSubjects: []string{subject.TrafficSampleAll}},
				{Stream: StreamScaling, Durable: "autoscaler-shortage", FilterSubjects: []string{subject.CapacityShortage}},
				// Pools declared through the bus. Only the admin user (the
				// CLI, acting for tenants and operators) may publish them.
				{Stream: StreamScaling, Durable: "autoscaler-pools", FilterSubjects: []string{subject.ScalePoolDeclaredAll}},
				{Stream: StreamTelemetry, Durable: "autoscaler-telemetry", FilterSubjects: []string{subject.NodeTelemetryAll}, NewOnly: true},
				// A pool forgets replicas that were rejected or whose workload ended.
				{Stream: StreamRentals, Durable: "autoscaler-rentals", FilterSubjects: []string{subject.RentalRejectedAll, subject.RentalStoppedAll}},
			},
		},
		{
			Name:      Failover,
			Publishes: []string{subject.NodeLostAll, subject.RentalMigratingAll, subject.RentalMigratedAll, subject.AgentCmdAll},
			Consumers: []bus.Consumer{
				{Stream: StreamNodes, Durable: "failover",
					FilterSubjects: []string{subject.NodeHealthAll, subject.NodeInterruptionAll, subject.NodeDrainedAll, subject.NodeRegisteredAll}},
				// Scheduled gives each rental's spec and attempt (what a
				// migration re-queues); started completes a migration;
				// stopped forgets the rental.
				{Stream: StreamRentals, Durable: "failover-rentals",
					FilterSubjects: []string{subject.RentalScheduledAll, subject.RentalStartedAll, subject.RentalStoppedAll}},
			},
			Heartbeats: WatchesHeartbeats,
		},
		{
			Name: NodeAgent,
			Publishes: []string{subject.NodeRegisteredAll, subject.NodeTelemetryAll, subject.NodeHealthAll,
				subject.NodeInterruptionAll, subject.NodeDrainedAll, subject.RentalStartedAll, subject.RentalStoppedAll,
				// Its rentals' output. Any rental for now, as with started
				// and stopped; the trust plane later narrows it to the node.
				subject.LogAll},
			// One agent-<node> durable per node (and its forwarder of
			// exhausted deliveries, which Permissions derives).
			ConsumerPrefixes: []StreamConsumer{{Stream: StreamAgentCmds, Durable: "*"}},
			Heartbeats:       WritesHeartbeats,
		},
		{
			Name: Gateway,
			// It publishes for the tenant its API key names, and records
			// every state-changing call.
			Publishes: []string{subject.RentalRequestedAll, subject.RentalCancelRequestedAll, subject.AuditRecordedAll,
				// Pools of the key's tenant (ids "<tenant>_<pool>": the
				// autoscaler refuses another tenant's) and their traffic.
				subject.ScalePoolDeclaredAll, subject.TrafficSampleAll},
			// Every replica runs the rental read model's projector on one
			// shared durable, which shared/rentalview declares itself (a
			// pinned priority group; it skips what it cannot fold rather
			// than dead-lettering it, so it is no bus.Consumer: what walks
			// every service's Consumers, such as the fault harness's wait
			// for every durable, must not wait for a gateway it does not run).
			// Webhook deliveries come from one more shared durable, on the
			// read model's own stream (KV_RENTAL_VIEW), declared by the
			// gateway itself (pinned like the projector's).
			ConsumerPrefixes: []StreamConsumer{{Stream: StreamRentals, Durable: RentalViewDurable},
				{Stream: "KV_" + RentalViewBucket, Durable: WebhooksDurable}},
			Buckets: []BucketAccess{{Bucket: IdentityBucket, Writes: true}, {Bucket: IdempotencyBucket, Writes: true},
				{Bucket: RentalViewBucket, Writes: true}, {Bucket: WebhooksBucket, Writes: true}},
			// Money is metering's to answer (usage, invoices, budgets).
			Asks: []string{subject.UsageQueryAll, subject.InvoicesQueryAll, subject.BudgetQueryAll},
			// GET /v1/rentals/{id}/logs, for the key's tenant's rental only.
			ReadsLogs: true,
			// GET /v1/pools (the tenant's declarations and last decisions) and
			// the operator's GET /v1/dead-letters.
			Reads: []string{StreamScaling, StreamDeadLetter},
		},
	}
}

// RentalViewDurable is the rental read model projector's durable on
// RENTALS (shared/rentalview.Durable).
const RentalViewDurable = "rentalview"

// WebhooksDurable is the gateway's durable on the rental read model's
// stream that delivers tenants' webhooks (services/gateway/app).
const WebhooksDurable = "webhooks"

// ServiceNamed returns the declared service called name.
func ServiceNamed(name string) (Service, bool) {
	for _, s := range Services() {
		if s.Name == name {
			return s, true
		}
	}
	return Service{}, false
}

// QueueGroup is the queue group a service's replicas answer its Answers
// in: each request reaches one replica.
func QueueGroup(service string) string { return service }
