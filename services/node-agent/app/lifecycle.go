package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/node-agent/agent"
	"github.com/shizu-gpu/shizu/services/node-agent/gpu"
	"github.com/shizu-gpu/shizu/services/node-agent/runtime"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/service"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// nodeAgent is a running node agent: registered, beating, sampling,
// watching GPU health and consuming its node's commands.
type nodeAgent struct {
	cfg    Config
	log    *slog.Logger
	bus    publisher
	store  nodeRecords
	beats  heartbeat
	host   gpu.Host
	load   gpu.LoadModel // nil on real GPUs
	rt     runtime.Runtime
	now    func() time.Time
	report agent.Events
	m      *metrics
	logs   *logShipping

	mu    sync.Mutex
	desc  *shizuv1.NodeRegistered // what registration says, without meta and epoch
	inv   gpu.Inventory
	epoch int64
	// generation is the capacity store generation the node is registered
	// in (see restore.go).
	generation string
	// restoredIn is the generation the agent last restored the node in
	// ("" if it never did).
	restoredIn string
	health     *agent.HealthBook
	running    map[string]agent.Rental
	stopping   map[string]shizuv1.ExitReason
	drain      agent.Drain

	cancel context.CancelFunc
	wg     sync.WaitGroup
	loops  []*service.Loop // the lease and telemetry loops
	sub    *bus.Subscription
	// beatNow asks the heartbeat loop for a beat out of turn (after a
	// reconnect).
	beatNow chan struct{}
}

// start brings the agent up: discover the GPUs, register the node and
// publish it, open the heartbeat bucket, adopt the workloads an earlier
// agent left and stop the zombies among them, then start the loops and
// the command consumer.
func start(ctx context.Context, cfg Config, srt *service.Runtime) (a *nodeAgent, err error) {
	if srt.Redis == nil {
		return nil, errors.New("node agent needs Redis (the capacity store): set -redis-url")
	}
	b, err := cfg.openBackend(srt.Log)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = b.host.Close()
		}
	}()
	if a, err = newAgent(ctx, cfg, srt, b); err != nil {
		return nil, err
	}
	// Waits (with a hint) until the admin has provisioned the streams, so
	// the registration below has a stream to land in.
	cons, err := topology.AgentCommands(cfg.NodeID)
	if err != nil {
		return nil, err
	}
	if err := service.EnsureConsumers(ctx, srt, cons); err != nil {
		return nil, err
	}
	if err := a.join(ctx); err != nil {
		return nil, err
	}
	hb, err := openHeartbeats(ctx, srt, cfg.HeartbeatTTL)
	if err != nil {
		return nil, err
	}
	a.beats = busHeartbeat{hb: hb}
	a.beat(ctx)
	a.startLoops(ctx, srt.Bus)
	router := bus.NewRouter()
	bus.On(router, a.onStart)
	bus.On(router, a.onStop)
	bus.On(router, a.onDrain)
	// One command at a time keeps a node's start, stop and drain in order.
	if a.sub, err = srt.Bus.Consume(ctx, cons, router, bus.ConsumeOptions{Concurrency: 1}); err != nil {
		a.shutdown(ctx)
		return nil, err
	}
	a.log.Info("node agent started", "epoch", a.epochNow(), "gpus", len(a.inv.Devices), "model", a.inv.Devices[0].Model,
		"nvlink_domains", len(a.inv.NVLinkDomains), "simulated", b.simulated)
	return a, nil
}

// newAgent discovers the GPUs of b and describes the node, not registered
// yet.
func newAgent(ctx context.Context, cfg Config, srt *service.Runtime, b backend) (*nodeAgent, error) {
	store, err := capacity.New(srt.Redis)
	if err != nil {
		return nil, err
	}
	inv, err := b.host.Discover(ctx)
	if err != nil {
		return nil, fmt.Errorf("discover GPUs: %w", err)
	}
	cpu, mem := b.cpuMilli, b.memMiB
	if cpu == 0 {
		cpu, mem = hostResources()
	}
	if cfg.InstanceType == "" {
		cfg.InstanceType = b.instanceType
	}
	facts, err := cfg.facts(cpu, mem)
	if err != nil {
		return nil, err
	}
	desc, err := agent.Describe(facts, inv)
	if err != nil {
		return nil, err
	}
	rt, err := runtime.NewProcess(cfg.stateDir(), runtime.WithClock(cfg.clock()))
	if err != nil {
		return nil, err
	}
	a := &nodeAgent{cfg: cfg, log: srt.Log.With("node", cfg.NodeID), bus: busPublisher{conn: srt.Bus}, store: store,
		host: b.host, load: b.load, rt: rt, now: cfg.clock(),
		report: agent.Events{NodeID: cfg.NodeID, Source: topology.NodeAgent + "/" + cfg.NodeID}, desc: desc, inv: inv,
		health: agent.NewHealthBook(len(inv.Devices)), running: map[string]agent.Rental{}, stopping: map[string]shizuv1.ExitReason{}}
	if a.m, err = newMetrics(srt.Telemetry.Meter(meterName), a.runningCount); err != nil {
		return nil, err
	}
	a.m.setGPUs(inv.Devices)
	return a, nil
}

// startLoops adopts the workloads left running, then starts the loops:
// exits, heartbeat, lease, telemetry, health and provider notices. They
// run until Stop, whatever becomes of ctx.
func (a *nodeAgent) startLoops(ctx context.Context, conn *bus.Conn) {
	loopCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	a.cancel = cancel
	a.logs = newLogShipping(loopCtx, a)
	a.adopt(loopCtx)
	a.goLoop(func() { a.exitsLoop(loopCtx) })
	a.beatNow = make(chan struct{}, 1)
	a.beatOnReconnect(conn.NATS())
	a.goLoop(func() { a.beatLoop(loopCtx) })
	a.loops = append(a.loops,
		service.StartLoop(loopCtx, a.cfg.LeaseInterval, func(ctx context.Context, _ time.Time) { a.lease(ctx) }),
		service.StartLoop(loopCtx, a.cfg.TelemetryInterval, func(ctx context.Context, _ time.Time) { a.sample(ctx) }))
	a.goLoop(func() { a.watchHealth(loopCtx) })
	if n := a.host.Notices(); n != nil {
		a.goLoop(func() { a.noticesLoop(loopCtx, n) })
	}
}

// Stop drains the command consumer, stops the loops and releases the GPU
// backend. Workloads keep running and the heartbeat key is left to expire
// by its TTL, so a quick restart (an upgrade) neither kills tenants' work
// nor looks like a lost node.
func (a *nodeAgent) Stop(ctx context.Context) error {
	var errs []error
	if a.sub != nil {
		if err := a.sub.Drain(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	a.shutdown(ctx)
	return errors.Join(errs...)
}

// shutdown stops the loops, waiting for each to finish what it is doing
// (whatever ctx's deadline: the runtime and the host close after), and
// releases the runtime and the GPU backend.
func (a *nodeAgent) shutdown(ctx context.Context) {
	a.cancel()
	for _, l := range a.loops {
		_ = l.Stop(context.WithoutCancel(ctx))
	}
	a.wg.Wait()
	a.logs.wait()
	_ = a.rt.Close()
	_ = a.host.Close()
}

func (a *nodeAgent) goLoop(f func()) {
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		f()
	}()
}

// retry runs f until it succeeds, fails for good (permanent) or ctx ends,
// and returns the last error. A permanent failure is logged and counted
// under what: the same event would be refused again, and retrying it
// forever would hold up everything queued behind it.
func (a *nodeAgent) retry(ctx context.Context, what string, f func() error) error {
	eb := backoff.NewExponentialBackOff(backoff.WithInitialInterval(100*time.Millisecond),
		backoff.WithMaxInterval(5*time.Second), backoff.WithMaxElapsedTime(0))
	err := backoff.RetryNotify(func() error {
		if err := f(); permanent(err) {
			return backoff.Permanent(err)
		} else if err != nil {
			return err
		}
		return nil
	}, backoff.WithContext(eb, ctx), func(err error, next time.Duration) {
		a.log.Warn("retrying", "what", what, "err", err, "retry_in", next)
	})
	if permanent(err) {
		a.log.Error("refused for good, not retried", "what", what, "err", err)
		a.m.refused.Add(ctx, 1, metric.WithAttributes(attrWhat.String(what)))
	}
	return err
}

// permanent reports whether a publish failed in a way a retry cannot
// mend: the event is invalid (it does not encode, it names no id) or this
// agent may not publish it.
func permanent(err error) bool {
	return fault.IsInvalid(err) || errors.Is(err, bus.ErrPermissionDenied)
}

func (a *nodeAgent) epochNow() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.epoch
}

func (a *nodeAgent) runningCount() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return int64(len(a.running))
}

func (a *nodeAgent) publish(ctx context.Context, form, key string, ev proto.Message) error {
	subj, err := subject.Format(form, key)
	if err != nil {
		return err
	}
	if err := a.bus.Publish(ctx, subj, ev); err != nil {
		return fmt.Errorf("publish %s: %w", subj, err)
	}
	return nil
}

// register writes the node into the capacity store, takes the epoch it
// gives and publishes NodeRegistered.
func (a *nodeAgent) register(ctx context.Context) error {
	a.mu.Lock()
	desc := proto.Clone(a.desc).(*shizuv1.NodeRegistered)
	a.mu.Unlock()
	reg, err := a.store.Join(ctx, capacityNode(desc))
	if err != nil {
		return fmt.Errorf("register node: %w", err)
	}
	epoch := reg.Epoch
	ev := a.report.Registered(desc, int64(epoch), a.now())
	// A draining node stays draining across a restart of its agent.
	st, err := a.store.Node(ctx, a.cfg.NodeID)
	if err != nil {
		return fmt.Errorf("read registered node: %w", err)
	}
	a.remember(reg)
	a.mu.Lock()
	a.drain.Registered(st.Status == capacity.StatusDraining, a.now())
	a.mu.Unlock()
	if err := a.publish(ctx, subject.NodeRegistered, a.cfg.NodeID, ev); err != nil {
		return err
	}
	a.log.Info("node registered", "epoch", epoch)
	return nil
}

// capacityNode is the store's view of a registration.
func capacityNode(ev *shizuv1.NodeRegistered) capacity.Node {
	n := capacity.Node{ID: ev.GetNodeId(), Zone: ev.GetZone(), Market: capacity.MarketOnDemand,
		PricePerGPUHourMicros: ev.GetPricePerGpuHour().GetMicros(), Currency: ev.GetPricePerGpuHour().GetCurrency(),
		TEECapable: ev.GetTeeCapable(), CPUMilli: ev.GetCpuMilli(), MemoryMiB: ev.GetMemoryMib()}
	if ev.GetMarket() == shizuv1.Market_MARKET_SPOT {
		n.Market = capacity.MarketSpot
	}
	if it := ev.GetInstanceType(); it != "" {
		n.Labels = map[string]string{"instance_type": it}
	}
	for _, g := range ev.GetGpus() {
		cg := capacity.GPU{Index: int(g.GetIndex()), UUID: g.GetUuid(), Model: g.GetModel(), VRAMMiB: g.GetVramMib(),
			MIGCapable: g.GetMigCapable(), MIGEnabled: g.GetMigEnabled()}
		// A GPU in MIG mode runs rentals only on the instances it has: the
		// store hands each to one rental at a time.
		if cg.MIGEnabled {
			for _, m := range g.GetMigInstances() {
				cg.MIGInstances = append(cg.MIGInstances, capacity.MIGInstance{UUID: m.GetUuid(), Profile: m.GetProfile(), VRAMMiB: m.GetVramMib()})
			}
		}
		for _, p := range g.GetNvlinkPeers() {
			cg.NVLinkPeers = append(cg.NVLinkPeers, int(p))
		}
		n.GPUs = append(n.GPUs, cg)
	}
	for _, d := range ev.GetNvlinkDomains() {
		var dom []int
		for _, i := range d.GetGpuIndexes() {
			dom = append(dom, int(i))
		}
		n.NVLinkDomains = append(n.NVLinkDomains, dom)
	}
	return n
}

// adopt takes over the workloads an earlier agent left running, then
// stops any whose allocation was fenced or released meanwhile.
func (a *nodeAgent) adopt(ctx context.Context) {
	for _, w := range a.rt.List() {
		r := rentalOf(w.Spec, w.StartedAt)
		a.mu.Lock()
		a.running[r.RentalID] = r
		a.mu.Unlock()
		a.addLoad(r, 1)
		a.logs.start(w)
		a.log.Info("workload adopted", "rental", r.RentalID, "pid", w.PID)
	}
	a.renew(ctx)
}

// exitsLoop publishes RentalStopped for every workload that ended, with the
// runtime's own timestamps, then forgets it.
func (a *nodeAgent) exitsLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case x := <-a.rt.Exits():
			if !a.reportExit(ctx, x) {
				return // the record stays; the next agent reports it
			}
		}
	}
}

// reportExit publishes how x's workload ended (retrying until the bus
// takes it) and forgets the workload; false when ctx ended first. A stop
// the bus refuses for good is reported again without the workload's
// detail (the one part the agent does not control); when even that is
// refused the record stays for the next agent and the loop moves on to
// later exits.
func (a *nodeAgent) reportExit(ctx context.Context, x runtime.Exit) bool {
	s := x.Workload.Spec
	// Its output is complete: ship the rest and the end of it.
	output := a.logs.end(x.Workload)
	a.mu.Lock()
	requested := a.stopping[s.RentalID]
	a.mu.Unlock()
	r := rentalOf(s, x.Workload.StartedAt)
	o := agent.Ended(r, requested, x.ExitCode, x.StoppedAt, x.Detail)
	err := a.retry(ctx, "rental stopped", func() error { return a.publishStopped(ctx, r, o, "") })
	if permanent(err) && o.Message != agent.DetailRefused {
		o.Message = agent.DetailRefused
		err = a.retry(ctx, "rental stopped", func() error { return a.publishStopped(ctx, r, o, "") })
	}
	if ctx.Err() != nil || !shipped(ctx, output) {
		return false
	}
	a.m.stopped.Add(ctx, 1, metric.WithAttributes(attrReason.String(o.Reason.String())))
	a.log.Info("workload stopped", "rental", s.RentalID, "reason", o.Reason, "exit_code", x.ExitCode)
	a.mu.Lock()
	if cur, ok := a.running[s.RentalID]; ok && cur.Attempt == s.Attempt {
		delete(a.running, s.RentalID)
		a.addLoad(r, -1)
	}
	delete(a.stopping, s.RentalID)
	a.mu.Unlock()
	if err != nil {
		a.log.Error("workload stop not reported; its record stays for the next agent", "rental", s.RentalID, "err", err)
		return true
	}
	if err := a.rt.Forget(s.RentalID); err != nil {
		a.log.Warn("forget workload", "rental", s.RentalID, "err", err)
	}
	return true
}

func (a *nodeAgent) publishStarted(ctx context.Context, r agent.Rental, causation string) error {
	return a.publish(ctx, subject.RentalStarted, r.TenantID, a.report.Started(r, causation))
}

func (a *nodeAgent) publishStopped(ctx context.Context, r agent.Rental, o agent.Outcome, causation string) error {
	return a.publish(ctx, subject.RentalStopped, r.TenantID, a.report.Stopped(r, o, causation))
}

func rentalOf(s runtime.Spec, startedAt time.Time) agent.Rental {
	r := agent.Rental{RentalID: s.RentalID, TenantID: s.TenantID, Attempt: s.Attempt, Epoch: s.Epoch,
		GPUUUIDs: s.GPUUUIDs, MilliGPU: s.MilliGPU, StartedAt: startedAt, CPUMilli: s.CPUMilli, MemoryMiB: s.MemoryMiB}
	for _, sh := range s.Shares {
		r.Shares = append(r.Shares, agent.Share(sh))
	}
	return r
}

// addLoad tells a simulated host that r's work started (sign 1) or ended
// (sign -1) on its GPUs.
func (a *nodeAgent) addLoad(r agent.Rental, sign int) {
	if a.load == nil {
		return
	}
	for _, u := range r.GPUUUIDs {
		a.load.AddLoad(u, sign*int(r.MilliGPU))
	}
}
