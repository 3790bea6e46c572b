package app_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/app"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/gpumodel"
	"github.com/shizu-gpu/shizu/shared/quota"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// quotaReplica starts a scheduler replica as app.Run does: its own NATS
// user and Redis connection, and a watching cache of the quota bucket.
func (e *env) quotaReplica(cfg app.Config) {
	t := e.t
	t.Helper()
	conn := e.connect(t)
	qs, err := quota.Open(t.Context(), conn.JetStream())
	if err != nil {
		t.Fatal(err)
	}
	cache, err := qs.Watch(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := app.New(cfg, app.Deps{Bus: conn, Store: e.Capacity(t), Redis: e.Redis.Client(t), Quotas: cache,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	svc, _ := topology.ServiceNamed(topology.Scheduler)
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	parts, err := s.Start(ctx, svc.Consumers...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		stopCtx, stop := context.WithTimeout(context.WithoutCancel(t.Context()), 10*time.Second)
		defer stop()
		for i := len(parts) - 1; i >= 0; i-- {
			_ = parts[i].Stop(stopCtx)
		}
		cache.Stop()
		_ = conn.Close(stopCtx)
	})
}

// setQuota writes a tenant's quota as an operator would.
func (e *env) setQuota(tenant string, l quota.Limits) {
	e.t.Helper()
	qs, err := quota.Open(e.t.Context(), e.Admin.JetStream())
	if err != nil {
		e.t.Fatal(err)
	}
	if err := qs.Put(e.t.Context(), tenant, l); err != nil {
		e.t.Fatal(err)
	}
}

// usageWatch polls a tenant's usage in the store until stopped and keeps
// the most it saw.
func (e *env) usageWatch(t *testing.T, tenant string) (most func() int64) {
	var max atomic.Int64
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			u, err := e.store.Usage(context.WithoutCancel(t.Context()), tenant)
			if err == nil && u.MilliGPU > max.Load() {
				max.Store(u.MilliGPU)
			}
		}
	})
	var once sync.Once
	stop := func() { once.Do(func() { close(done); wg.Wait() }) }
	t.Cleanup(stop)
	return func() int64 { stop(); return max.Load() }
}

// Two replicas race 40 one-GPU requests of one tenant whose quota is 5
// GPUs, on 32 free GPUs. The tenant never holds more than 5 at once; the
// requests over quota wait with PENDING_REASON_QUOTA (no capacity
// shortage is reported for them) and are placed, 5 at a time, as the
// tenant's rentals stop. Another tenant without a quota is not held back.
func TestTwoReplicasRacingOneTenantNeverPassItsQuota(t *testing.T) {
	t.Parallel()
	const requests, limit = 40, 5
	e := newEnv(t)
	e.register(gpuNode("n1", 8, capacity.MarketOnDemand), gpuNode("n2", 8, capacity.MarketOnDemand),
		gpuNode("n3", 8, capacity.MarketOnDemand), gpuNode("n4", 8, capacity.MarketOnDemand))
	e.setQuota("acme", quota.Limits{MaxGPUs: limit})
	e.quotaReplica(testConfig())
	e.quotaReplica(testConfig())
	most := e.usageWatch(t, "acme")
	var shortMu sync.Mutex
	var shortFor []string
	sub, err := e.Admin.NATS().Subscribe(subject.CapacityShortage, func(m *nats.Msg) {
		ev := &shizuv1.CapacityShortage{}
		if proto.Unmarshal(m.Data, ev) == nil {
			shortMu.Lock()
			shortFor = append(shortFor, ev.GetRentalIds()...)
			shortMu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	var evs []*shizuv1.RentalRequested
	for i := range requests {
		evs = append(evs, requested(fmt.Sprintf("q%02d", i), "acme", spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), time.Now()))
	}
	evs = append(evs, requested("other", "globex", spec(2, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), time.Now()))
	for _, ev := range evs {
		e.publish(ev)
	}
	stoppedIDs := map[string]bool{}
	for round := 0; len(stoppedIDs) < requests; round++ {
		var running []*shizuv1.RentalScheduled
		e.seen.waitFor(t, 30*time.Second, func(o *outcomes) error {
			running = running[:0]
			quotaPending := 0
			for _, ev := range evs[:requests] {
				id := ev.GetRentalId()
				if len(o.scheduled[id]) > 0 {
					if !stoppedIDs[id] {
						running = append(running, o.scheduled[id][0])
					}
					continue
				}
				for _, p := range o.pending[id] {
					if p.GetReason() == shizuv1.PendingReason_PENDING_REASON_QUOTA {
						quotaPending++
						if !strings.Contains(p.GetMessage(), "quota allows") {
							return fmt.Errorf("pending message %q does not name the quota", p.GetMessage())
						}
						break
					}
				}
			}
			left := requests - len(stoppedIDs)
			if want := min(limit, left); len(running) != want || quotaPending != left-want {
				return fmt.Errorf("round %d: %d running, %d pending over quota; want %d and %d", round, len(running), quotaPending, want, left-want)
			}
			if o.shortages != 0 {
				shortMu.Lock()
				defer shortMu.Unlock()
				var why []string
				for _, id := range shortFor {
					for _, p := range o.pending[id] {
						why = append(why, fmt.Sprintf("%s: %v %q", id, p.GetReason(), p.GetMessage()))
					}
				}
				return fmt.Errorf("%d capacity shortages reported for requests held back by their quota: %v %v", o.shortages, shortFor, why)
			}
			return nil
		})
		for _, s := range running {
			stoppedIDs[s.GetRentalId()] = true
			e.publish(stopped(s, shizuv1.ExitReason_EXIT_REASON_COMPLETED))
		}
	}
	e.seen.waitFor(t, 30*time.Second, func(o *outcomes) error {
		if len(o.scheduled["other"]) == 0 {
			return errors.New("the other tenant's request was not placed")
		}
		return nil
	})
	if got := most(); got > limit*capacity.MilliPerGPU {
		t.Fatalf("the tenant held %s GPUs at one point; its quota is %d", capacity.FormatGPUs(got), limit)
	}
	e.seen.mu.Lock()
	defer e.seen.mu.Unlock()
	for id, evs := range e.seen.scheduled {
		if len(evs) > 1 {
			t.Errorf("%s scheduled %d times", id, len(evs))
		}
	}
}

// A per-model limit holds one model back while the tenant's other
// models are placed; the request waits naming the model, and is placed
// when the tenant's rental of that model stops.
func TestAPerModelQuotaHoldsThatModelBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a100 := gpuNode("a1", 4, capacity.MarketOnDemand)
	for i := range a100.GPUs {
		a100.GPUs[i].Model = gpumodel.A100SXM80
	}
	e.register(gpuNode("h1", 4, capacity.MarketOnDemand), a100)
	e.setQuota("acme", quota.Limits{MaxGPUs: 4, MaxGPUsPerModel: map[string]int64{gpumodel.H100SXM80: 1}})
	e.quotaReplica(testConfig())
	on := func(id, model string) *shizuv1.RentalRequested {
		sp := spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND)
		sp.AllowedModels = []string{model}
		return requested(id, "acme", sp, time.Now())
	}
	e.publish(on("h-first", gpumodel.H100SXM80))
	var first *shizuv1.RentalScheduled
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) (err error) { first, err = scheduledOf(o, "h-first"); return })
	e.publish(on("h-second", gpumodel.H100SXM80), on("a-first", gpumodel.A100SXM80))
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) error {
		if _, err := scheduledOf(o, "a-first"); err != nil {
			return err
		}
		if len(o.pending["h-second"]) == 0 {
			return errors.New("h-second not pending")
		}
		p := o.pending["h-second"][0]
		if p.GetReason() != shizuv1.PendingReason_PENDING_REASON_QUOTA || !strings.Contains(p.GetMessage(), "1 "+gpumodel.H100SXM80+" GPUs its quota allows") {
			return fmt.Errorf("h-second pending %v: %q", p.GetReason(), p.GetMessage())
		}
		if len(o.scheduled["h-second"]) > 0 {
			return errors.New("h-second scheduled past its model's quota")
		}
		return nil
	})
	e.publish(stopped(first, shizuv1.ExitReason_EXIT_REASON_COMPLETED))
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) error {
		s, err := scheduledOf(o, "h-second")
		if err == nil && s.GetNodeId() != "h1" {
			return fmt.Errorf("h-second on %s", s.GetNodeId())
		}
		return err
	})
}
