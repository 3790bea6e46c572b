// Package benchmark measures metering end to end: rental events metered
// exactly once by one replica (app.Run, as deployed: real clock, interval
// closer ticking) through real NATS and Redis, next to a bare JetStream
// consumer of the same events measured in the same run. `go test -bench`
// (BenchmarkIngest here) and `shizu bench` (its metering check) both call
// Run.
package benchmark

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/app"
	"github.com/shizu-gpu/shizu/services/metering/redisstore"
	"github.com/shizu-gpu/shizu/shared/benchkit"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Goal is the rental events/s metered exactly once (DESIGN.md, the
// metering issue).
const Goal = 50_000

// Run publishes n short on-demand rentals (scheduled, started, stopped:
// 3n events, one usage record each, two for a rental that spans a minute
// boundary), measures the ceiling, then starts one metering replica with
// the default configuration and measures events/s until every rental's
// usage records are published and metering's consumers have nothing
// pending, and the CPU that cost.
//
// The rentals ended in the 15 s before the publish, stamped as a
// node-agent stamps them, so the publish delay is within metering's close
// grace; the meter meets them as a backlog (it starts after the ceiling's
// run) and its closer must not bill a running rental past a stop behind it
// on the bus.
func Run(ctx context.Context, env *benchkit.Env, n int) (benchkit.Result, error) {
	start := time.Now()
	cfg := app.DefaultConfig()
	var err error
	if cfg.Service, err = env.ServiceConfig(topology.Metering); err != nil {
		return benchkit.Result{}, err
	}
	if err := cfg.Validate(); err != nil {
		return benchkit.Result{}, err
	}
	// A running deployment: the store was whole before the backlog came
	// (a fresh store would first be rebuilt from the backlog, which
	// BenchmarkRebuildAfterLosingRedis measures).
	if err := redisstore.New(env.Redis, cfg.KeyPrefix).MarkReady(ctx, time.Now()); err != nil {
		return benchkit.Result{}, err
	}
	env.Step("publishing rental events", 0.02)
	subjects, evs, want := rentals(n, time.Now())
	if err := env.PublishAll(ctx, subjects, evs); err != nil {
		return benchkit.Result{}, err
	}
	events := len(evs)

	env.Step("bare JetStream consume (ceiling)", 0.1)
	raw, rawCPU, err := env.ConsumeCeiling(ctx, topology.StreamRentals, events)
	if err != nil {
		return benchkit.Result{}, err
	}
	cpu, err := env.StartCPU(ctx)
	if err != nil {
		return benchkit.Result{}, err
	}
	t0 := time.Now()
	svc := benchkit.StartService(ctx, func(ctx context.Context) error { return app.Run(ctx, cfg) })
	defer func() { _ = svc.Stop() }()
	records, err := waitMetered(ctx, env, svc, want)
	if err != nil {
		return benchkit.Result{}, err
	}
	elapsed := time.Since(t0)
	used, err := cpu.Stop(ctx, events)
	if err != nil {
		return benchkit.Result{}, err
	}
	used.CeilingSeconds = rawCPU
	r := benchkit.Result{
		Measured: "rental events metered end to end by one replica (event -> segment in Redis -> UsageRecorded published -> aggregates), the exact record count checked (one a rental, two for one that spans a minute boundary)",
		Value:    float64(events) / elapsed.Seconds(), Unit: "events/s", Ceiling: raw,
		CeilingWhat: "a bare JetStream pull consumer that decodes and acks the same events on the same server",
		Goal:        Goal, Size: n, Seconds: time.Since(start).Seconds(), CPU: used,
		Extra: map[string]float64{"usage_records": float64(records), "records_per_s": float64(records) / elapsed.Seconds()},
	}
	r.Finish()
	return r, nil
}

// rentals are n 5-second on-demand rentals that ended in the 15 s before
// now, their events and subjects, and the usage records they make.
func rentals(n int, now time.Time) (subjects []string, evs []proto.Message, records int) {
	// Whole seconds: a rental's five billed seconds then start on either
	// side of a minute boundary, never across it.
	base := now.UTC().Truncate(time.Second).Add(-20 * time.Second)
	add := func(pattern, tenant string, ev proto.Message) {
		s, _ := subject.Format(pattern, tenant)
		subjects, evs = append(subjects, s), append(evs, ev)
	}
	meta := func(id string, at time.Time) *shizuv1.EventMeta {
		return shizuv1.NewMeta(id, benchkit.Source, "", "", at)
	}
	for i := range n {
		id, tenant, node := "b-"+strconv.Itoa(i), "t"+strconv.Itoa(i%3), "node-"+strconv.Itoa(i%64)
		at := base.Add(time.Duration(i%15) * time.Second)
		stop := at.Add(5 * time.Second)
		records++
		if !at.Truncate(time.Minute).Equal(stop.Add(-time.Nanosecond).Truncate(time.Minute)) {
			records++ // cut at the minute boundary
		}
		spec := &shizuv1.RentalSpec{GpuCount: 1, MilliGpu: 1000, Plan: shizuv1.Plan_PLAN_ON_DEMAND, Labels: map[string]string{"team": "bench"}}
		add(subject.RentalScheduled, tenant, &shizuv1.RentalScheduled{Meta: meta("rental:"+id+":scheduled:1", at.Add(-time.Second)),
			RentalId: id, TenantId: tenant, NodeId: node, NodeEpoch: 1, Spec: spec, GpuModel: "H100-SXM5-80GB", Zone: "eu-1", Attempt: 1,
			Gpus: []*shizuv1.GpuAssignment{{GpuIndex: 0, GpuUuid: "GPU-0", MilliGpu: 1000}}})
		add(subject.RentalStarted, tenant, &shizuv1.RentalStarted{Meta: meta("rental:"+id+":started:1", at),
			RentalId: id, TenantId: tenant, NodeId: node, NodeEpoch: 1, StartedAt: timestamppb.New(at), Attempt: 1})
		add(subject.RentalStopped, tenant, &shizuv1.RentalStopped{Meta: meta("rental:"+id+":stopped:1", stop),
			RentalId: id, TenantId: tenant, NodeId: node, NodeEpoch: 1, StartedAt: timestamppb.New(at), StoppedAt: timestamppb.New(stop),
			ExitReason: shizuv1.ExitReason_EXIT_REASON_PREEMPTED, Attempt: 1})
	}
	return subjects, evs, records
}

// waitMetered waits until want usage records are in BILLING and
// metering's consumers have nothing pending, and checks exactly once.
func waitMetered(ctx context.Context, env *benchkit.Env, svc *benchkit.Service, want int) (int, error) {
	js := env.Admin.JetStream()
	billing, err := js.Stream(ctx, topology.StreamBilling)
	if err != nil {
		return 0, err
	}
	svcSpec, _ := topology.ServiceNamed(topology.Metering)
	records := 0
	err = benchkit.WaitUntil(ctx, 10*time.Minute, func() (bool, error) {
		if err := svc.Err(); err != nil {
			return false, fmt.Errorf("metering: %w", err)
		}
		info, err := billing.Info(ctx, jetstream.WithSubjectFilter(subject.UsageRecordedAll))
		if err != nil {
			return false, err
		}
		records = 0
		for _, c := range info.State.Subjects {
			records += int(c)
		}
		env.Step("metering", 0.2+0.75*float64(records)/float64(want))
		if records < want {
			return false, nil
		}
		return drained(ctx, js, svcSpec.Consumers)
	})
	if err != nil {
		return records, fmt.Errorf("%d of %d usage records: %w", records, want, err)
	}
	if records != want {
		return records, fmt.Errorf("exactly once broken: %d usage records, want %d", records, want)
	}
	return records, nil
}

// drained says whether every consumer has nothing pending or unacked.
func drained(ctx context.Context, js jetstream.JetStream, consumers []bus.Consumer) (bool, error) {
	for _, c := range consumers {
		cons, err := js.Consumer(ctx, c.Stream, c.Durable)
		if err != nil {
			return false, err
		}
		ci, err := cons.Info(ctx)
		if err != nil {
			return false, err
		}
		if ci.NumPending > 0 || ci.NumAckPending > 0 {
			return false, nil
		}
	}
	return true, nil
}
