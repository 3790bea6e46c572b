package app

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/protobuf/proto"

	"github.com/shizu-gpu/shizu/services/node-agent/logship"
	"github.com/shizu-gpu/shizu/services/node-agent/runtime"
)

// logShipping ships the output of every workload on the node, one
// logship.Shipper per run, from the file the runtime writes it to. A nil
// one ships nothing (an agent put together over fakes in a test).
type logShipping struct {
	ctx    context.Context // the loops' context: shippers stop with the agent
	pub    logship.Publisher
	lim    logship.Limits
	now    func() time.Time
	counts logship.Counts
	log    *slog.Logger
	node   string

	mu   sync.Mutex
	runs map[string]*logship.Shipper // by runKey
	wg   sync.WaitGroup
}

func newLogShipping(ctx context.Context, a *nodeAgent) *logShipping {
	return &logShipping{ctx: ctx, pub: logPublisher{a.bus}, lim: a.cfg.Logs, now: a.now, counts: logCounts{a.m},
		log: a.log, node: a.cfg.NodeID, runs: map[string]*logship.Shipper{}}
}

// start ships w's output from where the last shipper of the run stopped.
func (l *logShipping) start(w runtime.Workload) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.runs[runKey(w)]; ok {
		return
	}
	l.begin(w)
}

// begin starts a shipper for w; call with l.mu held.
func (l *logShipping) begin(w runtime.Workload) *logship.Shipper {
	run := logship.Run{RentalID: w.Spec.RentalID, TenantID: w.Spec.TenantID, NodeID: l.node, Attempt: w.Spec.Attempt, Path: w.LogPath}
	s, err := logship.Start(l.ctx, run, l.pub, l.lim, l.now, l.counts)
	if err != nil {
		l.log.Warn("workload output not shipped", "rental", run.RentalID, "err", err)
		return nil
	}
	key := runKey(w)
	l.runs[key] = s
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		<-s.Done()
		if err := s.Err(); err != nil && l.ctx.Err() == nil {
			l.log.Warn("workload output shipping stopped", "rental", run.RentalID, "err", err)
		}
		l.mu.Lock()
		if l.runs[key] == s {
			delete(l.runs, key)
		}
		l.mu.Unlock()
	}()
	return s
}

// end ships the rest of w's output and its end, and returns what is
// closed once that is done (nil when nothing ships it). A workload that
// ended while no agent ran gets a shipper now, from where the last one
// stopped.
func (l *logShipping) end(w runtime.Workload) <-chan struct{} {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.runs[runKey(w)]
	if !ok {
		s = l.begin(w)
	}
	if s == nil {
		return nil
	}
	s.End()
	return s.Done()
}

// logDrainWait is how long the report of an exit waits for the rest of
// the run's output to be shipped before it forgets the run anyway (a
// flood being read through).
const logDrainWait = 2 * time.Second

// shipped waits, at most logDrainWait, until done (a run's output) is
// shipped; false when ctx ended first: the run's record then stays, and
// the next agent ships the rest when it reports the exit again.
func shipped(ctx context.Context, done <-chan struct{}) bool {
	if done == nil {
		return true
	}
	t := time.NewTimer(logDrainWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	case <-ctx.Done():
		return false
	}
	return true
}

// runKey names one run: a rental placed on this node again (a later
// attempt) is another run, with its own output file.
func runKey(w runtime.Workload) string { return fmt.Sprintf("%s/%d", w.Spec.RentalID, w.Spec.Attempt) }

// wait waits for the shippers, which stop with the loops' context.
func (l *logShipping) wait() {
	if l != nil {
		l.wg.Wait()
	}
}

// logPublisher publishes batches; a refusal a retry cannot mend (invalid,
// not permitted) is permanent.
type logPublisher struct{ p publisher }

func (p logPublisher) Publish(ctx context.Context, subject string, ev proto.Message) error {
	err := p.p.Publish(ctx, subject, ev)
	if permanent(err) {
		return backoff.Permanent(err)
	}
	return err
}

// logCounts counts lines shipped, cut and dropped.
type logCounts struct{ m *metrics }

func (c logCounts) Shipped(ctx context.Context, lines, truncated int) {
	c.m.logLines.Add(ctx, int64(lines), metric.WithAttributeSet(logShipped))
	if truncated > 0 {
		c.m.logLines.Add(ctx, int64(truncated), metric.WithAttributeSet(logTruncated))
	}
}

func (c logCounts) Dropped(ctx context.Context, lines int) {
	c.m.logLines.Add(ctx, int64(lines), metric.WithAttributeSet(logDropped))
}
