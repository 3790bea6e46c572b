package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/node-agent/agent"
	"github.com/shizu-gpu/shizu/services/node-agent/runtime"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/rent"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// storeMarkFile, in the state directory, keeps the capacity store
// generation the agent last registered in and its epoch there, so that an
// agent restarted after Redis was lost can tell the loss from a release.
const storeMarkFile = "capacity-store.json"

// storeMark is what storeMarkFile holds.
type storeMark struct {
	Generation string `json:"generation"`
	Epoch      int64  `json:"epoch"`
}

func (a *nodeAgent) readMark() storeMark {
	var m storeMark
	b, err := os.ReadFile(filepath.Join(a.cfg.stateDir(), storeMarkFile))
	if err == nil && json.Unmarshal(b, &m) != nil {
		a.log.Warn("capacity store mark unreadable; treating the store as the one registered in", "file", storeMarkFile)
		m = storeMark{}
	}
	return m
}

// remember keeps the generation and epoch the agent is registered in, in
// memory and in the state directory.
func (a *nodeAgent) remember(reg capacity.Registration) {
	a.mu.Lock()
	a.epoch, a.generation = int64(reg.Epoch), reg.Generation
	a.mu.Unlock()
	b, _ := json.Marshal(storeMark{Generation: reg.Generation, Epoch: int64(reg.Epoch)})
	path := filepath.Join(a.cfg.stateDir(), storeMarkFile)
	if err := os.WriteFile(path+".tmp", b, 0o600); err == nil {
		err = os.Rename(path+".tmp", path)
		if err == nil {
			return
		}
	}
	a.log.Warn("capacity store mark not written; a restart after a Redis loss would stop the workloads", "file", path)
}

func (a *nodeAgent) generationNow() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.generation
}

// storeLost reads the store's generation and reports whether it is no
// longer the one the agent registered in.
func (a *nodeAgent) storeLost(ctx context.Context) (bool, error) {
	current, err := a.store.Generation(ctx)
	if err != nil {
		return false, err
	}
	return agent.StoreLost(a.generationNow(), current), nil
}

// join registers the node at start, or restores it with the workloads an
// earlier agent left when the store it registered in was lost meanwhile.
func (a *nodeAgent) join(ctx context.Context) error {
	mark := a.readMark()
	current, err := a.store.Generation(ctx)
	if err != nil {
		return fmt.Errorf("read capacity store generation: %w", err)
	}
	if !agent.StoreLost(mark.Generation, current) {
		return a.register(ctx)
	}
	var left []agent.Rental
	for _, w := range a.rt.List() {
		left = append(left, rentalOf(w.Spec, w.StartedAt))
	}
	a.log.Warn("the capacity store was lost while the agent was down; restoring the node with its workloads",
		"workloads", len(left), "epoch", mark.Epoch)
	return a.restore(ctx, mark.Epoch, left, nil)
}

// restore writes the node back into a store that lost it, with the
// allocations of running (and of extra: placements not started yet) and
// the GPUs it knows are not healthy, at the highest epoch the agent knows; a workload the restore cannot keep
// (placed under an older epoch, or its rental held by a later attempt on
// another node) is stopped. When the store holds the node at another
// epoch already, the node registers as usual and renew decides.
func (a *nodeAgent) restore(ctx context.Context, epoch int64, running, extra []agent.Rental) error {
	epoch = agent.RestoreEpoch(epoch, running)
	keep, stops := agent.Restorable(epoch, running)
	a.mu.Lock()
	desc := proto.Clone(a.desc).(*shizuv1.NodeRegistered)
	draining := a.drain.Active
	health := map[int]capacity.GPUHealth{}
	for i := range a.inv.Devices {
		if h, ok := rent.HealthOf(a.health.Health(i)); ok && h != rent.Healthy {
			health[i] = h
		}
	}
	a.mu.Unlock()
	in := capacity.RestoreInput{Node: capacityNode(desc), Epoch: uint64(epoch), Draining: draining, Health: health}
	var restored []agent.Rental
	for _, r := range append(keep, extra...) {
		p := a.placementOf(r, uint64(epoch))
		if err := p.Validate(); err != nil {
			a.log.Error("workload not restorable: its placement is not known", "rental", r.RentalID, "err", err)
			continue
		}
		in.Placements = append(in.Placements, p)
		restored = append(restored, r)
	}
	res, err := a.store.Restore(ctx, in)
	if err != nil {
		return fmt.Errorf("restore node: %w", err)
	}
	if !res.Restored {
		a.log.Warn("the store holds the node at another epoch; registering", "epoch", res.Epoch)
		return a.register(ctx)
	}
	a.remember(res.Registration)
	a.mu.Lock()
	a.restoredIn = res.Generation
	a.mu.Unlock()
	lost := make([]agent.Lost, len(res.Lost))
	for i, l := range res.Lost {
		lost[i] = agent.Lost{RentalID: l.RentalID, NodeID: l.NodeID, Attempt: l.Attempt}
	}
	stops = append(stops, agent.LostStops(keep, lost)...)
	a.stopWorkloads(ctx, stops)
	a.log.Warn("node restored into a capacity store that was lost", "epoch", res.Epoch,
		"restored", len(restored)-len(lost), "stopped", len(stops))
	ev := a.report.Registered(desc, int64(res.Epoch), a.now())
	return a.publish(ctx, subject.NodeRegistered, a.cfg.NodeID, ev)
}

// restoreForStart puts a start's placement back into the store when the
// store lost it: when the store was lost and the lease has not restored
// the node yet, or the node was restored in this generation already (the
// placement was reserved in the lost store). It reports whether it
// restored; the caller renews again.
func (a *nodeAgent) restoreForStart(ctx context.Context, sc *shizuv1.RentalScheduled) (bool, error) {
	current, err := a.store.Generation(ctx)
	if err != nil {
		return false, err
	}
	a.mu.Lock()
	known, restoredIn, epoch := a.generation, a.restoredIn, a.epoch
	a.mu.Unlock()
	if !agent.StoreLost(known, current) && (restoredIn == "" || restoredIn != current) {
		return false, nil
	}
	pending := agent.Rental{RentalID: sc.GetRentalId(), TenantID: sc.GetTenantId(), Attempt: sc.GetAttempt(), Epoch: sc.GetNodeEpoch(),
		CPUMilli: sc.GetCpuMilli(), MemoryMiB: sc.GetMemoryMib()}
	for _, s := range sharesOf(sc) {
		pending.Shares = append(pending.Shares, agent.Share(s))
	}
	a.log.Warn("start placed in a capacity store that was lost; restoring its allocation", "rental", sc.GetRentalId())
	return true, a.restore(ctx, epoch, a.runningList(), []agent.Rental{pending})
}

// placementOf is r's allocation as the store records it. A workload
// recorded before its shares were kept gets them from its GPU UUIDs: its
// milli-GPU on each, VRAM in proportion (a MIG instance's own), no host
// CPU or memory.
func (a *nodeAgent) placementOf(r agent.Rental, epoch uint64) capacity.Placement {
	p := capacity.Placement{RentalID: r.RentalID, NodeID: a.cfg.NodeID, Epoch: epoch, Tenant: r.TenantID,
		CPUMilli: r.CPUMilli, MemoryMiB: r.MemoryMiB, Attempt: max(r.Attempt, 1)}
	for _, s := range r.Shares {
		p.GPUs = append(p.GPUs, capacity.GPUShare{Index: s.Index, Milli: s.Milli, VRAMMiB: s.VRAMMiB,
			MIGProfile: s.MIGProfile, MIGInstance: s.MIGInstance})
	}
	if len(r.Shares) > 0 {
		return p
	}
	for _, uuid := range r.GPUUUIDs {
		for _, d := range a.inv.Devices {
			if d.UUID == uuid {
				p.GPUs = append(p.GPUs, capacity.GPUShare{Index: d.Index, Milli: int64(r.MilliGPU), VRAMMiB: d.VRAMMiB * int64(r.MilliGPU) / 1000})
			}
			for _, m := range d.MIG {
				if m.UUID == uuid {
					p.GPUs = append(p.GPUs, capacity.GPUShare{Index: d.Index, Milli: int64(r.MilliGPU), VRAMMiB: m.VRAMMiB,
						MIGProfile: m.Profile, MIGInstance: m.UUID})
				}
			}
		}
	}
	return p
}

// stopWorkloads stops each workload of stops (its RentalStopped follows
// from the exits loop, with the stop's reason).
func (a *nodeAgent) stopWorkloads(ctx context.Context, stops []agent.Stop) {
	for _, s := range stops {
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

// runningList is every workload the agent runs, stopping or not: each
// holds its GPUs until it has ended.
func (a *nodeAgent) runningList() []agent.Rental {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]agent.Rental, 0, len(a.running))
	for _, r := range a.running {
		out = append(out, r)
	}
	return out
}

// sharesOf is the reservation of a placement, as the runtime keeps it.
func sharesOf(sc *shizuv1.RentalScheduled) []runtime.Share {
	out := make([]runtime.Share, 0, len(sc.GetGpus()))
	for _, g := range sc.GetGpus() {
		s := runtime.Share{Index: int(g.GetGpuIndex()), Milli: int64(g.GetMilliGpu()), VRAMMiB: g.GetVramMib()}
		if m := g.GetMigInstance(); m != nil {
			s.MIGProfile, s.MIGInstance = m.GetProfile(), m.GetUuid()
		}
		out = append(out, s)
	}
	return out
}
