package app_test

import (
	"context"
	"errors"
	"fmt"
	"go.opentelemetry.io/otel/metric"
	"log/slog"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/app"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/services/metering/pricing"
	"github.com/shizu-gpu/shizu/services/metering/redisstore"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/service"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// base is when the test timelines begin; the meters' clock stands there,
// so only stopped rentals are closed unless a test moves the clock.
var base = time.Date(2026, 11, 2, 9, 0, 0, 0, time.UTC)

// env is one test's platform (testkit.Platform): the test publishes and
// reads the streams as admin (pub) and reads Redis directly (rdb).
type env struct {
	*testkit.Deployment
	rdb *redis.Client
	pub *bus.Conn
	// metrics, when set, receives the replicas' instruments.
	metrics metric.MeterProvider
}

// newEnv runs NATS without users: every connection may use every subject
// (for tests of metering's logic, not of its permissions).
func newEnv(t testing.TB) *env { return envOn(t, testkit.Platform(t, testkit.WithoutUsers())) }

// newEnvWithUsers runs NATS with the topology's users: the test publishes
// as admin and the meters connect as the metering user, with exactly the
// permissions deploy/nats/users.conf grants.
func newEnvWithUsers(t testing.TB) *env { return envOn(t, testkit.Platform(t)) }

func envOn(t testing.TB, d *testkit.Deployment) *env {
	return &env{Deployment: d, rdb: d.Redis.Client(t), pub: d.Admin}
}

func quietLog(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))
}

// consumers are metering's declared consumers with a short ack wait, so a
// killed replica's unacknowledged deliveries come back quickly.
func consumers() []bus.Consumer {
	svc, _ := topology.ServiceNamed(topology.Metering)
	out := make([]bus.Consumer, len(svc.Consumers))
	for i, c := range svc.Consumers {
		c.AckWait = 2 * time.Second
		c.MaxDeliver = 20
		out[i] = c
	}
	return out
}

func testConfig() app.Config {
	cfg := app.DefaultConfig()
	cfg.Concurrency = 4
	return cfg
}

type replica struct {
	meter *app.Meter
	conn  *bus.Conn
	parts []service.Part
}

// startMeter runs one metering replica against e with its clock at now.
func (e *env) startMeter(t testing.TB, cfg app.Config, now func() time.Time) *replica {
	t.Helper()
	return e.startMeterTicking(t, cfg, now, 0)
}

// startMeterTicking also runs the interval closer every tick.
func (e *env) startMeterTicking(t testing.TB, cfg app.Config, now func() time.Time, tick time.Duration) *replica {
	t.Helper()
	conn := e.Connect(t, topology.Metering)
	m, err := app.NewMeter(cfg, app.Deps{Store: redisstore.New(e.rdb, cfg.KeyPrefix), Conn: conn, Log: quietLog(t), Now: now, Meter: e.metrics})
	if err != nil {
		t.Fatalf("new meter: %v", err)
	}
	parts, err := m.Start(context.WithoutCancel(t.Context()), consumers(), tick)
	if err != nil {
		t.Fatalf("start meter: %v", err)
	}
	r := &replica{meter: m, conn: conn, parts: parts}
	t.Cleanup(func() { r.stop(context.WithoutCancel(t.Context())) })
	return r
}

func (r *replica) stop(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for i := len(r.parts) - 1; i >= 0; i-- {
		_ = r.parts[i].Stop(ctx)
	}
	r.parts = nil
}

// kill drops the replica's connection without draining: in-flight
// deliveries are neither finished on the bus nor acknowledged.
func (r *replica) kill() {
	r.conn.NATS().Close()
}

func fixed(t time.Time) func() time.Time { return func() time.Time { return t } }

func meta(id string, at time.Time) *shizuv1.EventMeta {
	return &shizuv1.EventMeta{EventId: id, OccurredAt: timestamppb.New(at), Source: "test"}
}

// rental is one test rental's facts.
type rental struct {
	id, tenant, model, zone string
	plan                    shizuv1.Plan
	gpus, milli             int32
	maxSpot                 *pricing.Money
	labels                  map[string]string
	// segments: one per attempt.
	segs []seg
}

type seg struct {
	node        string
	start, stop time.Time
	exit        shizuv1.ExitReason
	// lost, when set, is the last heartbeat before a failover moved the
	// rental (no stopped event for this segment).
	lost time.Time
}

type event struct {
	subject string
	msg     proto.Message
}

// events returns a rental's events in their natural order.
func (r rental) events() []event {
	var out []event
	subj := func(pattern string) string { s, _ := subject.Format(pattern, r.tenant); return s }
	for i, s := range r.segs {
		attempt := int32(i + 1)
		spec := &shizuv1.RentalSpec{GpuCount: r.gpus, MilliGpu: r.milli, Plan: r.plan, MaxSpotPricePerGpuHour: nil, Labels: r.labels}
		if r.milli < 1000 {
			spec.VramMib = 1024
		}
		if r.maxSpot != nil {
			spec.MaxSpotPricePerGpuHour = r.maxSpot.Proto()
		}
		gpus := make([]*shizuv1.GpuAssignment, r.gpus)
		for g := range gpus {
			gpus[g] = &shizuv1.GpuAssignment{GpuIndex: int32(g), GpuUuid: fmt.Sprintf("GPU-%d", g), MilliGpu: r.milli, VramMib: 1024}
		}
		out = append(out, event{subj(subject.RentalScheduled), &shizuv1.RentalScheduled{
			Meta:     meta(fmt.Sprintf("rental:%s:scheduled:%d", r.id, attempt), s.start.Add(-time.Second)),
			RentalId: r.id, TenantId: r.tenant, NodeId: s.node, NodeEpoch: 1, Gpus: gpus, Spec: spec,
			GpuModel: r.model, Zone: r.zone, Attempt: attempt}})
		out = append(out, event{subj(subject.RentalStarted), &shizuv1.RentalStarted{
			Meta:     meta(fmt.Sprintf("rental:%s:started:%d", r.id, attempt), s.start),
			RentalId: r.id, TenantId: r.tenant, NodeId: s.node, NodeEpoch: 1, StartedAt: timestamppb.New(s.start), Attempt: attempt}})
		if !s.lost.IsZero() {
			out = append(out, event{subj(subject.RentalMigrating), &shizuv1.RentalMigrating{
				Meta:     meta(fmt.Sprintf("rental:%s:migrating:%d", r.id, attempt), s.lost.Add(5*time.Second)),
				RentalId: r.id, TenantId: r.tenant, FromNodeId: s.node, FromNodeEpoch: 1,
				Reason: shizuv1.MigrationReason_MIGRATION_REASON_NODE_LOST, LastHeartbeatAt: timestamppb.New(s.lost)}})
			continue
		}
		if !s.stop.IsZero() {
			out = append(out, event{subj(subject.RentalStopped), &shizuv1.RentalStopped{
				Meta:     meta(fmt.Sprintf("rental:%s:stopped:%d", r.id, attempt), s.stop),
				RentalId: r.id, TenantId: r.tenant, NodeId: s.node, NodeEpoch: 1, StartedAt: timestamppb.New(s.start),
				StoppedAt: timestamppb.New(s.stop), ExitReason: s.exit, Attempt: attempt}})
		}
	}
	return out
}

// state is what the ledger should know of a rental's segment i once every
// event has arrived.
func (r rental) state(cat *pricing.Catalogue, i int) ledger.SegmentState {
	s := r.segs[i]
	milli, _ := cat.BillableMilli(r.model, "", r.milli)
	return ledger.SegmentState{RentalID: r.id, Attempt: int32(i + 1), Scheduled: true, TenantID: r.tenant,
		NodeID: s.node, Plan: r.plan, Model: r.model, Zone: r.zone, GPUCount: r.gpus, MilliGPU: milli,
		Labels: r.labels, MaxSpot: r.maxSpot, StartedAt: s.start, StoppedStartedAt: stoppedStart(s),
		StoppedAt: s.stop, ExitReason: s.exit, LostAt: s.lost}
}

func stoppedStart(s seg) time.Time {
	if s.stop.IsZero() {
		return time.Time{}
	}
	return s.start
}

var spotPrices = []ledger.PricePoint{
	{At: base.Add(-time.Hour), Price: pricing.Money{Micros: 900_000, Currency: "USD"}},
	{At: base.Add(7*time.Minute + 30*time.Second), Price: pricing.Money{Micros: 1_400_000, Currency: "USD"}},
	{At: base.Add(19 * time.Minute), Price: pricing.Money{Micros: 700_000, Currency: "USD"}},
}

func spotEvents() []event {
	var out []event
	for _, p := range spotPrices {
		s, _ := subject.Format(subject.SpotPriceChanged, "eu-1", "H100-SXM5-80GB")
		out = append(out, event{s, &shizuv1.SpotPriceChanged{
			Meta:  meta("spot:eu-1:H100-SXM5-80GB:"+p.At.Format(time.RFC3339), p.At),
			Model: "H100-SXM5-80GB", Zone: "eu-1", PricePerGpuHour: p.Price.Proto(), EffectiveAt: timestamppb.New(p.At)}})
	}
	return out
}

// randomRentals draws n rentals over the first half hour after base.
func randomRentals(seed uint64, n int) []rental {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	plans := []shizuv1.Plan{shizuv1.Plan_PLAN_ON_DEMAND, shizuv1.Plan_PLAN_SPOT, shizuv1.Plan_PLAN_RESERVED}
	exits := []shizuv1.ExitReason{shizuv1.ExitReason_EXIT_REASON_COMPLETED, shizuv1.ExitReason_EXIT_REASON_FAILED,
		shizuv1.ExitReason_EXIT_REASON_CANCELLED, shizuv1.ExitReason_EXIT_REASON_PREEMPTED}
	out := make([]rental, n)
	for i := range out {
		r := rental{id: fmt.Sprintf("r-%04d", i), tenant: fmt.Sprintf("t%d", i%3), model: "H100-SXM5-80GB", zone: "eu-1",
			plan: plans[rng.IntN(len(plans))], gpus: int32(1 + rng.IntN(8)), milli: 1000,
			labels: map[string]string{"team": []string{"vision", "nlp"}[rng.IntN(2)]}}
		if r.gpus == 1 && rng.IntN(2) == 0 {
			r.milli = int32(1 + rng.IntN(1000))
		}
		if r.plan == shizuv1.Plan_PLAN_SPOT && rng.IntN(2) == 0 {
			r.maxSpot = &pricing.Money{Micros: 1_000_000, Currency: "USD"}
		}
		start := base.Add(time.Duration(rng.Int64N(int64(20 * time.Minute))))
		dur := time.Duration(rng.Int64N(int64(10 * time.Minute)))
		s := seg{node: fmt.Sprintf("node-%d", rng.IntN(5)), start: start, stop: start.Add(dur), exit: exits[rng.IntN(len(exits))]}
		if rng.IntN(5) == 0 { // a failover: lost after dur, restarted 40 s later elsewhere
			s.lost, s.stop, s.exit = start.Add(dur), time.Time{}, 0
			again := start.Add(dur + 40*time.Second)
			r.segs = append(r.segs, s, seg{node: "node-9", start: again, stop: again.Add(time.Duration(rng.Int64N(int64(5 * time.Minute)))),
				exit: shizuv1.ExitReason_EXIT_REASON_COMPLETED})
		} else {
			r.segs = append(r.segs, s)
		}
		out[i] = r
	}
	return out
}

// expectedLedger is what one clean run must bill: every record of every
// segment, by id.
func expectedLedger(t testing.TB, cfg app.Config, rentals []rental) map[string]int64 {
	t.Helper()
	cat, err := cfg.Catalogue()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, r := range rentals {
		for i := range r.segs {
			sg, ok := r.state(cat, i).Segment()
			if !ok {
				t.Fatalf("rental %s segment %d not billable", r.id, i)
			}
			list, _ := cat.OnDemand(r.model)
			tariff := ledger.Tariff{Base: list}
			if r.plan == shizuv1.Plan_PLAN_SPOT {
				tariff.Spot = spotPrices
			}
			recs, _, err := ledger.Close(sg, tariff, cfg.Rules, time.Time{}, sg.End.Add(time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			for _, rec := range recs {
				out[rec.ID] = rec.Amount.Micros
			}
		}
	}
	return out
}

func (e *env) publish(t testing.TB, evs []event) {
	t.Helper()
	for _, ev := range evs {
		if _, err := e.pub.Publish(t.Context(), ev.subject, ev.msg); err != nil {
			t.Fatalf("publish %s: %v", ev.subject, err)
		}
	}
}

// billed reads every usage record in the BILLING stream: amounts by id,
// and the number of messages.
func (e *env) billed(t testing.TB) (map[string]int64, int) {
	t.Helper()
	ctx := t.Context()
	js := e.pub.JetStream()
	s, err := js.Stream(ctx, topology.StreamBilling)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	n := 0
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("get %d: %v", seq, err)
		}
		if !subject.Matches(subject.UsageRecordedAll, m.Subject) {
			continue
		}
		var ev shizuv1.UsageRecorded
		if err := proto.Unmarshal(m.Data, &ev); err != nil {
			t.Fatal(err)
		}
		if prev, ok := out[ev.GetMeta().GetEventId()]; ok && prev != ev.GetAmount().GetMicros() {
			t.Fatalf("record %s published with two amounts: %d and %d", ev.GetMeta().GetEventId(), prev, ev.GetAmount().GetMicros())
		}
		out[ev.GetMeta().GetEventId()] = ev.GetAmount().GetMicros()
		n++
	}
	return out, n
}

func total(m map[string]int64) int64 {
	var s int64
	for _, v := range m {
		s += v
	}
	return s
}

// settled waits until the ledger in the stream and the aggregates in Redis
// both hold exactly want and every consumer has nothing pending.
func (e *env) settled(t testing.TB, prefix string, want map[string]int64) {
	t.Helper()
	store := aggregatesOf(e.rdb, prefix)
	testkit.Eventually(t, 30*time.Second, func() error {
		got, _ := e.billed(t)
		if len(got) != len(want) || total(got) != total(want) {
			return fmt.Errorf("stream holds %d records / %d µ, want %d / %d", len(got), total(got), len(want), total(want))
		}
		if err := e.busy(t.Context()); err != nil {
			return err
		}
		var agg int64
		for _, tenant := range []string{"t0", "t1", "t2"} {
			v, err := store.TenantTotal(t.Context(), tenant, "USD")
			if err != nil {
				return err
			}
			agg += v
		}
		if agg != total(want) {
			return fmt.Errorf("aggregates hold %d µ, want %d", agg, total(want))
		}
		return nil
	})
	got, _ := e.billed(t)
	for id, amount := range want {
		if got[id] != amount {
			t.Fatalf("record %s billed %d µ, want %d", id, got[id], amount)
		}
	}
}

func (e *env) consumerInfo(ctx context.Context, stream, durable string) (*jetstream.ConsumerInfo, error) {
	cons, err := e.pub.JetStream().Consumer(ctx, stream, durable)
	if err != nil {
		return nil, err
	}
	return cons.Info(ctx)
}

// busy says which of metering's consumers still has messages to deliver
// or deliveries unacknowledged (nil when none has): until then a handler
// may still merge an event or a redelivery into its segment.
func (e *env) busy(ctx context.Context) error {
	for _, c := range consumers() {
		info, err := e.consumerInfo(ctx, c.Stream, c.Durable)
		if err != nil {
			return err
		}
		if info.NumPending > 0 || info.NumAckPending > 0 {
			return fmt.Errorf("%s: %d pending, %d unacknowledged", c.Durable, info.NumPending, info.NumAckPending)
		}
	}
	return nil
}

// aggregates reads redisstore's aggregate hashes (their key layout is
// documented in redisstore/aggregates.go) for assertions.
type aggregates struct {
	rdb    *redis.Client
	prefix string
}

func aggregatesOf(rdb *redis.Client, prefix string) aggregates {
	return aggregates{rdb: rdb, prefix: prefix}
}

func (a aggregates) generation(ctx context.Context) (string, error) {
	g, err := a.rdb.Get(ctx, a.prefix+"agg:gen").Result()
	if errors.Is(err, redis.Nil) {
		return "0", nil
	}
	return g, err
}

// Dump is every aggregate hash of gen (seen sets as their sizes), keyed
// without the generation prefix.
func (a aggregates) Dump(ctx context.Context, gen string) (map[string]map[string]string, error) {
	pre := a.prefix + "agg:" + gen + ":"
	out := map[string]map[string]string{}
	iter := a.rdb.Scan(ctx, 0, pre+"*", 1000).Iterator()
	for iter.Next(ctx) {
		name := strings.TrimPrefix(iter.Val(), pre)
		if strings.HasPrefix(name, "seen:") {
			n, err := a.rdb.SCard(ctx, iter.Val()).Result()
			if err != nil {
				return nil, err
			}
			out[name] = map[string]string{"count": strconv.FormatInt(n, 10)}
			continue
		}
		h, err := a.rdb.HGetAll(ctx, iter.Val()).Result()
		if err != nil {
			return nil, err
		}
		out[name] = h
	}
	return out, iter.Err()
}

// Rental is a rental's billed micros and milli-GPU-seconds.
func (a aggregates) Rental(ctx context.Context, rental string) (micros, mgs int64, err error) {
	gen, err := a.generation(ctx)
	if err != nil {
		return 0, 0, err
	}
	h, err := a.rdb.HGetAll(ctx, a.prefix+"agg:"+gen+":rental:"+rental).Result()
	if err != nil {
		return 0, 0, err
	}
	micros, _ = strconv.ParseInt(h["micros"], 10, 64)
	mgs, _ = strconv.ParseInt(h["mgs"], 10, 64)
	return micros, mgs, nil
}

// TenantTotal is a tenant's billed micros in currency.
func (a aggregates) TenantTotal(ctx context.Context, tenant, currency string) (int64, error) {
	gen, err := a.generation(ctx)
	if err != nil {
		return 0, err
	}
	v, err := a.rdb.HGet(ctx, a.prefix+"agg:"+gen+":tenant:"+tenant, currency).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return v, err
}

// segment loads what the store knows of a placement.
func segment(ctx context.Context, store *redisstore.Store, ref ledger.SegmentRef) (ledger.SegmentState, error) {
	states, err := store.MergeSegments(ctx, []ledger.SegmentEvent{{Ref: ref}})
	if err != nil {
		return ledger.SegmentState{}, err
	}
	return states[0], nil
}

func sortedIDs(m map[string]int64) []string {
	out := make([]string, 0, len(m))
	for id := range m {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}
