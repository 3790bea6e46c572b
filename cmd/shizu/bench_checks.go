package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	autoscaler "github.com/shizu-gpu/shizu/services/autoscaler/app"
	metering "github.com/shizu-gpu/shizu/services/metering/app"
	"github.com/shizu-gpu/shizu/services/metering/redisstore"
	scheduler "github.com/shizu-gpu/shizu/services/scheduler/app"
	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/service"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Goals from DESIGN.md and the service issues.
const (
	goalPlacementsPerSec = 10_000 // the scheduler end to end; the pure placer must be at least as fast
	goalMeteredPerSec    = 50_000 // usage events metered exactly once
	goalDecisionP99MS    = 100    // autoscaler sample -> decision
)

// benchShape is a trace-like request mix: fractions, whole GPUs, a few
// multi-GPU (weights in percent).
var benchShapes = []struct {
	gpus  int
	milli int64
	cpu   int64
	w     int
}{{1, 1000, 8000, 45}, {1, 500, 4000, 15}, {1, 250, 2000, 10}, {1, 100, 2000, 20}, {2, 1000, 16000, 4}, {4, 1000, 32000, 3}, {8, 1000, 64000, 3}}

func benchPlacementRequest(rng *rand.Rand, id string) placement.Request {
	k := rng.IntN(100)
	for _, s := range benchShapes {
		if k < s.w {
			r := placement.Request{ID: id, Tenant: "bench", Class: placement.ClassOnDemand, GPUCount: s.gpus,
				MilliPerGPU: s.milli, CPUMilli: s.cpu, MemoryMiB: 16 * 1024}
			if s.milli < 1000 {
				r.VRAMMiB = 8 * 1024
			}
			return r
		}
		k -= s.w
	}
	return placement.Request{ID: id, Tenant: "bench", Class: placement.ClassOnDemand, GPUCount: 1, MilliPerGPU: 1000, CPUMilli: 4000, MemoryMiB: 16 * 1024}
}

func benchPlacementNode(i int) placement.Node {
	id := fmt.Sprintf("node-%04d", i)
	n := placement.Node{ID: id, Epoch: 1, Ready: true, Zone: "zone-a", Market: placement.MarketOnDemand,
		CPUMilli: 128_000, MemoryMiB: 1 << 20, FreeCPUMilli: 128_000, FreeMemoryMiB: 1 << 20}
	for g := range 8 {
		n.GPUs = append(n.GPUs, placement.GPU{Index: g, UUID: fmt.Sprintf("GPU-%s-%d", id, g), Model: "H100-SXM5-80GB",
			VRAMMiB: 80 * 1024, FreeMilli: 1000, FreeVRAMMiB: 80 * 1024, MIGCapable: true, PCIeSwitch: g / 2, NUMA: g / 4})
	}
	return n
}

// placeRate makes n decisions with pol on a 1,000-node x 8-GPU cluster
// kept about 60 % full (each placement applied, the oldest released), as
// the scheduler's default configuration would (MaxCandidates).
func placeRate(ctx context.Context, pol placement.Policy, n int, progress func(float64)) (float64, *placement.Cluster, []placement.Request, error) {
	c := &placement.Cluster{}
	for i := range 1000 {
		c.Nodes = append(c.Nodes, benchPlacementNode(i))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	shapes := make([]placement.TaskShape, 0, 2000)
	for i := range 2000 {
		r := benchPlacementRequest(rng, "w"+strconv.Itoa(i))
		shapes = append(shapes, placement.ShapeOf(&r))
	}
	w := placement.NewWorkload(shapes, placement.DefaultCoveragePct)
	pl, err := placement.NewPlacer(placement.Options{Policy: pol, Workload: &w, MaxCandidates: scheduler.DefaultConfig().MaxCandidates})
	if err != nil {
		return 0, nil, nil, err
	}
	reqs := make([]placement.Request, 4096)
	for i := range reqs {
		reqs[i] = benchPlacementRequest(rng, "")
	}
	type held struct {
		id   string
		node int
	}
	var live []held
	var used, capacityMilli int64 = 0, 1000 * 8 * 1000
	now := time.Now()
	start := time.Now()
	for i := range n {
		if i%1000 == 0 {
			if err := ctx.Err(); err != nil {
				return 0, nil, nil, err
			}
			progress(float64(i) / float64(n))
		}
		r := reqs[i%len(reqs)]
		r.ID = "r" + strconv.Itoa(i)
		p, err := pl.Place(c, &r)
		if err != nil {
			continue
		}
		ni, _ := strconv.Atoi(p.NodeID[len("node-"):])
		c.Nodes[ni].Apply(&r, p, now)
		live = append(live, held{r.ID, ni})
		for _, s := range p.GPUs {
			used += s.Milli
		}
		for used*10 > capacityMilli*6 && len(live) > 0 {
			h := live[0]
			live = live[1:]
			nd := &c.Nodes[h.node]
			for _, a := range nd.Allocations {
				if a.RentalID == h.id {
					for _, s := range a.GPUs {
						used -= s.Milli
					}
				}
			}
			nd.Remove(h.id)
		}
	}
	return float64(n) / time.Since(start).Seconds(), c, reqs, nil
}

// scanRate is the floor of any placement decision: for each request,
// visit as many candidate nodes as the placer may (MaxCandidates) and read
// every GPU's free share and VRAM, with no filter chain, scoring or
// result. A ceiling, not a placer.
func scanRate(ctx context.Context, c *placement.Cluster, reqs []placement.Request, n int, progress func(float64)) (float64, error) {
	candidates := scheduler.DefaultConfig().MaxCandidates
	if candidates <= 0 || candidates > len(c.Nodes) {
		candidates = len(c.Nodes)
	}
	fits := 0
	start := time.Now()
	for i := range n {
		if i%1000 == 0 {
			if err := ctx.Err(); err != nil {
				return 0, err
			}
			progress(float64(i) / float64(n))
		}
		r := &reqs[i%len(reqs)]
		first := (i * 7919) % len(c.Nodes)
		for k := range candidates {
			nd := &c.Nodes[(first+k)%len(c.Nodes)]
			for g := range nd.GPUs {
				if nd.GPUs[g].FreeMilli >= r.MilliPerGPU && nd.GPUs[g].FreeVRAMMiB >= r.VRAMMiB {
					fits++
				}
			}
		}
	}
	rate := float64(n) / time.Since(start).Seconds()
	if fits < 0 { // keeps the loop from being optimised away
		return 0, errors.New("unreachable")
	}
	return rate, nil
}

func benchPlacement(ctx context.Context, _ benchEnvFactory, n int, step func(string, float64)) (benchResult, error) {
	start := time.Now()
	def := placement.Policy(scheduler.DefaultConfig().Policy)
	rate, cluster, reqs, err := placeRate(ctx, def, n, func(f float64) { step(string(def)+" policy", f*0.8) })
	if err != nil {
		return benchResult{}, err
	}
	ceiling, err := scanRate(ctx, cluster, reqs, n, func(f float64) { step("bare scan (ceiling)", 0.8+f*0.2) })
	if err != nil {
		return benchResult{}, err
	}
	return benchResult{
		Measured: fmt.Sprintf("%s (the scheduler's default) decisions/s: Place + apply on 1,000 nodes x 8 GPUs kept ~60%% full", def),
		Value:    rate, Unit: "decisions/s", Ceiling: ceiling,
		CeilingWhat: fmt.Sprintf("a bare scan of %d candidate nodes' GPUs (free share and VRAM read) per request on the same cluster, no filters or scoring", scheduler.DefaultConfig().MaxCandidates),
		Goal:        goalPlacementsPerSec, Seconds: time.Since(start).Seconds(),
	}, nil
}

// stopParts stops a service's parts in reverse order.
func stopParts(parts []service.Part) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := len(parts) - 1; i >= 0; i-- {
		_ = parts[i].Stop(ctx)
	}
}

// waitUntil polls cond every 5 ms until it holds, ctx ends or limit passes.
func waitUntil(ctx context.Context, limit time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(limit)
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not done within %s", limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// publishAll publishes evs as the admin, asynchronously, every ack awaited.
func publishAll(ctx context.Context, conn *bus.Conn, subjects []string, evs []proto.Message) error {
	batch := conn.NewBatch()
	for i, ev := range evs {
		if err := batch.Publish(ctx, subjects[i], ev); err != nil {
			return err
		}
		if i%5000 == 4999 {
			if _, err := batch.Wait(ctx); err != nil {
				return err
			}
			batch = conn.NewBatch()
		}
	}
	_, err := batch.Wait(ctx)
	return err
}

// benchScheduler queues n rental requests (80 % quarter GPUs, 20 % whole
// GPUs) in the stream, starts one scheduler replica on a 1,000-node x
// 8-GPU fleet and measures placements/s to the last RentalScheduled.
func benchScheduler(ctx context.Context, f benchEnvFactory, n int, step func(string, float64)) (benchResult, error) {
	start := time.Now()
	e, err := f.start(ctx)
	if err != nil {
		return benchResult{}, err
	}
	defer e.close()
	step("registering 1,000 nodes", 0.02)
	store, err := capacity.New(e.rdb)
	if err != nil {
		return benchResult{}, err
	}
	for i := range 1000 {
		if _, err := store.Register(ctx, benchCapacityNode(fmt.Sprintf("node-%04d", i))); err != nil {
			return benchResult{}, err
		}
	}
	var (
		mu      sync.Mutex
		sent    = map[string]time.Time{}
		latency []time.Duration
		got     atomic.Int64
	)
	sub, err := e.admin.NATS().Subscribe(subject.RentalScheduledAll, func(m *nats.Msg) {
		ev := &shizuv1.RentalScheduled{}
		if proto.Unmarshal(m.Data, ev) != nil {
			return
		}
		now := time.Now()
		mu.Lock()
		if t0, ok := sent[ev.GetRentalId()]; ok {
			latency = append(latency, now.Sub(t0))
			delete(sent, ev.GetRentalId())
		}
		mu.Unlock()
		got.Add(1)
	})
	if err != nil {
		return benchResult{}, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := e.admin.NATS().Flush(); err != nil {
		return benchResult{}, err
	}
	requests := func(prefix string, count int) ([]string, []proto.Message) {
		subjects, evs := make([]string, count), make([]proto.Message, count)
		for i := range count {
			id := prefix + strconv.Itoa(i)
			sp := &shizuv1.RentalSpec{GpuCount: 1, MilliGpu: 250, VramMib: 8 * 1024, Plan: shizuv1.Plan_PLAN_ON_DEMAND}
			if i%5 == 0 {
				sp = &shizuv1.RentalSpec{GpuCount: 1, MilliGpu: 1000, Plan: shizuv1.Plan_PLAN_ON_DEMAND}
			}
			tenant := "tenant-" + strconv.Itoa(i%16)
			subjects[i], _ = subject.Format(subject.RentalRequested, tenant)
			evs[i] = &shizuv1.RentalRequested{Meta: &shizuv1.EventMeta{EventId: "req:" + id, OccurredAt: timestamppb.Now(),
				Source: "shizu-bench", CorrelationId: id}, RentalId: id, TenantId: tenant, Spec: sp}
		}
		return subjects, evs
	}
	send := func(subjects []string, evs []proto.Message) error {
		now := time.Now()
		mu.Lock()
		for _, ev := range evs {
			r := ev.(*shizuv1.RentalRequested)
			r.Meta.OccurredAt = timestamppb.New(now)
			sent[r.GetRentalId()] = now
		}
		mu.Unlock()
		return publishAll(ctx, e.admin, subjects, evs)
	}
	waitFor := func(count int64, phase string, from, to float64) error {
		return waitUntil(ctx, 5*time.Minute, func() (bool, error) {
			g := got.Load()
			step(phase, from+(to-from)*float64(g)/float64(count))
			return g >= count, nil
		})
	}

	// The burst is queued before the replica starts, so the rate is the
	// scheduler's own, not the load generator's.
	step("queueing requests", 0.05)
	subjects, burst := requests("r-", n)
	if err := send(subjects, burst); err != nil {
		return benchResult{}, err
	}
	conn, err := e.connect(ctx, topology.Scheduler)
	if err != nil {
		return benchResult{}, err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	cfg := scheduler.DefaultConfig()
	s, err := scheduler.New(cfg, scheduler.Deps{Bus: conn, Store: store, Redis: e.rdb, Log: discardLogger()})
	if err != nil {
		return benchResult{}, err
	}
	svc, _ := topology.ServiceNamed(topology.Scheduler)
	if _, err := conn.EnsureConsumer(ctx, svc.Consumers[0]); err != nil {
		return benchResult{}, err
	}
	t0 := time.Now()
	parts, err := s.Start(ctx, svc.Consumers[0])
	if err != nil {
		return benchResult{}, err
	}
	defer stopParts(parts)
	if err := waitFor(int64(n), "placing the burst", 0.1, 0.6); err != nil {
		return benchResult{}, fmt.Errorf("%d of %d requests scheduled: %w", got.Load(), n, err)
	}
	rate := float64(n) / time.Since(t0).Seconds()

	// Paced at half the burst rate in 10 ms ticks: request -> scheduled.
	mu.Lock()
	latency = latency[:0]
	mu.Unlock()
	paced := min(2000, max(100, n/2))
	psubjects, pevs := requests("p-", paced)
	perTick := max(1, int(rate/2/100))
	tick := time.NewTicker(10 * time.Millisecond)
	for i := 0; i < paced; i += perTick {
		<-tick.C
		j := min(paced, i+perTick)
		if err := send(psubjects[i:j], pevs[i:j]); err != nil {
			tick.Stop()
			return benchResult{}, err
		}
		step("paced latency", 0.6+0.1*float64(j)/float64(paced))
	}
	tick.Stop()
	if err := waitFor(int64(n+paced), "paced latency", 0.7, 0.7); err != nil {
		return benchResult{}, err
	}
	mu.Lock()
	lat := slices.Clone(latency)
	mu.Unlock()
	slices.Sort(lat)

	step("Redis reserve ceiling", 0.75)
	redisRate, err := reserveCeiling(ctx, e, 32, min(n, 8000))
	if err != nil {
		return benchResult{}, err
	}
	step("JetStream publish ceiling", 0.9)
	jsRate, err := publishCeiling(ctx, e, min(n*3, 20000))
	if err != nil {
		return benchResult{}, err
	}
	return benchResult{
		Measured: "rental requests placed end to end by one replica (queued burst, 80% quarter GPUs, 1,000 nodes x 8 GPUs)",
		Value:    rate, Unit: "placements/s", Ceiling: redisRate,
		CeilingWhat: "bare capacity-store reserves/s on the same Redis, 32 clients (one reserve per placement)",
		Goal:        goalPlacementsPerSec, Seconds: time.Since(start).Seconds(),
		Extra: map[string]float64{
			"jetstream_publishes/s/3": jsRate / 3, "ratio_vs_jetstream/3": rate / (jsRate / 3),
			"paced_p50_ms": percentileMS(lat, 0.5), "paced_p99_ms": percentileMS(lat, 0.99),
		},
	}, nil
}

func benchCapacityNode(id string) capacity.Node {
	n := capacity.Node{ID: id, Zone: "zone-a", Market: capacity.MarketOnDemand, PricePerGPUHourMicros: 2_000_000, Currency: "USD",
		CPUMilli: 256_000, MemoryMiB: 2 << 20}
	var dom []int
	for i := range 8 {
		n.GPUs = append(n.GPUs, capacity.GPU{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", id, i), Model: "H100-SXM5-80GB",
			VRAMMiB: 80 * 1024, MIGCapable: true})
		dom = append(dom, i)
	}
	n.NVLinkDomains = [][]int{dom}
	return n
}

// reserveCeiling is the capacity store's reserve rate on the same Redis
// with clients at once (own key prefix, 250 nodes x 8 GPUs, quarter GPUs).
func reserveCeiling(ctx context.Context, e *benchEnv, clients, n int) (float64, error) {
	s, err := capacity.New(e.rdb, capacity.WithPrefix("ceiling"))
	if err != nil {
		return 0, err
	}
	for i := range 250 {
		if _, err := s.Register(ctx, benchCapacityNode(fmt.Sprintf("c%03d", i))); err != nil {
			return 0, err
		}
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				slot := i / 250
				p := capacity.Placement{RentalID: "c" + strconv.Itoa(i), NodeID: fmt.Sprintf("c%03d", i%250), Epoch: 1, Tenant: "bench",
					CPUMilli: 1000, MemoryMiB: 1024, GPUs: []capacity.GPUShare{{Index: slot % 8, Milli: 250, VRAMMiB: 8 * 1024}}}
				if _, err := s.Reserve(ctx, p); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// publishCeiling is bare JetStream async publishing of 200-byte messages
// to a stream of its own, every ack awaited.
func publishCeiling(ctx context.Context, e *benchEnv, n int) (float64, error) {
	js := e.admin.JetStream()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH_CEILING", Subjects: []string{"ceiling.>"},
		Storage: jetstream.FileStorage}); err != nil {
		return 0, err
	}
	payload := make([]byte, 200)
	start := time.Now()
	futs := make([]jetstream.PubAckFuture, 0, n)
	for i := range n {
		f, err := js.PublishAsync("ceiling.x", payload, jetstream.WithMsgID("c"+strconv.Itoa(i)))
		if err != nil {
			return 0, err
		}
		futs = append(futs, f)
	}
	for _, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return 0, err
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// benchMetering publishes n short on-demand rentals (scheduled, started,
// stopped: 3n events, one usage record each, two for a rental that spans a
// minute boundary), then starts one metering replica as deployed (its real
// clock, its interval closer ticking) and measures events/s until every
// rental's usage records are published and metering's consumers have
// nothing pending. The ceiling is a bare JetStream consumer that decodes
// and acks the same events.
//
// The rentals ended in the 15 s before the publish, stamped as a node-agent
// stamps them, so the publish delay is within metering's close grace; the
// meter meets them as a backlog (it starts after the ceiling's run) and its
// closer must not bill a running rental past a stop behind it on the bus.
func benchMetering(ctx context.Context, f benchEnvFactory, n int, step func(string, float64)) (benchResult, error) {
	start := time.Now()
	e, err := f.start(ctx)
	if err != nil {
		return benchResult{}, err
	}
	defer e.close()
	step("publishing rental events", 0.02)
	// Whole seconds: a rental's five billed seconds then start on either
	// side of a minute boundary, never across it.
	base := time.Now().UTC().Truncate(time.Second).Add(-20 * time.Second)
	want := 0 // usage records
	var subjects []string
	var evs []proto.Message
	add := func(pattern, tenant string, ev proto.Message) {
		s, _ := subject.Format(pattern, tenant)
		subjects, evs = append(subjects, s), append(evs, ev)
	}
	meta := func(id string, at time.Time) *shizuv1.EventMeta {
		return &shizuv1.EventMeta{EventId: id, OccurredAt: timestamppb.New(at), Source: "shizu-bench"}
	}
	for i := range n {
		id, tenant, node := "b-"+strconv.Itoa(i), "t"+strconv.Itoa(i%3), "node-"+strconv.Itoa(i%64)
		at := base.Add(time.Duration(i%15) * time.Second)
		stop := at.Add(5 * time.Second)
		want++
		if !at.Truncate(time.Minute).Equal(stop.Add(-time.Nanosecond).Truncate(time.Minute)) {
			want++ // cut at the minute boundary
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
	if err := publishAll(ctx, e.admin, subjects, evs); err != nil {
		return benchResult{}, err
	}
	events := len(evs)

	step("bare JetStream consume (ceiling)", 0.1)
	raw, err := consumeCeiling(ctx, e, events)
	if err != nil {
		return benchResult{}, err
	}

	conn, err := e.connect(ctx, topology.Metering)
	if err != nil {
		return benchResult{}, err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	cfg := metering.DefaultConfig()
	if err := cfg.Validate(); err != nil {
		return benchResult{}, err
	}
	m, err := metering.NewMeter(cfg, metering.Deps{Store: redisstore.New(e.rdb, cfg.KeyPrefix), Conn: conn, Log: discardLogger()})
	if err != nil {
		return benchResult{}, err
	}
	svc, _ := topology.ServiceNamed(topology.Metering)
	for _, c := range svc.Consumers {
		if _, err := conn.EnsureConsumer(ctx, c); err != nil {
			return benchResult{}, err
		}
	}
	t0 := time.Now()
	parts, err := m.Start(ctx, svc.Consumers, cfg.Tick)
	if err != nil {
		return benchResult{}, err
	}
	defer func() {
		ps := make([]service.Part, len(parts))
		for i, p := range parts {
			ps[i] = p
		}
		stopParts(ps)
	}()
	js := e.admin.JetStream()
	billing, err := js.Stream(ctx, topology.StreamBilling)
	if err != nil {
		return benchResult{}, err
	}
	records := 0
	err = waitUntil(ctx, 10*time.Minute, func() (bool, error) {
		info, err := billing.Info(ctx, jetstream.WithSubjectFilter(subject.UsageRecordedAll))
		if err != nil {
			return false, err
		}
		records = 0
		for _, c := range info.State.Subjects {
			records += int(c)
		}
		step("metering", 0.2+0.75*float64(records)/float64(want))
		if records < want {
			return false, nil
		}
		for _, c := range svc.Consumers {
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
	})
	if err != nil {
		return benchResult{}, fmt.Errorf("%d of %d usage records: %w", records, want, err)
	}
	elapsed := time.Since(t0)
	if records != want {
		return benchResult{}, fmt.Errorf("exactly once broken: %d usage records for %d rentals, want %d", records, n, want)
	}
	rate := float64(events) / elapsed.Seconds()
	return benchResult{
		Measured: "rental events metered end to end by one replica (event -> segment in Redis -> UsageRecorded published -> aggregates), the exact record count checked (one a rental, two for one that spans a minute boundary)",
		Value:    rate, Unit: "events/s", Ceiling: raw,
		CeilingWhat: "a bare JetStream pull consumer that decodes and acks the same events on the same server",
		Goal:        goalMeteredPerSec, Seconds: time.Since(start).Seconds(),
		Extra: map[string]float64{"usage_records": float64(records), "records/s": float64(records) / elapsed.Seconds()},
	}, nil
}

// consumeCeiling consumes n messages of the RENTALS stream with a plain
// JetStream pull consumer that only decodes and acknowledges.
func consumeCeiling(ctx context.Context, e *benchEnv, n int) (float64, error) {
	cons, err := e.admin.JetStream().CreateOrUpdateConsumer(ctx, topology.StreamRentals, jetstream.ConsumerConfig{
		Durable: "bench-raw", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 10_000})
	if err != nil {
		return 0, err
	}
	done := make(chan struct{})
	count := 0
	start := time.Now()
	cc, err := cons.Consume(func(m jetstream.Msg) {
		var ev shizuv1.RentalStarted
		_ = proto.Unmarshal(m.Data(), &ev)
		_ = m.Ack()
		count++
		if count == n {
			close(done)
		}
	}, jetstream.PullMaxMessages(1000))
	if err != nil {
		return 0, err
	}
	defer cc.Stop()
	select {
	case <-done:
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(5 * time.Minute):
		return 0, errors.New("bare consumer did not finish within 5 minutes")
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// benchAutoscalerPolicy is one pool that scales out above 10 concurrent
// requests per replica and in below 3, a replica at a time, without
// cooldowns: samples alternating load and quiet each change the pool.
const benchAutoscalerPolicy = `{"pools": [{"id": "bench", "tenant": "bench",
  "rental": {"gpu_count": 1, "milli_gpu": 1000, "models": ["H100-SXM5-80GB"]},
  "min_replicas": 1, "max_replicas": 4, "max_step_out": 4, "max_step_in": 4,
  "scale_out_cooldown": "0s", "scale_in_cooldown": "0s", "stale_after": "1m",
  "thresholds": [{"name": "busy", "metric": "concurrent_requests_per_replica", "scale_out_above": 10, "scale_in_below": 3, "step": 1}]}]}`

// benchAutoscaler runs the autoscaler service and measures, n times, the
// time from publishing a traffic sample to receiving the ScalingDecided it
// causes. The ceiling is one bare JetStream publish to its receipt.
func benchAutoscaler(ctx context.Context, f benchEnvFactory, n int, step func(string, float64)) (benchResult, error) {
	start := time.Now()
	e, err := f.start(ctx)
	if err != nil {
		return benchResult{}, err
	}
	defer e.close()
	policyPath := filepath.Join(e.stack.dataDir, "policy.json")
	if err := os.WriteFile(policyPath, []byte(benchAutoscalerPolicy), 0o644); err != nil {
		return benchResult{}, err
	}
	cfg := autoscaler.DefaultConfig()
	cfg.Service = service.Defaults(topology.Autoscaler)
	cfg.Service.NATS = e.busConfig(topology.Autoscaler)
	cfg.Service.RedisURL = e.redisURL
	port, _ := pickPort(0, "")
	cfg.Service.HTTPAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cfg.Service.LogLevel, cfg.Service.LogFormat, cfg.Service.LogWriter = "error", "text", discardWriter{}
	cfg.PolicyFile = policyPath
	svcCtx, stop := context.WithCancel(ctx)
	failed := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := autoscaler.RunWith(svcCtx, cfg, autoscaler.Deps{}); err != nil && !errors.Is(err, context.Canceled) {
			failed <- err
		}
	})
	defer wg.Wait()
	defer stop()
	if err := waitReady(ctx, cfg.Service.HTTPAddr, failed); err != nil {
		return benchResult{}, fmt.Errorf("autoscaler not ready: %w", err)
	}

	nc := e.admin.NATS()
	decidedSubj, _ := subject.Format(subject.ScaleDecided, "bench")
	ceilingSubj, _ := subject.Format(subject.ScaleDecided, "bench-ceiling")
	decided := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(decidedSubj, decided)
	if err != nil {
		return benchResult{}, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	ceiling := make(chan *nats.Msg, 64)
	csub, err := nc.ChanSubscribe(ceilingSubj, ceiling)
	if err != nil {
		return benchResult{}, err
	}
	defer func() { _ = csub.Unsubscribe() }()
	if err := nc.Flush(); err != nil {
		return benchResult{}, err
	}
	wait := func(ch chan *nats.Msg) error {
		select {
		case <-ch:
			return nil
		case err := <-failed:
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Second):
			return errors.New("no ScalingDecided within 10s of a sample")
		}
	}
	sampleSubj, _ := subject.Format(subject.TrafficSample, "bench")
	sample := func(i int, concurrent int64) error {
		now := time.Now()
		ev := &shizuv1.TrafficSampled{Meta: shizuv1.NewMeta(fmt.Sprintf("bench:traffic:%d:%d", i, now.UnixNano()), cliSource, "", "bench", now), PoolId: "bench",
			ConcurrentRequests: concurrent, RequestsPerSecond: float64(concurrent) * 10, Window: durationpb.New(10 * time.Second)}
		ev.Meta.Source = "shizu-bench"
		_, err := e.admin.Publish(ctx, sampleSubj, ev)
		return err
	}
	// Warm up: the pool reaches its floor and its first decision.
	step("warm-up", 0.02)
	if err := sample(-1, 100); err != nil {
		return benchResult{}, err
	}
	if err := wait(decided); err != nil {
		return benchResult{}, err
	}
	for len(decided) > 0 {
		<-decided
	}
	lat := make([]time.Duration, 0, n)
	bare := make([]time.Duration, 0, n)
	for i := range n {
		if i%10 == 0 {
			step("samples", 0.05+0.95*float64(i)/float64(n))
		}
		// Load takes the pool to 2 replicas, quiet back to 1.
		load := int64(100)
		if i%2 == 1 {
			load = 0
		}
		t := time.Now()
		if err := sample(i, load); err != nil {
			return benchResult{}, err
		}
		if err := wait(decided); err != nil {
			return benchResult{}, fmt.Errorf("sample %d: %w", i, err)
		}
		lat = append(lat, time.Since(t))

		t = time.Now()
		ev := &shizuv1.ScalingDecided{Meta: &shizuv1.EventMeta{EventId: "bench-ceiling-" + strconv.Itoa(i), OccurredAt: timestamppb.Now(), Source: "shizu-bench"},
			PoolId: "bench-ceiling", FromReplicas: 1, ToReplicas: 2, Rule: "bench", Metric: "bench"}
		if _, err := e.admin.Publish(ctx, ceilingSubj, ev); err != nil {
			return benchResult{}, err
		}
		if err := wait(ceiling); err != nil {
			return benchResult{}, err
		}
		bare = append(bare, time.Since(t))
	}
	slices.Sort(lat)
	slices.Sort(bare)
	return benchResult{
		Measured: "p99 of traffic sample published -> ScalingDecided received (sample stored, pool state read and written in Redis, decision and replica rentals published)",
		Value:    percentileMS(lat, 0.99), Unit: "ms", Ceiling: percentileMS(bare, 0.99),
		CeilingWhat: "p99 of one bare JetStream publish (acked) to its receipt by a subscriber, same server",
		Goal:        goalDecisionP99MS, AtMost: true, Seconds: time.Since(start).Seconds(),
		Extra: map[string]float64{"p50_ms": percentileMS(lat, 0.5), "ceiling_p50_ms": percentileMS(bare, 0.5)},
	}, nil
}

// discardWriter throws service logs away during a benchmark.
type discardWriter struct{}

func (discardWriter) Write(p []byte) (int, error) { return len(p), nil }
