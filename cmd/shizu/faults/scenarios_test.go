package faults

import (
	"fmt"
	"time"

	"github.com/shizu-gpu/shizu/shared/topology"
)

// The scenarios. Each is used by the bounded test (TestFaults) and the
// benchmark (BenchmarkFaults); size.Full picks the benchmark's longer
// faults. A fault's duration is a wall-clock wait on purpose (the outage
// itself), never a wait for the platform to react: that is waitSettled.

// natsOutage SIGKILLs nats-server and starts it again on its store after
// down (the benchmark's 5 s and 30 s; the test's 5 s and 10 s).
func natsOutage(name string, down, bounded time.Duration) scenario {
	return scenario{Name: name, Fault: func(r *run) {
		d := down
		if !r.sz.Full {
			d = bounded
		}
		hold(r.ctx, r.sz.Every) // requests flow before the crash
		r.d.nats.Kill(r.t)
		hold(r.ctx, d)
		r.d.nats.Start(r.t)
	}}
}

// redisLoss SIGKILLs redis-server and starts it again after 2 s: with
// persistence it loads its AOF, without it starts empty. Whole-host spot
// requests (one more than there are hosts) wait for capacity across the
// loss: once the run's end frees the hosts each must be placed, not
// orphaned.
func redisLoss(name string, persistent bool) scenario {
	return scenario{Name: name, Waiting: true,
		Shape: func(sh *shape, _ size) { sh.PersistentRedis = persistent },
		Fault: func(r *run) {
			hosts := r.l.burst(r.ctx, "host", len(r.d.nodes)+1, wholeHostSpec)
			r.res.Extra["pending_at_loss"] = float64(r.waitPending(hosts))
			r.d.redis.Kill(r.t)
			hold(r.ctx, 2*time.Second)
			r.d.redis.Start(r.t)
		}}
}

// waitPending waits (up to 30 s) until every one of rentals is placed or
// reported pending, and returns how many are pending.
func (r *run) waitPending(rentals []string) int {
	end := time.Now().Add(30 * time.Second)
	for {
		o, _, err := r.observe(false, false)
		if err == nil {
			pending, decided := 0, 0
			for _, id := range rentals {
				switch {
				case len(o.Scheduled[id]) > 0 || o.Rejected[id] > 0:
					decided++
				case o.Pending[id]:
					pending++
				}
			}
			if pending+decided == len(rentals) || time.Now().After(end) {
				return pending
			}
		}
		hold(r.ctx, 500*time.Millisecond)
	}
}

// whileDown publishes two quarter-GPU requests while service name is
// down, so that each outage has work waiting for the restart.
func (r *run) whileDown(name string, round int) {
	for i := range 2 {
		r.l.request(r.ctx, i, fmt.Sprintf("down-%s-%d-%d", name, round, i), quarterSpec(i))
	}
}

// serviceKills SIGKILLs each service in turn (scheduler, metering,
// failover, autoscaler) and starts it again a second later.
func serviceKills() scenario {
	return scenario{Name: "kill-each-service", Fault: func(r *run) {
		for _, name := range []string{topology.Scheduler, topology.Metering, topology.Failover, topology.Autoscaler} {
			r.d.procs[name].kill()
			r.whileDown(name, 0)
			hold(r.ctx, time.Second)
			r.d.restart(name)
			hold(r.ctx, 2*time.Second)
		}
	}}
}

// schedulerLoop runs two scheduler replicas and SIGKILLs one of them,
// alternating, kills times (10 in the benchmark, 4 in the test), each
// right after a burst of requests arrived (so that it dies while placing
// some) and started again a second later.
func schedulerLoop() scenario {
	return scenario{Name: "kill-scheduler-replicas",
		Shape: func(sh *shape, _ size) { sh.Schedulers = 2 },
		Fault: func(r *run) {
			kills := 4
			if r.sz.Full {
				kills = 10
			}
			replicas := []string{topology.Scheduler, topology.Scheduler + "-2"}
			for i := range kills {
				name := replicas[i%2]
				r.l.burst(r.ctx, fmt.Sprintf("kill%d", i), 3, quarterSpec)
				r.d.procs[name].kill()
				r.whileDown(name, i)
				hold(r.ctx, time.Second)
				r.d.restart(name)
				hold(r.ctx, time.Second)
			}
			r.res.Extra["scheduler_kills"] = float64(kills)
		}}
}
