package faults

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// The observer: reads what judge needs from the streams (as the admin
// user), the capacity store and /proc.

// readStream returns every message of stream matching filters, in order.
func readStream(ctx context.Context, js jetstream.JetStream, stream string, filters ...string) ([]jetstream.Msg, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	if info.State.Msgs == 0 {
		return nil, nil
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: filters})
	if err != nil {
		return nil, err
	}
	var out []jetstream.Msg
	for {
		batch, err := c.Fetch(1000, jetstream.FetchMaxWait(500*time.Millisecond))
		if err != nil {
			return nil, err
		}
		n := 0
		var last uint64
		for m := range batch.Messages() {
			n++
			out = append(out, m)
			if md, err := m.Metadata(); err == nil {
				last = md.Sequence.Stream
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, err
		}
		if n == 0 || last >= info.State.LastSeq {
			return out, nil
		}
	}
}

// readHistory reads the RENTALS and BILLING streams into a history; acked
// and cancelled come from the load driver. Only the load's tenant is read:
// the poison scenario's messages name another.
func (d *deployment) readHistory(ctx context.Context, acked, cancelled map[string]bool) (history, error) {
	h := newHistory()
	for k := range acked {
		h.Acked[k] = true
	}
	for k := range cancelled {
		h.Cancelled[k] = true
	}
	msgs, err := readStream(ctx, d.js, topology.StreamRentals, "rental."+tenant+".>")
	if err != nil {
		return h, fmt.Errorf("read RENTALS: %w", err)
	}
	runs := map[string]int{} // rental/attempt -> index in h.Runs
	for _, m := range msgs {
		if err := h.add(m.Subject(), m.Data(), runs); err != nil {
			return h, err
		}
	}
	usage, err := readStream(ctx, d.js, topology.StreamBilling, "usage."+tenant+".recorded")
	if err != nil {
		return h, fmt.Errorf("read BILLING: %w", err)
	}
	seen := map[string]bool{}
	for _, m := range usage {
		ev := &shizuv1.UsageRecorded{}
		if err := proto.Unmarshal(m.Data(), ev); err != nil {
			continue // a poison message of the scenario
		}
		if seen[ev.GetMeta().GetEventId()] {
			continue
		}
		seen[ev.GetMeta().GetEventId()] = true
		h.Usage = append(h.Usage, usageRecord{ID: ev.GetMeta().GetEventId(), Rental: ev.GetRentalId(), Node: ev.GetNodeId(),
			Start: ev.GetIntervalStart().AsTime(), End: ev.GetIntervalEnd().AsTime(), Seconds: ev.GetSeconds()})
	}
	return h, nil
}

// add folds one RENTALS message into h. Messages that are not the
// subject's event (the poison scenario's) are skipped.
func (h *history) add(subj string, data []byte, runs map[string]int) error {
	verb := subj[strings.LastIndexByte(subj, '.')+1:]
	runKey := func(rental string, attempt int32) string { return fmt.Sprintf("%s/%d", rental, attempt) }
	decode := func(m proto.Message) bool { return proto.Unmarshal(data, m) == nil }
	switch verb {
	case "requested":
		ev := &shizuv1.RentalRequested{}
		if decode(ev) && ev.GetRentalId() != "" {
			h.Requested[ev.GetRentalId()] = true
		}
	case "scheduled":
		ev := &shizuv1.RentalScheduled{}
		if decode(ev) && ev.GetRentalId() != "" {
			if h.Scheduled[ev.GetRentalId()] == nil {
				h.Scheduled[ev.GetRentalId()] = map[int32]string{}
			}
			h.Scheduled[ev.GetRentalId()][ev.GetAttempt()] = ev.GetNodeId()
			k := placementKey(ev.GetRentalId(), ev.GetAttempt())
			if _, seen := h.PlacedAt[k]; !seen && ev.GetMeta().GetOccurredAt() != nil {
				h.PlacedAt[k] = ev.GetMeta().GetOccurredAt().AsTime()
			}
		}
	case "pending":
		ev := &shizuv1.RentalPending{}
		if decode(ev) && ev.GetRentalId() != "" {
			h.Pending[ev.GetRentalId()] = true
		}
	case "rejected":
		ev := &shizuv1.RentalRejected{}
		if decode(ev) && ev.GetRentalId() != "" {
			h.Rejected[ev.GetRentalId()]++
		}
	case "cancel_requested":
		ev := &shizuv1.RentalCancelRequested{}
		if decode(ev) && ev.GetRentalId() != "" {
			h.Cancelled[ev.GetRentalId()] = true
		}
	case "migrating":
		ev := &shizuv1.RentalMigrating{}
		if decode(ev) && ev.GetRentalId() != "" {
			h.Migrating[ev.GetRentalId()]++
		}
	case "preempted":
		ev := &shizuv1.RentalPreempted{}
		if decode(ev) && ev.GetRentalId() != "" {
			h.Preempted = append(h.Preempted, preemption{Victim: ev.GetRentalId(), Preemptor: ev.GetPreemptingRentalId(),
				At: ev.GetMeta().GetOccurredAt().AsTime(), Deadline: ev.GetNoticeDeadline().AsTime()})
		}
	case "started":
		ev := &shizuv1.RentalStarted{}
		if decode(ev) && ev.GetRentalId() != "" {
			k := runKey(ev.GetRentalId(), ev.GetAttempt())
			if _, ok := runs[k]; !ok {
				runs[k] = len(h.Runs)
				h.Runs = append(h.Runs, runSegment{Rental: ev.GetRentalId(), Attempt: ev.GetAttempt(), Node: ev.GetNodeId(), Started: ev.GetStartedAt().AsTime()})
			}
		}
	case "stopped":
		ev := &shizuv1.RentalStopped{}
		if decode(ev) && ev.GetRentalId() != "" {
			k := runKey(ev.GetRentalId(), ev.GetAttempt())
			i, ok := runs[k]
			if !ok { // a stop whose start the stream has not (yet) shown
				i = len(h.Runs)
				runs[k] = i
				h.Runs = append(h.Runs, runSegment{Rental: ev.GetRentalId(), Attempt: ev.GetAttempt(), Node: ev.GetNodeId(), Started: ev.GetStartedAt().AsTime()})
			}
			h.Runs[i].Stopped, h.Runs[i].Exit = ev.GetStoppedAt().AsTime(), ev.GetExitReason()
		}
	}
	return nil
}

// readCapacity reads every node's GPUs and allocations from the store.
func (d *deployment) readCapacity(ctx context.Context) ([]gpuState, []allocation, error) {
	snap, err := d.store.Snapshot(ctx)
	if err != nil {
		return nil, nil, err
	}
	var gpus []gpuState
	var allocs []allocation
	for _, nd := range snap.Nodes {
		for _, g := range nd.FreeGPUs {
			gpus = append(gpus, gpuState{Node: nd.ID, Index: g.Index, FreeMilli: g.Milli, Sharers: g.Sharers, MaxSharers: g.MaxSharers})
		}
		for _, a := range nd.Allocations {
			allocs = append(allocs, allocation{Rental: a.RentalID, Node: nd.ID, GPUs: a.GPUs, HandingOver: a.HandingOver})
		}
	}
	return gpus, allocs, nil
}

// workloads counts the rental workloads alive on this machine that this
// deployment's agents started, by rental.
func (d *deployment) workloads() map[string]int {
	out := map[string]int{}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		cmdline, err := os.ReadFile(filepath.Join(p, "cmdline"))
		if err != nil || !strings.Contains(string(cmdline), d.workload) {
			continue
		}
		// The agent's status shell (named shizu-workload) is not a run.
		if strings.Contains(string(cmdline), "\x00shizu-workload\x00") {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join(p, "stat")); err == nil {
			if f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:])); len(f) > 0 && f[0] == "Z" {
				continue // exited already
			}
		}
		env, err := os.ReadFile(filepath.Join(p, "environ"))
		if err != nil {
			continue
		}
		for kv := range strings.SplitSeq(string(env), "\x00") {
			if v, ok := strings.CutPrefix(kv, "SHIZU_RENTAL_ID="); ok {
				out[v]++
			}
		}
	}
	return out
}

// observe reads a whole observation.
func (d *deployment) observe(ctx context.Context, l *load) (observation, error) {
	acked, cancelled := l.snapshot()
	h, err := d.readHistory(ctx, acked, cancelled)
	if err != nil {
		return observation{}, err
	}
	o := observation{history: h, Workloads: d.workloads(), FaultedNodes: map[string]bool{}}
	if o.GPUs, o.Allocations, err = d.readCapacity(ctx); err != nil {
		return observation{}, fmt.Errorf("read the capacity store: %w", err)
	}
	return o, nil
}
