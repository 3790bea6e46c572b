package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/node-agent/agent"
	"github.com/shizu-gpu/shizu/services/node-agent/gpu"
	"github.com/shizu-gpu/shizu/services/node-agent/gpu/simgpu"
	"github.com/shizu-gpu/shizu/services/node-agent/runtime"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/service"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Agent is a running node agent: registered, beating, sampling, watching
// GPU health and consuming its node's commands.
type Agent struct {
	cfg    Config
	log    *slog.Logger
	bus    *bus.Conn
	store  *capacity.Store
	hb     *bus.Heartbeats
	host   gpu.Host
	load   gpu.LoadModel // nil on real GPUs
	rt     runtime.Runtime
	now    func() time.Time
	source string
	m      *metrics

	mu           sync.Mutex
	desc         *shizuv1.NodeRegistered // what registration says, without meta and epoch
	inv          gpu.Inventory
	epoch        int64
	health       *agent.HealthBook
	running      map[string]agent.Rental
	stopping     map[string]shizuv1.ExitReason
	draining     bool
	drainStarted time.Time
	drainReason  string
	drainedSent  bool

	cancel context.CancelFunc
	wg     sync.WaitGroup
	sub    *bus.Subscription
	// beatNow asks the heartbeat loop for a beat out of turn (after a
	// reconnect).
	beatNow chan struct{}
}

// Start brings the agent up: discover the GPUs, register the node and
// publish it, open the heartbeat bucket, adopt the workloads an earlier
// agent left and stop the zombies among them, then start the loops and
// the command consumer.
func Start(ctx context.Context, cfg Config, srt *service.Runtime) (a *Agent, err error) {
	if srt.Redis == nil {
		return nil, errors.New("node agent needs Redis (the capacity store): set -redis-url")
	}
	host, profile, load, err := cfg.openHost()
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = host.Close()
		}
	}()
	store, err := capacity.New(srt.Redis)
	if err != nil {
		return nil, err
	}
	inv, err := host.Discover(ctx)
	if err != nil {
		return nil, fmt.Errorf("discover GPUs: %w", err)
	}
	cpu, mem := profile.CPUMilli, profile.MemoryMiB
	if cpu == 0 {
		cpu, mem = hostResources()
	}
	if cfg.InstanceType == "" {
		cfg.InstanceType = profile.InstanceType
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
	a = &Agent{cfg: cfg, log: srt.Log.With("node", cfg.NodeID), bus: srt.Bus, store: store, host: host, load: load, rt: rt,
		now: cfg.clock(), source: topology.NodeAgent + "/" + cfg.NodeID, desc: desc, inv: inv,
		health: agent.NewHealthBook(len(inv.Devices)), running: map[string]agent.Rental{}, stopping: map[string]shizuv1.ExitReason{}}
	if a.m, err = newMetrics(srt.Telemetry.Meter(meterName), a.runningCount); err != nil {
		return nil, err
	}
	a.m.setGPUs(inv.Devices)
	// Waits (with a hint) until the admin has provisioned the streams, so
	// the registration below has a stream to land in.
	cons, err := topology.AgentCommands(cfg.NodeID)
	if err != nil {
		return nil, err
	}
	if err := service.EnsureConsumers(ctx, srt, cons); err != nil {
		return nil, err
	}
	if err := a.register(ctx); err != nil {
		return nil, err
	}
	if a.hb, err = openHeartbeats(ctx, srt, cfg.HeartbeatTTL); err != nil {
		return nil, err
	}
	a.beat(ctx)
	loopCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	a.cancel = cancel
	a.adopt(loopCtx)
	a.goLoop(func() { a.exitsLoop(loopCtx) })
	a.beatNow = make(chan struct{}, 1)
	a.beatOnReconnect(srt.Bus.NATS())
	a.goLoop(func() { a.beatLoop(loopCtx) })
	a.goLoop(func() { a.every(loopCtx, cfg.LeaseInterval, a.lease) })
	a.goLoop(func() { a.every(loopCtx, cfg.TelemetryInterval, a.sample) })
	a.goLoop(func() { a.watchHealth(loopCtx) })
	if n := host.Notices(); n != nil {
		a.goLoop(func() { a.noticesLoop(loopCtx, n) })
	}
	if fleet, ok := load.(*simgpu.Fleet); ok && cfg.SimulateNoticeLead > 0 {
		// Caught from here on: SIGUSR1's default action ends the process.
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGUSR1)
		a.goLoop(func() { a.simulatedNotices(loopCtx, sigs, fleet, cfg.SimulateNoticeLead) })
	}
	router := bus.NewRouter()
	bus.On(router, a.onStart)
	bus.On(router, a.onStop)
	bus.On(router, a.onDrain)
	// One command at a time keeps a node's start, stop and drain in order.
	if a.sub, err = srt.Bus.Consume(ctx, cons, router, bus.ConsumeOptions{Concurrency: 1}); err != nil {
		a.shutdown()
		return nil, err
	}
	a.log.Info("node agent started", "epoch", a.epochNow(), "gpus", len(inv.Devices), "model", inv.Devices[0].Model,
		"nvlink_domains", len(inv.NVLinkDomains), "simulated", profile.Name)
	return a, nil
}

// openHeartbeats opens the bucket the admin provisions, waiting for it.
func openHeartbeats(ctx context.Context, srt *service.Runtime, ttl time.Duration) (*bus.Heartbeats, error) {
	eb := backoff.NewExponentialBackOff(backoff.WithInitialInterval(200*time.Millisecond),
		backoff.WithMaxInterval(5*time.Second), backoff.WithMaxElapsedTime(0))
	return backoff.RetryNotifyWithData(func() (*bus.Heartbeats, error) {
		hb, err := srt.Bus.OpenHeartbeats(ctx, topology.HeartbeatBucket, ttl)
		if err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, backoff.Permanent(err)
		}
		return hb, err
	}, backoff.WithContext(eb, ctx), func(err error, next time.Duration) {
		srt.Log.Warn("heartbeat bucket not provisioned yet; run `shizu provision` as admin", "err", err, "retry_in", next)
	})
}

// Stop drains the command consumer, stops the loops and releases the GPU
// backend. Workloads keep running and the heartbeat key is left to expire
// by its TTL, so a quick restart (an upgrade) neither kills tenants' work
// nor looks like a lost node.
func (a *Agent) Stop(ctx context.Context) error {
	var errs []error
	if a.sub != nil {
		if err := a.sub.Drain(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	a.shutdown()
	return errors.Join(errs...)
}

func (a *Agent) shutdown() {
	a.cancel()
	a.wg.Wait()
	_ = a.rt.Close()
	_ = a.host.Close()
}

func (a *Agent) goLoop(f func()) {
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		f()
	}()
}

func (a *Agent) every(ctx context.Context, d time.Duration, f func(context.Context)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f(ctx)
		}
	}
}

func (a *Agent) epochNow() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.epoch
}

func (a *Agent) runningCount() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return int64(len(a.running))
}

// register writes the node into the capacity store, takes the epoch it
// gives and publishes NodeRegistered.
func (a *Agent) register(ctx context.Context) error {
	a.mu.Lock()
	desc := proto.Clone(a.desc).(*shizuv1.NodeRegistered)
	a.mu.Unlock()
	epoch, err := a.store.Register(ctx, capacityNode(desc))
	if err != nil {
		return fmt.Errorf("register node: %w", err)
	}
	desc.Epoch = int64(epoch)
	id := fmt.Sprintf("node:%s:registered:%d", a.cfg.NodeID, epoch)
	desc.Meta = agent.Meta(id, a.source, "", a.cfg.NodeID, a.now())
	// A draining node stays draining across a restart of its agent.
	st, err := a.store.Node(ctx, a.cfg.NodeID)
	if err != nil {
		return fmt.Errorf("read registered node: %w", err)
	}
	a.mu.Lock()
	a.epoch = int64(epoch)
	a.drainedSent = false
	a.draining = st.Status == capacity.StatusDraining
	if a.draining && a.drainStarted.IsZero() {
		a.drainStarted, a.drainReason = a.now(), "draining before the agent restarted"
	}
	a.mu.Unlock()
	if err := a.publish(ctx, subject.NodeRegistered, a.cfg.NodeID, desc); err != nil {
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

func (a *Agent) publish(ctx context.Context, form, key string, ev proto.Message) error {
	subj, err := subject.Format(form, key)
	if err != nil {
		return err
	}
	if _, err := a.bus.Publish(ctx, subj, ev); err != nil {
		return fmt.Errorf("publish %s: %w", subj, err)
	}
	return nil
}

// beatOnReconnect makes the agent beat as soon as its connection comes
// back: failover reads a disconnect advisory as a suspected crash and
// waits only a short grace (detect.Config.DisconnectGrace) for a beat
// that shows the agent alive, shorter than a heartbeat interval.
func (a *Agent) beatOnReconnect(nc *nats.Conn) {
	prev := nc.Opts.ReconnectedCB // the bus's own (it logs the reconnect)
	nc.SetReconnectHandler(func(c *nats.Conn) {
		if prev != nil {
			prev(c)
		}
		select {
		case a.beatNow <- struct{}{}:
		default:
		}
	})
}

// beatLoop beats every heartbeat interval, and at once when asked.
func (a *Agent) beatLoop(ctx context.Context) {
	t := time.NewTicker(a.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-a.beatNow:
		}
		a.beat(ctx)
	}
}

func (a *Agent) beat(ctx context.Context) {
	if _, err := a.hb.Beat(ctx, a.cfg.NodeID, []byte(strconv.FormatInt(a.epochNow(), 10))); err != nil && ctx.Err() == nil {
		a.log.Warn("heartbeat failed", "err", err)
	}
}

// state is the decisions' view of the agent; call with a.mu held.
func (a *Agent) state() agent.State {
	s := agent.State{NodeID: a.cfg.NodeID, Epoch: a.epoch, Draining: a.draining, Running: a.running}
	for i, d := range a.inv.Devices {
		g := agent.GPUState{UUID: d.UUID, Health: a.health.Health(i)}
		for _, m := range d.MIG {
			g.MIG = append(g.MIG, m.UUID)
		}
		s.GPUs = append(s.GPUs, g)
	}
	return s
}

func (a *Agent) count(ctx context.Context, verb string, v agent.Verdict) {
	outcome := map[agent.Verdict]string{agent.Run: "run", agent.AlreadyDone: "already_done", agent.Skip: "skipped",
		agent.Invalid: "invalid", agent.Retry: "retry"}[v]
	a.m.commands.Add(ctx, 1, metric.WithAttributes(attrVerb.String(verb), attrOutcome.String(outcome)))
}

// onStart runs a placed rental, after checking the placement against this
// node and its allocation against the store.
func (a *Agent) onStart(ctx context.Context, cmd *shizuv1.StartRental, d bus.Delivery) error {
	sc := cmd.GetScheduled()
	log := a.log.With("rental", sc.GetRentalId(), "attempt", sc.GetAttempt())
	a.mu.Lock()
	dec := agent.DecideStart(a.state(), cmd)
	r, running := a.running[sc.GetRentalId()]
	a.mu.Unlock()
	a.count(ctx, "start", dec.Verdict)
	switch dec.Verdict {
	case agent.Invalid:
		return fault.Invalid("start %s: %s", sc.GetRentalId(), dec.Reason)
	case agent.Skip:
		log.Warn("start skipped", "reason", dec.Reason)
		return nil
	case agent.Retry:
		return fmt.Errorf("start %s: %s", sc.GetRentalId(), dec.Reason)
	case agent.AlreadyDone:
		if running {
			return a.publishStarted(ctx, r, d.MsgID)
		}
		return nil
	}
	switch err := a.store.Renew(ctx, sc.GetRentalId(), a.cfg.NodeID, uint64(sc.GetNodeEpoch())); {
	case capacity.IsFenced(err):
		log.Warn("start skipped: allocation fenced")
		return nil
	case capacity.IsNotFound(err):
		log.Warn("start skipped: allocation released before the start")
		return nil
	case err != nil:
		return fmt.Errorf("check allocation of %s: %w", sc.GetRentalId(), err)
	}
	env, uuids := agent.WorkloadEnv(sc)
	command := sc.GetSpec().GetCommand()
	if len(command) == 0 {
		command = a.cfg.DefaultCommand
	}
	spec := runtime.Spec{RentalID: sc.GetRentalId(), TenantID: sc.GetTenantId(), Attempt: sc.GetAttempt(),
		Epoch: sc.GetNodeEpoch(), GPUUUIDs: uuids, MilliGPU: sc.GetSpec().GetMilliGpu(), Command: command, Env: env}
	w, err := a.rt.Start(ctx, spec)
	r = rentalOf(spec, w.StartedAt)
	if err != nil {
		// It never ran: report a zero-length run so the scheduler frees
		// the capacity and the tenant sees why.
		log.Warn("workload failed to start", "err", err)
		r.StartedAt = a.now()
		if perr := a.publishStarted(ctx, r, d.MsgID); perr != nil {
			return perr
		}
		return a.publishStopped(ctx, r, r.StartedAt, shizuv1.ExitReason_EXIT_REASON_FAILED, -1, err.Error(), d.MsgID)
	}
	a.mu.Lock()
	a.running[r.RentalID] = r
	a.mu.Unlock()
	a.addLoad(r, 1)
	log.Info("workload started", "pid", w.PID, "gpus", uuids)
	return a.publishStarted(ctx, r, d.MsgID)
}

func (a *Agent) publishStarted(ctx context.Context, r agent.Rental, causation string) error {
	ev := &shizuv1.RentalStarted{
		Meta:     agent.Meta(fmt.Sprintf("rental:%s:started:%d", r.RentalID, r.Attempt), a.source, causation, r.RentalID, r.StartedAt),
		RentalId: r.RentalID, TenantId: r.TenantID, NodeId: a.cfg.NodeID, NodeEpoch: r.Epoch,
		StartedAt: timestamppb.New(r.StartedAt), GpuUuids: r.GPUUUIDs, Attempt: r.Attempt,
	}
	return a.publish(ctx, subject.RentalStarted, r.TenantID, ev)
}

func (a *Agent) publishStopped(ctx context.Context, r agent.Rental, stoppedAt time.Time, reason shizuv1.ExitReason, code int32, msg, causation string) error {
	if len(msg) > 1024 {
		msg = msg[:1024]
	}
	ev := &shizuv1.RentalStopped{
		Meta:     agent.Meta(fmt.Sprintf("rental:%s:stopped:%d", r.RentalID, r.Attempt), a.source, causation, r.RentalID, stoppedAt),
		RentalId: r.RentalID, TenantId: r.TenantID, NodeId: a.cfg.NodeID, NodeEpoch: r.Epoch,
		StartedAt: timestamppb.New(r.StartedAt), StoppedAt: timestamppb.New(stoppedAt), ExitReason: reason,
		ExitCode: code, Message: msg, Attempt: r.Attempt,
	}
	return a.publish(ctx, subject.RentalStopped, r.TenantID, ev)
}

// onStop stops a running rental gracefully; RentalStopped follows from
// the exits loop once the workload has ended.
func (a *Agent) onStop(ctx context.Context, cmd *shizuv1.StopRental, _ bus.Delivery) error {
	a.mu.Lock()
	dec := agent.DecideStop(a.state(), cmd)
	if dec.Verdict == agent.Run {
		a.stopping[cmd.GetRentalId()] = cmd.GetReason()
	}
	a.mu.Unlock()
	a.count(ctx, "stop", dec.Verdict)
	switch dec.Verdict {
	case agent.Invalid:
		return fault.Invalid("stop %s: %s", cmd.GetRentalId(), dec.Reason)
	case agent.Run:
	default:
		a.log.Info("stop skipped", "rental", cmd.GetRentalId(), "reason", dec.Reason)
		return nil
	}
	grace := a.cfg.StopGrace
	if g := cmd.GetGracePeriod(); g != nil {
		grace = min(g.AsDuration(), 20*time.Second) // within the consumer's ack wait
	}
	err := a.rt.Stop(ctx, cmd.GetRentalId(), grace)
	if errors.Is(err, runtime.ErrNotRunning) {
		return nil // it ended meanwhile; the exits loop reports it
	}
	return err
}

// onDrain marks the node draining: it takes no new work; failover moves
// what runs.
func (a *Agent) onDrain(ctx context.Context, cmd *shizuv1.DrainNode, _ bus.Delivery) error {
	a.mu.Lock()
	dec := agent.DecideDrain(a.state(), cmd)
	a.mu.Unlock()
	a.count(ctx, "drain", dec.Verdict)
	switch dec.Verdict {
	case agent.Invalid:
		return fault.Invalid("drain: %s", dec.Reason)
	case agent.Retry:
		return errors.New(dec.Reason)
	case agent.Run:
		return a.beginDrain(ctx, cmd.GetReason())
	}
	return nil
}

func (a *Agent) beginDrain(ctx context.Context, reason string) error {
	epoch := a.epochNow()
	if err := a.store.SetStatus(ctx, a.cfg.NodeID, capacity.StatusDraining, uint64(epoch)); err != nil && !capacity.IsConflict(err) {
		return fmt.Errorf("mark node draining: %w", err)
	}
	a.mu.Lock()
	if !a.draining {
		a.draining, a.drainStarted, a.drainReason = true, a.now(), reason
	}
	a.mu.Unlock()
	a.log.Info("node draining", "reason", reason)
	return nil
}

// noticesLoop turns provider interruption notices into a drain and a
// NodeInterruptionNoticed with the deadline.
func (a *Agent) noticesLoop(ctx context.Context, notices <-chan gpu.Notice) {
	for {
		select {
		case <-ctx.Done():
			return
		case n := <-notices:
			a.retry(ctx, "interruption notice", func() error {
				if err := a.beginDrain(ctx, "spot interruption: "+n.Reason); err != nil {
					return err
				}
				epoch := a.epochNow()
				ev := &shizuv1.NodeInterruptionNoticed{
					Meta:   agent.Meta(fmt.Sprintf("node:%s:interruption:%d", a.cfg.NodeID, epoch), a.source, "", a.cfg.NodeID, a.now()),
					NodeId: a.cfg.NodeID, Epoch: epoch, Deadline: timestamppb.New(n.Deadline), Reason: n.Reason,
				}
				return a.publish(ctx, subject.NodeInterruption, a.cfg.NodeID, ev)
			})
		}
	}
}

// simulatedNotices plays the cloud provider of a simulated host: each
// SIGUSR1 delivers a spot interruption notice with a deadline lead ahead
// (-simulate-notice-lead). Only a simulated fleet has a way in; a host on
// real GPUs has no such loop.
func (a *Agent) simulatedNotices(ctx context.Context, sigs chan os.Signal, fleet *simgpu.Fleet, lead time.Duration) {
	defer signal.Stop(sigs)
	for {
		select {
		case <-ctx.Done():
			return
		case <-sigs:
			deadline := a.now().Add(lead)
			a.log.Info("simulated spot interruption notice", "deadline", deadline)
			if err := fleet.NoticeInterruption(ctx, deadline, "simulated spot reclaim (SIGUSR1)"); err != nil && ctx.Err() == nil {
				a.log.Warn("simulated notice not delivered", "err", err)
			}
		}
	}
}

// retry runs f until it succeeds or ctx ends.
func (a *Agent) retry(ctx context.Context, what string, f func() error) {
	eb := backoff.NewExponentialBackOff(backoff.WithInitialInterval(100*time.Millisecond),
		backoff.WithMaxInterval(5*time.Second), backoff.WithMaxElapsedTime(0))
	_ = backoff.RetryNotify(f, backoff.WithContext(eb, ctx), func(err error, next time.Duration) {
		a.log.Warn("retrying", "what", what, "err", err, "retry_in", next)
	})
}

// exitsLoop publishes RentalStopped for every workload that ended, with the
// runtime's own timestamps, then forgets it.
func (a *Agent) exitsLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case x := <-a.rt.Exits():
			s := x.Workload.Spec
			a.mu.Lock()
			requested := a.stopping[s.RentalID]
			a.mu.Unlock()
			reason, code := agent.ExitReason(requested, x.ExitCode)
			r := rentalOf(s, x.Workload.StartedAt)
			stoppedAt := x.StoppedAt
			if stoppedAt.Before(r.StartedAt) {
				stoppedAt = r.StartedAt
			}
			a.retry(ctx, "rental stopped", func() error {
				return a.publishStopped(ctx, r, stoppedAt, reason, code, x.Detail, "")
			})
			if ctx.Err() != nil {
				return // the record stays; the next agent reports it
			}
			a.m.stopped.Add(ctx, 1, metric.WithAttributes(attrReason.String(reason.String())))
			a.log.Info("workload stopped", "rental", s.RentalID, "reason", reason, "exit_code", x.ExitCode)
			a.mu.Lock()
			if cur, ok := a.running[s.RentalID]; ok && cur.Attempt == s.Attempt {
				delete(a.running, s.RentalID)
				a.addLoad(r, -1)
			}
			delete(a.stopping, s.RentalID)
			a.mu.Unlock()
			if err := a.rt.Forget(s.RentalID); err != nil {
				a.log.Warn("forget workload", "rental", s.RentalID, "err", err)
			}
		}
	}
}

func rentalOf(s runtime.Spec, startedAt time.Time) agent.Rental {
	return agent.Rental{RentalID: s.RentalID, TenantID: s.TenantID, Attempt: s.Attempt, Epoch: s.Epoch,
		GPUUUIDs: s.GPUUUIDs, MilliGPU: s.MilliGPU, StartedAt: startedAt}
}

// addLoad tells a simulated host that r's work started (sign 1) or ended
// (sign -1) on its GPUs.
func (a *Agent) addLoad(r agent.Rental, sign int) {
	if a.load == nil {
		return
	}
	for _, u := range r.GPUUUIDs {
		a.load.AddLoad(u, sign*int(r.MilliGPU))
	}
}

// adopt takes over the workloads an earlier agent left running, then
// stops any whose allocation was fenced or released meanwhile.
func (a *Agent) adopt(ctx context.Context) {
	for _, w := range a.rt.List() {
		r := rentalOf(w.Spec, w.StartedAt)
		a.mu.Lock()
		a.running[r.RentalID] = r
		a.mu.Unlock()
		a.addLoad(r, 1)
		s := w.Spec
		a.log.Info("workload adopted", "rental", s.RentalID, "pid", w.PID)
	}
	a.renew(ctx)
}

// lease checks the node's registration (re-registering after a fence or a
// lost store) and renews the running workloads' allocations.
func (a *Agent) lease(ctx context.Context) {
	st, err := a.store.Node(ctx, a.cfg.NodeID)
	epoch := a.epochNow()
	switch {
	case capacity.IsNotFound(err) || (err == nil && (st.Status == capacity.StatusDead || int64(st.Epoch) != epoch)):
		a.log.Warn("registration lost or fenced; registering again", "epoch", epoch, "err", err)
		if err := a.register(ctx); err != nil {
			a.log.Error("re-registration failed", "err", err)
			return
		}
	case err != nil:
		a.log.Warn("capacity store unreachable", "err", err)
		return
	}
	a.renew(ctx)
	a.checkDrained(ctx)
}

// renew asks the store about every running workload and stops those that
// must not run any more.
func (a *Agent) renew(ctx context.Context) {
	a.mu.Lock()
	running := make([]agent.Rental, 0, len(a.running))
	for id, r := range a.running {
		if _, stopping := a.stopping[id]; !stopping {
			running = append(running, r)
		}
	}
	a.mu.Unlock()
	verdicts := map[string]agent.Allocation{}
	var known []agent.Rental
	for _, r := range running {
		switch err := a.store.Renew(ctx, r.RentalID, a.cfg.NodeID, uint64(r.Epoch)); {
		case err == nil:
			verdicts[r.RentalID] = agent.AllocationValid
		case capacity.IsFenced(err):
			verdicts[r.RentalID] = agent.AllocationFenced
		case capacity.IsNotFound(err):
			verdicts[r.RentalID] = agent.AllocationGone
		default:
			a.log.Warn("renew failed", "rental", r.RentalID, "err", err)
			continue
		}
		known = append(known, r)
	}
	for _, s := range agent.Reconcile(known, verdicts) {
		a.mu.Lock()
		a.stopping[s.Rental.RentalID] = s.Reason
		a.mu.Unlock()
		a.log.Warn("stopping zombie workload", "rental", s.Rental.RentalID, "reason", s.Message)
		a.goLoop(func() {
			if err := a.rt.Stop(ctx, s.Rental.RentalID, a.cfg.StopGrace); err != nil && !errors.Is(err, runtime.ErrNotRunning) {
				a.log.Warn("stop zombie", "rental", s.Rental.RentalID, "err", err)
			}
		})
	}
}

// checkDrained publishes NodeDrained once a draining node holds nothing.
func (a *Agent) checkDrained(ctx context.Context) {
	a.mu.Lock()
	pending := !a.draining || a.drainedSent || len(a.running) > 0
	started, reason, epoch := a.drainStarted, a.drainReason, a.epoch
	a.mu.Unlock()
	if pending {
		return
	}
	allocs, err := a.store.Allocations(ctx, a.cfg.NodeID)
	if err != nil || len(allocs) > 0 {
		return
	}
	ev := &shizuv1.NodeDrained{
		Meta:   agent.Meta(fmt.Sprintf("node:%s:drained:%d", a.cfg.NodeID, epoch), a.source, "", a.cfg.NodeID, a.now()),
		NodeId: a.cfg.NodeID, Epoch: epoch, DrainStartedAt: timestamppb.New(started), Reason: reason,
	}
	if err := a.publish(ctx, subject.NodeDrained, a.cfg.NodeID, ev); err != nil {
		a.log.Warn("publish drained", "err", err)
		return
	}
	a.mu.Lock()
	a.drainedSent = true
	a.mu.Unlock()
	a.log.Info("node drained")
}

// sample reads every GPU once, publishes NodeTelemetry, records the OTel
// gauges and applies the sample to GPU health.
func (a *Agent) sample(ctx context.Context) {
	start := time.Now()
	samples, err := a.host.Sample(ctx, nil)
	a.m.sampleDur.Record(ctx, time.Since(start).Seconds())
	if err != nil {
		a.log.Warn("telemetry sample failed", "err", err)
		return
	}
	a.m.record(ctx, samples)
	a.mu.Lock()
	var changes []agent.HealthChange
	for _, s := range samples {
		changes = append(changes, a.health.Sample(s)...)
	}
	a.mu.Unlock()
	a.publishHealth(ctx, changes)
	ev := telemetryEvent(a.cfg.NodeID, a.source, a.epochNow(), a.now(), samples)
	if err := a.publish(ctx, subject.NodeTelemetry, a.cfg.NodeID, ev); err != nil && ctx.Err() == nil {
		a.log.Warn("publish telemetry", "err", err)
	}
}

// telemetryEvent is one NodeTelemetry of samples; lost GPUs are left out
// (their health change says why).
func telemetryEvent(node, source string, epoch int64, now time.Time, samples []gpu.Sample) *shizuv1.NodeTelemetry {
	ev := &shizuv1.NodeTelemetry{
		Meta:   agent.Meta(fmt.Sprintf("node:%s:telemetry:%d:%d", node, epoch, now.UnixMilli()), source, "", node, now),
		NodeId: node, Epoch: epoch, Gpus: make([]*shizuv1.GpuTelemetry, 0, len(samples)),
	}
	for _, s := range samples {
		if s.Lost {
			continue
		}
		ev.Gpus = append(ev.Gpus, &shizuv1.GpuTelemetry{GpuIndex: int32(s.Index), UtilizationPercent: int32(s.UtilizationPercent),
			VramUsedMib: s.VRAMUsedMiB, TemperatureC: int32(s.TemperatureC), PowerMw: s.PowerMW,
			EccCorrected: s.ECCCorrected, EccUncorrected: s.ECCUncorrected,
			PcieRxBytesPerSecond: s.PCIeRxBytesPerSec, PcieTxBytesPerSecond: s.PCIeTxBytesPerSec,
			NvlinkRxBytesPerSecond: s.NVLinkRxBytesPerSec, NvlinkTxBytesPerSecond: s.NVLinkTxBytesPerSec})
	}
	return ev
}

// watchHealth turns driver events into health changes, published at once.
func (a *Agent) watchHealth(ctx context.Context) {
	events := make(chan gpu.Event, 64)
	done := make(chan error, 1)
	go func() { done <- a.host.Watch(ctx, events) }()
	for {
		select {
		case err := <-done:
			if err != nil && ctx.Err() == nil {
				a.log.Error("GPU event watch stopped; health comes from telemetry only", "err", err)
			}
			return
		case ev := <-events:
			a.mu.Lock()
			changes := a.health.Event(ev)
			a.mu.Unlock()
			a.publishHealth(ctx, changes)
		}
	}
}

func (a *Agent) publishHealth(ctx context.Context, changes []agent.HealthChange) {
	if len(changes) == 0 {
		return
	}
	epoch := a.epochNow()
	for _, c := range changes {
		a.log.Warn("health changed", "gpu", c.Index, "from", c.Previous, "to", c.Now, "xid", c.XID, "reason", c.Reason)
		ev := &shizuv1.NodeHealthChanged{
			Meta: agent.Meta(fmt.Sprintf("node:%s:health:%d:%d:%s", a.cfg.NodeID, epoch, c.Index, c.Now), a.source, "",
				a.cfg.NodeID, a.now()),
			NodeId: a.cfg.NodeID, Epoch: epoch, GpuIndex: int32(c.Index), PreviousHealth: c.Previous, Health: c.Now,
			Xid: int32(c.XID), EccCorrected: c.ECCCorrected, EccUncorrected: c.ECCUncorrected, Reason: c.Reason,
		}
		a.retry(ctx, "health change", func() error { return a.publish(ctx, subject.NodeHealth, a.cfg.NodeID, ev) })
	}
}
