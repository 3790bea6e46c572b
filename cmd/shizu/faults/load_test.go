package faults

import (
	"context"
	"fmt"
	"sync"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// The load driver: rental requests from several publishers (each its own
// connection, as the API's replicas would be), recording which the stream
// acknowledged. A publish that failed (NATS down) is not acked; the
// platform owes an outcome only to acked requests.

// load is one scenario's requests.
type load struct {
	d          *deployment
	publishers []*bus.Conn

	mu        sync.Mutex
	acked     map[string]bool
	failed    map[string]bool
	cancelled map[string]bool
}

func newLoad(d *deployment, publishers int) *load {
	l := &load{d: d, acked: map[string]bool{}, failed: map[string]bool{}, cancelled: map[string]bool{}}
	for i := range publishers {
		cfg := bus.Config{URL: d.nats.URL, User: topology.Admin, Password: testkit.Password(topology.Admin), Name: fmt.Sprintf("faults-publisher-%d", i)}
		c, err := bus.Connect(d.t.Context(), cfg, bus.Instruments{})
		if err != nil {
			d.t.Fatal(err)
		}
		d.t.Cleanup(func() { _ = c.Close(context.WithoutCancel(d.t.Context())) })
		l.publishers = append(l.publishers, c)
	}
	return l
}

// mixedSpec is request i of the mixed load: per ten, three whole GPUs,
// two halves and a quarter on demand, a pair of GPUs, a spot GPU, and two
// short workloads (2 s) that complete, a whole on-demand GPU and a spot
// quarter: about 8.5 GPUs' worth per ten while all run.
func (d *deployment) mixedSpec(i int) *shizuv1.RentalSpec {
	sp := &shizuv1.RentalSpec{Plan: shizuv1.Plan_PLAN_ON_DEMAND, GpuCount: 1, MilliGpu: 1000}
	switch i % 10 {
	case 3:
		sp.GpuCount = 2
	case 4, 5:
		sp.MilliGpu, sp.VramMib = 500, 40960
	case 6:
		sp.MilliGpu, sp.VramMib = 250, 20480
	case 7:
		sp.Plan = shizuv1.Plan_PLAN_SPOT
	case 8:
		sp.Command = []string{d.workload, "2"}
	case 9:
		sp.Plan, sp.MilliGpu, sp.VramMib, sp.Command = shizuv1.Plan_PLAN_SPOT, 250, 20480, []string{d.workload, "2"}
	}
	return sp
}

// request publishes one RentalRequested from publisher p and records
// whether the stream acked it.
func (l *load) request(ctx context.Context, p int, rental string, spec *shizuv1.RentalSpec) bool {
	ev := &shizuv1.RentalRequested{Meta: shizuv1.NewMeta("rental:"+rental+":requested", "faults", "", rental, time.Now()),
		RentalId: rental, TenantId: tenant, Spec: spec}
	if err := ev.Validate(); err != nil {
		l.d.t.Errorf("the load's request is invalid: %v", err)
		return false
	}
	subj, _ := subject.Format(subject.RentalRequested, tenant)
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	_, err := l.publishers[p%len(l.publishers)].Publish(ctx, subj, ev)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.failed[rental] = true
		return false
	}
	l.acked[rental] = true
	return true
}

// burst publishes n requests of spec(i) at once, spread over the
// publishers, and returns their ids.
func (l *load) burst(ctx context.Context, prefix string, n int, spec func(i int) *shizuv1.RentalSpec) []string {
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		ids[i] = fmt.Sprintf("%s-%03d", prefix, i)
		wg.Go(func() { l.request(ctx, i, ids[i], spec(i)) })
	}
	wg.Wait()
	return ids
}

// trickle publishes up to n requests of spec, one every `every`, round
// robin over the publishers, until n were tried or stop is closed; it
// runs in the background and the returned wait blocks until it ended.
func (l *load) trickle(ctx context.Context, prefix string, n int, every time.Duration, spec func(i int) *shizuv1.RentalSpec, stop <-chan struct{}) (wait func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		defer wg.Wait()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for i := range n {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			id := fmt.Sprintf("%s-%03d", prefix, i)
			wg.Go(func() { l.request(ctx, i, id, spec(i)) })
		}
	}()
	return func() { <-done }
}

// cancel asks for rental's cancellation as its tenant would.
func (l *load) cancel(ctx context.Context, rental string) error {
	ev := &shizuv1.RentalCancelRequested{Meta: shizuv1.NewMeta("rental:"+rental+":cancel_requested", "faults", "", rental, time.Now()),
		RentalId: rental, TenantId: tenant, RequestedBy: "faults", Reason: "the harness is done with it"}
	subj, _ := subject.Format(subject.RentalCancelRequested, tenant)
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if _, err := l.publishers[0].Publish(ctx, subj, ev); err != nil {
		return fmt.Errorf("cancel %s: %w", rental, err)
	}
	l.mu.Lock()
	l.cancelled[rental] = true
	l.mu.Unlock()
	return nil
}

// snapshot copies the acked and cancelled sets.
func (l *load) snapshot() (acked, cancelled map[string]bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	acked, cancelled = make(map[string]bool, len(l.acked)), make(map[string]bool, len(l.cancelled))
	for k := range l.acked {
		acked[k] = true
	}
	for k := range l.cancelled {
		cancelled[k] = true
	}
	return acked, cancelled
}

// counts returns how many requests were acked and how many failed.
func (l *load) counts() (acked, failed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked), len(l.failed)
}
