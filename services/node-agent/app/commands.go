package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"go.opentelemetry.io/otel/metric"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/node-agent/agent"
	"github.com/shizu-gpu/shizu/services/node-agent/gpu"
	"github.com/shizu-gpu/shizu/services/node-agent/runtime"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// state is the decisions' view of the agent; call with a.mu held.
func (a *nodeAgent) state() agent.State {
	s := agent.State{NodeID: a.cfg.NodeID, Epoch: a.epoch, Draining: a.drain.Active, Running: a.running}
	for i, d := range a.inv.Devices {
		g := agent.GPUState{UUID: d.UUID, Health: a.health.Health(i)}
		for _, m := range d.MIG {
			g.MIG = append(g.MIG, m.UUID)
		}
		s.GPUs = append(s.GPUs, g)
	}
	return s
}

func (a *nodeAgent) count(ctx context.Context, verb string, v agent.Verdict) {
	a.m.commands.Add(ctx, 1, metric.WithAttributes(attrVerb.String(verb), attrOutcome.String(v.String())))
}

// onStart runs a placed rental, after checking the placement against this
// node and its allocation against the store.
func (a *nodeAgent) onStart(ctx context.Context, cmd *shizuv1.StartRental, d bus.Delivery) error {
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
	err := a.store.Renew(ctx, sc.GetRentalId(), a.cfg.NodeID, uint64(sc.GetNodeEpoch()))
	if capacity.IsNotFound(err) {
		if restored, rerr := a.restoreForStart(ctx, sc); rerr != nil {
			return fmt.Errorf("restore allocation of %s: %w", sc.GetRentalId(), rerr)
		} else if restored {
			err = a.store.Renew(ctx, sc.GetRentalId(), a.cfg.NodeID, uint64(sc.GetNodeEpoch()))
		}
	}
	switch {
	case capacity.IsFenced(err):
		log.Warn("start skipped: allocation fenced")
		return nil
	case capacity.IsNotFound(err):
		log.Warn("start skipped: allocation released before the start")
		return nil
	case err != nil:
		return fmt.Errorf("check allocation of %s: %w", sc.GetRentalId(), err)
	}
	return a.run(ctx, sc, d.MsgID, log)
}

// run starts the workload of sc and announces it; a workload that cannot
// start is announced as a zero-length failed run.
func (a *nodeAgent) run(ctx context.Context, sc *shizuv1.RentalScheduled, causation string, log *slog.Logger) error {
	env, uuids := agent.WorkloadEnv(sc)
	command := sc.GetSpec().GetCommand()
	if len(command) == 0 {
		command = a.cfg.DefaultCommand
	}
	spec := runtime.Spec{RentalID: sc.GetRentalId(), TenantID: sc.GetTenantId(), Attempt: sc.GetAttempt(),
		Epoch: sc.GetNodeEpoch(), GPUUUIDs: uuids, MilliGPU: sc.GetSpec().GetMilliGpu(), Command: command, Env: env,
		Shares: sharesOf(sc), CPUMilli: sc.GetCpuMilli(), MemoryMiB: sc.GetMemoryMib()}
	w, err := a.rt.Start(ctx, spec)
	r := rentalOf(spec, w.StartedAt)
	if err != nil {
		// It never ran: report a zero-length run so the scheduler frees
		// the capacity and the tenant sees why.
		log.Warn("workload failed to start", "err", err)
		r.StartedAt = a.now()
		if perr := a.publishStarted(ctx, r, causation); perr != nil {
			return perr
		}
		return a.publishStopped(ctx, r, agent.FailedToStart(r.StartedAt, err), causation)
	}
	a.mu.Lock()
	a.running[r.RentalID] = r
	a.mu.Unlock()
	a.addLoad(r, 1)
	a.logs.start(w)
	log.Info("workload started", "pid", w.PID, "gpus", uuids)
	return a.publishStarted(ctx, r, causation)
}

// onStop stops a running rental gracefully; RentalStopped follows from
// the exits loop once the workload has ended.
func (a *nodeAgent) onStop(ctx context.Context, cmd *shizuv1.StopRental, _ bus.Delivery) error {
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
	err := a.rt.Stop(ctx, cmd.GetRentalId(), agent.StopGrace(cmd, a.cfg.StopGrace))
	if errors.Is(err, runtime.ErrNotRunning) {
		return nil // it ended meanwhile; the exits loop reports it
	}
	return err
}

// onDrain marks the node draining: it takes no new work; failover moves
// what runs.
func (a *nodeAgent) onDrain(ctx context.Context, cmd *shizuv1.DrainNode, _ bus.Delivery) error {
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

func (a *nodeAgent) beginDrain(ctx context.Context, reason string) error {
	epoch := a.epochNow()
	if err := a.store.SetStatus(ctx, a.cfg.NodeID, capacity.StatusDraining, uint64(epoch)); err != nil && !capacity.IsConflict(err) {
		return fmt.Errorf("mark node draining: %w", err)
	}
	a.mu.Lock()
	a.drain.Begin(a.now(), reason)
	a.mu.Unlock()
	a.log.Info("node draining", "reason", reason)
	return nil
}

// noticesLoop turns provider interruption notices into a drain and a
// NodeInterruptionNoticed with the deadline.
func (a *nodeAgent) noticesLoop(ctx context.Context, notices <-chan gpu.Notice) {
	for {
		select {
		case <-ctx.Done():
			return
		case n := <-notices:
			_ = a.retry(ctx, "interruption notice", func() error {
				if err := a.beginDrain(ctx, "spot interruption: "+n.Reason); err != nil {
					return err
				}
				ev := a.report.Interruption(a.epochNow(), n, a.now())
				return a.publish(ctx, subject.NodeInterruption, a.cfg.NodeID, ev)
			})
		}
	}
}
