package agent

import (
	"fmt"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/node-agent/gpu"
)

const (
	healthy  = shizuv1.Health_HEALTH_HEALTHY
	degraded = shizuv1.Health_HEALTH_DEGRADED
	failed   = shizuv1.Health_HEALTH_FAILED
)

// workloadXIDs are Xids caused by the workload, not the GPU (illegal
// memory access, graphics engine exceptions, a stopped channel); they
// leave the GPU's health alone.
var workloadXIDs = map[int]bool{13: true, 31: true, 32: true, 43: true, 45: true, 68: true, 69: true}

// fatalXIDs make a GPU unusable until it is reset: double-bit ECC (48),
// NVLink error (74), fallen off the bus (79), uncontained ECC (95), GSP
// errors (119, 120), unrecovered ECC (140), row-remap failure (64).
var fatalXIDs = map[int]bool{48: true, 64: true, 74: true, 79: true, 95: true, 119: true, 120: true, 140: true}

// ClassifyXID returns the health an Xid leaves a GPU in: workload Xids keep
// it healthy, fatal ones fail it, any other degrades it.
func ClassifyXID(xid int) shizuv1.Health {
	switch {
	case workloadXIDs[xid]:
		return healthy
	case fatalXIDs[xid]:
		return failed
	default:
		return degraded
	}
}

// HealthChange is one change of a GPU's (Index >= 0) or the node's
// (Index == -1) health.
type HealthChange struct {
	Index          int
	Previous, Now  shizuv1.Health
	XID            int
	ECCCorrected   int64
	ECCUncorrected int64
	Reason         string
}

// HealthBook tracks the health of a node's GPUs. Health only gets worse
// while the agent runs (a failed GPU needs a reset, and a reset means a new
// registration).
type HealthBook struct {
	// CorrectedStorm is how many corrected ECC errors between two samples
	// degrade a GPU.
	CorrectedStorm int64
	gpus           []gpuHealth
	node           shizuv1.Health
}

type gpuHealth struct {
	health           shizuv1.Health
	corrected, uncor int64
	seen             bool
}

// NewHealthBook starts with n healthy GPUs.
func NewHealthBook(n int) *HealthBook {
	b := &HealthBook{CorrectedStorm: 100, gpus: make([]gpuHealth, n), node: healthy}
	for i := range b.gpus {
		b.gpus[i].health = healthy
	}
	return b
}

// Health is GPU i's current health.
func (b *HealthBook) Health(i int) shizuv1.Health {
	if i < 0 || i >= len(b.gpus) {
		return shizuv1.Health_HEALTH_UNSPECIFIED
	}
	return b.gpus[i].health
}

// Node is the node's health: failed when every GPU failed, degraded when
// any GPU is not healthy.
func (b *HealthBook) Node() shizuv1.Health { return b.node }

// Event applies a driver event and returns the changes it causes (the GPU's
// and, when it moves, the node's).
func (b *HealthBook) Event(ev gpu.Event) []HealthChange {
	if ev.Index < 0 || ev.Index >= len(b.gpus) {
		return nil
	}
	switch ev.Kind {
	case gpu.EventXID:
		return b.worsen(ev.Index, ClassifyXID(ev.XID), ev.XID, fmt.Sprintf("Xid %d", ev.XID))
	case gpu.EventECCUncorrected:
		return b.worsen(ev.Index, failed, ev.XID, "uncorrected ECC error")
	case gpu.EventLost:
		return b.worsen(ev.Index, failed, 79, "GPU fell off the bus")
	}
	return nil // corrected ECC errors are judged by their rate, from samples
}

// Sample applies a telemetry sample: a lost GPU fails, new uncorrected ECC
// errors fail it, a storm of corrected ones degrades it.
func (b *HealthBook) Sample(s gpu.Sample) []HealthChange {
	if s.Index < 0 || s.Index >= len(b.gpus) {
		return nil
	}
	g := &b.gpus[s.Index]
	if s.Lost {
		return b.worsen(s.Index, failed, 79, "GPU fell off the bus")
	}
	first := !g.seen
	prevC, prevU := g.corrected, g.uncor
	g.seen, g.corrected, g.uncor = true, s.ECCCorrected, s.ECCUncorrected
	if first {
		return nil // counters since the driver loaded: only increases count
	}
	switch {
	case s.ECCUncorrected > prevU:
		return b.worsen(s.Index, failed, 0, fmt.Sprintf("%d new uncorrected ECC errors", s.ECCUncorrected-prevU))
	case s.ECCCorrected-prevC >= b.CorrectedStorm:
		return b.worsen(s.Index, degraded, 0, fmt.Sprintf("%d corrected ECC errors since the last sample", s.ECCCorrected-prevC))
	}
	return nil
}

func (b *HealthBook) worsen(i int, to shizuv1.Health, xid int, reason string) []HealthChange {
	g := &b.gpus[i]
	if to <= g.health {
		return nil // HEALTHY < DEGRADED < FAILED
	}
	changes := []HealthChange{{Index: i, Previous: g.health, Now: to, XID: xid,
		ECCCorrected: g.corrected, ECCUncorrected: g.uncor, Reason: reason}}
	g.health = to
	node := healthy
	allFailed := true
	for _, x := range b.gpus {
		if x.health != healthy {
			node = degraded
		}
		allFailed = allFailed && x.health == failed
	}
	if allFailed {
		node = failed
	}
	if node != b.node {
		changes = append(changes, HealthChange{Index: -1, Previous: b.node, Now: node, XID: xid,
			Reason: fmt.Sprintf("GPU %d: %s", i, reason)})
		b.node = node
	}
	return changes
}
