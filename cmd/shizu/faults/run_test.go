package faults

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
)

// The run of one scenario, the same in the bounded test and the
// benchmark: deploy, place a warm load, break something while more
// requests arrive, wait for the platform to settle, then cancel every
// rental and compare what metering billed with what ran.

// size scales a scenario.
type size struct {
	// Nodes is the simulated hosts (8 GPUs each).
	Nodes int
	// Warm requests are placed and started before the fault; During ones
	// are published one every Every while it lasts.
	Warm, During int
	Every        time.Duration
	// Full marks the benchmark's run (longer outages, more kills).
	Full bool
}

// scenario is one fault and what it expects.
type scenario struct {
	Name string
	// Shape adjusts the deployment (default: sz.Nodes on-demand hosts).
	Shape func(sh *shape, sz size)
	// Setup runs after the deployment started, before any request.
	Setup func(r *run)
	// Spec is request i of the warm and trickled load (default
	// deployment.mixedSpec).
	Spec func(d *deployment, i int) *shizuv1.RentalSpec
	// Warm places the warm load (default: sz.Warm requests of Spec).
	Warm func(r *run) []string
	// Fault breaks something and returns once the fault has ended.
	Fault func(r *run)
	// Check adds the scenario's own figures once every rental stopped.
	Check func(r *run, o observation)
	// Preemption: the scenario preempts spot rentals on purpose.
	Preemption bool
	// Quiet: no requests trickle in and no warm rental is cancelled
	// during the fault (the scenario's own load is the point).
	Quiet bool
	// Waiting: requests may still wait for capacity once settled (the
	// scenario leaves some waiting on purpose); otherwise settling
	// includes placing every one.
	Waiting bool
}

// run is a scenario in progress.
type run struct {
	t       testing.TB
	ctx     context.Context
	d       *deployment
	l       *load
	sz      size
	started time.Time
	res     result
}

// result is what a run found.
type result struct {
	Name string
	figures
	// Refused counts publishes the stream did not acknowledge.
	Refused int
	// Settled says the invariants held within the settle deadline.
	Settled bool
	// Extra are the scenario's own figures (Check), by metric name.
	Extra map[string]float64
	// Ended lists processes that ended on their own.
	Ended []string
}

// settleDeadline bounds the wait for the platform to settle.
const settleDeadline = 150 * time.Second

// orphanGrace is how long requests may still wait once nothing holds any
// capacity before they count as orphaned (the scheduler retries pending
// requests every 500 ms and wakes them at every stop).
const orphanGrace = 20 * time.Second

// billingDeadline bounds the wait for metering to bill every stopped run
// (it closes an ended run's records on its next tick).
const billingDeadline = 30 * time.Second

func runScenario(t testing.TB, sc scenario, sz size) result {
	t.Helper()
	sh := shape{Nodes: sz.Nodes}
	if sc.Shape != nil {
		sc.Shape(&sh, sz)
	}
	r := &run{t: t, ctx: t.Context(), sz: sz, started: time.Now(), res: result{Name: sc.Name, Extra: map[string]float64{}}}
	phase := time.Now()
	r.d = deploy(t, sh)
	mark := func(what string) {
		t.Logf("%s: %s took %s", sc.Name, what, time.Since(phase).Round(100*time.Millisecond))
		phase = time.Now()
	}
	mark("deploy")
	r.l = newLoad(r.d, 3)
	if sc.Setup != nil {
		sc.Setup(r)
	}
	spec := r.d.mixedSpec
	if sc.Spec != nil {
		spec = func(i int) *shizuv1.RentalSpec { return sc.Spec(r.d, i) }
	}
	var warm []string
	if sc.Warm != nil {
		warm = sc.Warm(r)
	} else {
		warm = r.l.burst(r.ctx, "warm", sz.Warm, spec)
	}
	if _, ok := r.waitSettled("the warm load", settleDeadline, sc); !ok {
		t.Fatalf("%s: the warm load did not settle before the fault", sc.Name)
	}
	mark("the warm load")
	stop := make(chan struct{})
	trickle, cancels := func() {}, func() {}
	if !sc.Quiet {
		trickle = r.l.trickle(r.ctx, "during", sz.During, sz.Every, spec, stop)
		cancels = r.cancelSome(warm)
	}
	sc.Fault(r)
	faultEnd := time.Now()
	close(stop)
	trickle()
	cancels()
	mark("the fault")
	f, ok := r.waitSettled("after the fault", settleDeadline, sc)
	r.res.Settled, r.res.Settle = ok, time.Since(faultEnd)
	if !ok {
		t.Logf("%s: not settled within %s: %s", sc.Name, settleDeadline, strings.Join(f.Problems, "; "))
	}
	mark("settling")
	r.finish(sc)
	mark("cancelling and billing")
	return r.res
}

// cancelSome cancels every tenth warm rental (those ending in 5) in the
// background while the fault happens; a cancel the stream refused is
// not counted.
func (r *run) cancelSome(warm []string) (wait func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, id := range warm {
			if strings.HasSuffix(id, "5") {
				_ = r.l.cancel(r.ctx, id)
				hold(r.ctx, 100*time.Millisecond)
			}
		}
	}()
	return func() { <-done }
}

// observe reads and judges the platform's state.
func (r *run) observe(preemption, billing bool) (observation, figures, error) {
	o, err := r.d.observe(r.ctx, r.l)
	if err != nil {
		return o, figures{}, err
	}
	o.Preemption, o.Billing = preemption, billing
	return o, judge(o), nil
}

// waitSettled polls until the invariants hold, up to deadline; it returns
// the last figures and whether they held.
func (r *run) waitSettled(what string, deadline time.Duration, sc scenario) (figures, bool) {
	end := time.Now().Add(deadline)
	var last figures
	for {
		_, f, err := r.observe(sc.Preemption, false)
		if err == nil {
			last = f
			if f.settled() && (sc.Waiting || f.Waiting == 0) {
				return f, true
			}
		} else {
			last.Problems = []string{err.Error()}
		}
		if time.Now().After(end) {
			r.t.Logf("%s: %s", what, strings.Join(last.Problems, "; "))
			return last, false
		}
		hold(r.ctx, 500*time.Millisecond)
	}
}

// finish cancels every live rental, again as waiting requests take the
// capacity freed, until every run stopped and nothing waits; metering
// must then have billed every run. A request still waiting then is
// orphaned: the capacity was there and it was never placed.
func (r *run) finish(sc scenario) {
	var (
		o   observation
		f   figures
		err error
	)
	stopped := func() bool {
		return err == nil && f.settled() && f.Waiting == 0 && len(o.Allocations) == 0 && liveCount(o) == 0 && workloadCount(o) == 0
	}
	var idleSince time.Time // nothing runs, requests still wait
	for end := time.Now().Add(settleDeadline); ; hold(r.ctx, time.Second) {
		if o, f, err = r.observe(sc.Preemption, true); stopped() {
			break
		}
		if err == nil {
			r.cancelLive(sc, o)
		}
		if err == nil && f.Waiting > 0 && len(o.Allocations) == 0 && liveCount(o) == 0 {
			if idleSince.IsZero() {
				idleSince = time.Now()
			}
			if time.Since(idleSince) > orphanGrace {
				break // every host free, and they still wait: orphaned
			}
		} else {
			idleSince = time.Time{}
		}
		if time.Now().After(end) {
			r.t.Logf("%s: at the end, %d live, %d waiting, %d allocations, %d workloads: %s", sc.Name, liveCount(o), f.Waiting,
				len(o.Allocations), workloadCount(o), strings.Join(f.Problems, "; "))
			break
		}
	}
	quiet := func() bool {
		return err == nil && len(o.Allocations) == 0 && liveCount(o) == 0 && workloadCount(o) == 0
	}
	for end := time.Now().Add(billingDeadline); quiet() && !f.billed() && time.Now().Before(end); hold(r.ctx, time.Second) {
		o, f, err = r.observe(sc.Preemption, true)
	}
	f.Orphaned = f.Waiting
	settle, prior := r.res.Settle, r.res.Problems
	r.res.figures = f
	r.res.Settle, r.res.Problems = settle, append(prior, f.Problems...)
	_, r.res.Refused = r.l.counts()
	if sc.Check != nil {
		sc.Check(r, o)
	}
	r.res.Ended = r.d.unexpectedExits()
}

// cancelLive cancels every live rental its tenant has not cancelled yet.
func (r *run) cancelLive(sc scenario, o observation) {
	for _, rental := range sortedKeys(o.Scheduled) {
		if live(o, rental) && !o.Cancelled[rental] {
			if err := r.l.cancel(r.ctx, rental); err != nil {
				r.t.Errorf("%s: %v", sc.Name, err)
			}
		}
	}
}

func liveCount(o observation) int {
	n := 0
	for rental := range o.Scheduled {
		if live(o, rental) {
			n++
		}
	}
	return n
}

func workloadCount(o observation) int {
	n := 0
	for _, c := range o.Workloads {
		n += c
	}
	return n
}

// spotSpec is a whole spot GPU (the preemption storm's fill).
func spotSpec(int) *shizuv1.RentalSpec {
	return &shizuv1.RentalSpec{Plan: shizuv1.Plan_PLAN_SPOT, GpuCount: 1, MilliGpu: 1000}
}

// wholeHostSpec is all eight GPUs of a host, on the spot plan (so it
// waits for capacity instead of preempting anything).
func wholeHostSpec(int) *shizuv1.RentalSpec {
	return &shizuv1.RentalSpec{Plan: shizuv1.Plan_PLAN_SPOT, GpuCount: 8, MilliGpu: 1000}
}

// quarterSpec is a quarter of an on-demand GPU.
func quarterSpec(int) *shizuv1.RentalSpec {
	return &shizuv1.RentalSpec{Plan: shizuv1.Plan_PLAN_ON_DEMAND, GpuCount: 1, MilliGpu: 250, VramMib: 20480}
}

// onDemandSpec is a whole on-demand GPU (the storm's burst).
func onDemandSpec(int) *shizuv1.RentalSpec {
	return &shizuv1.RentalSpec{Plan: shizuv1.Plan_PLAN_ON_DEMAND, GpuCount: 1, MilliGpu: 1000}
}

// line is the result as one row of the figures table.
func (res result) line() string {
	return fmt.Sprintf("%-24s settled=%-5v acked=%-4d refused=%-3d lost=%d orphaned=%d double_outcomes=%d evicted=%d leaked=%d without_alloc=%d overcommitted=%d miscounted=%d twice=%d run_s=%d billed_s=%d unbilled_s=%d double_billed_s=%d preempted=%d preempted_twice=%d preemption_late=%s settle=%s extra=%v ended=%v",
		res.Name, res.Settled, res.Acked, res.Refused, res.Lost, res.Orphaned, res.DoubleOutcomes, res.Evicted, res.Leaked, res.WithoutAllocation,
		res.OverCommitted, res.Miscounted, res.RunningTwice, res.RunSeconds, res.BilledSeconds, res.Unbilled, res.DoubleBilled,
		res.Preempted, res.PreemptedTwice, res.PreemptionLate.Round(10*time.Millisecond), res.Settle.Round(100*time.Millisecond), res.Extra, res.Ended)
}

// hold waits d, or until ctx ends: the length of an outage or the pause
// between two polls of a condition that has its own deadline, never a
// wait for the platform to do something.
func hold(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
