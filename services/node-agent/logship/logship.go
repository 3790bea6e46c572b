// Package logship ships a workload's output to the bus: it follows the
// file the runtime writes the workload's stdout and stderr to (the
// process runtime's Dir/logs/<rental>-<attempt>.log; a container engine's
// log file the same way), cuts it into lines, and publishes them in
// batches (shizuv1.RentalLogBatch) on log.<tenant>.<rental>.
//
// Its memory is bounded whatever the workload writes: one read buffer, one
// batch and one partial line, each capped. A line longer than the cap is
// cut and marked truncated; a token bucket per run holds a noisy workload
// to a byte rate, dropping (and counting) what is over it and saying so in
// the next batch. The file keeps everything: a bus that refuses or fails
// is retried, the reader waiting meanwhile, and the offset shipped so far
// is kept beside the file so that a restarted agent goes on where the last
// one stopped.
package logship

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// Publisher stores one batch on a subject and returns once the stream
// holds it (a repeated event id is stored once). It returns
// backoff.Permanent(err) for a refusal that a retry cannot mend (the batch
// is then counted as dropped); any other error is retried.
type Publisher interface {
	Publish(ctx context.Context, subject string, ev proto.Message) error
}

// Limits bound what one run ships.
type Limits struct {
	// MaxLineBytes cuts longer lines (at most shizuv1.MaxLogLineBytes).
	MaxLineBytes int
	// MaxBatchLines and MaxBatchBytes close a batch (at most
	// shizuv1.MaxLogBatchLines lines; bytes of text).
	MaxBatchLines int
	MaxBatchBytes int
	// RateBytes per second, with bursts up to BurstBytes, is what a run may
	// ship; a line costs its length plus LineOverhead.
	RateBytes  float64
	BurstBytes float64
	// Poll is how often the file is read again once everything in it was
	// shipped.
	Poll time.Duration
}

// LineOverhead is what a line costs against the rate beyond its text, so
// that floods of empty lines are limited too.
const LineOverhead = 32

// DefaultLimits: 16 KiB lines, batches of 500 lines or 48 KiB, 256 KiB/s
// per run with bursts of 4 MiB, read every 250 ms.
func DefaultLimits() Limits {
	return Limits{MaxLineBytes: shizuv1.MaxLogLineBytes, MaxBatchLines: 500, MaxBatchBytes: 48 << 10,
		RateBytes: 256 << 10, BurstBytes: 4 << 20, Poll: 250 * time.Millisecond}
}

// Validate reports every problem in l.
func (l Limits) Validate() error {
	var errs []error
	if l.MaxLineBytes < 1 || l.MaxLineBytes > shizuv1.MaxLogLineBytes {
		errs = append(errs, fmt.Errorf("log.max_line_bytes: %d is out of range 1..%d", l.MaxLineBytes, shizuv1.MaxLogLineBytes))
	}
	if l.MaxBatchLines < 1 || l.MaxBatchLines > shizuv1.MaxLogBatchLines {
		errs = append(errs, fmt.Errorf("log.max_batch_lines: %d is out of range 1..%d", l.MaxBatchLines, shizuv1.MaxLogBatchLines))
	}
	if l.MaxBatchBytes < l.MaxLineBytes {
		errs = append(errs, fmt.Errorf("log.max_batch_bytes: %d is below log.max_line_bytes %d", l.MaxBatchBytes, l.MaxLineBytes))
	}
	if l.RateBytes <= 0 || l.BurstBytes < float64(l.MaxLineBytes+LineOverhead) {
		errs = append(errs, fmt.Errorf("log.rate %v B/s must be > 0 and log.burst %v B at least one full line (%d B)",
			l.RateBytes, l.BurstBytes, l.MaxLineBytes+LineOverhead))
	}
	if l.Poll <= 0 {
		errs = append(errs, fmt.Errorf("log.poll: %s, want > 0", l.Poll))
	}
	return errors.Join(errs...)
}

// Run is one run (attempt) of a rental whose output is shipped.
type Run struct {
	RentalID, TenantID, NodeID string
	Attempt                    int32
	// Path is the file the workload's output goes to.
	Path string
}

// Counts receives what a shipper did, for metrics.
type Counts interface {
	Shipped(ctx context.Context, lines, truncated int)
	Dropped(ctx context.Context, lines int)
}

// Shipper ships one run's output until the run ends (End) or its context
// does.
type Shipper struct {
	run    Run
	subj   string
	pub    Publisher
	lim    Limits
	now    func() time.Time
	counts Counts
	bucket bucket

	ended chan struct{}
	done  chan struct{}
	err   error

	// offset is where the next unshipped line starts; pending is the
	// batch being built, from batchOff; dropped counts lines dropped
	// since the last batch.
	offset, batchOff int64
	pending          []*shizuv1.LogLine
	pendingBytes     int
	dropped          int64
	// dropping is set while the run is over its rate.
	dropping bool
}

// Start ships run's output from where an earlier shipper of the same run
// stopped (its offset file), until End or ctx ends.
func Start(ctx context.Context, run Run, pub Publisher, lim Limits, now func() time.Time, counts Counts) (*Shipper, error) {
	subj, err := subject.Format(subject.Log, run.TenantID, run.RentalID)
	if err != nil {
		return nil, err
	}
	if err := lim.Validate(); err != nil {
		return nil, err
	}
	s := &Shipper{run: run, subj: subj, pub: pub, lim: lim, now: now, counts: counts,
		bucket: bucket{rate: lim.RateBytes, burst: lim.BurstBytes, tokens: lim.BurstBytes, at: now()},
		ended:  make(chan struct{}), done: make(chan struct{})}
	off, finished := readOffset(offsetPath(run.Path))
	s.offset = off
	if finished {
		close(s.done)
		return s, nil
	}
	go func() {
		defer close(s.done)
		s.err = s.ship(ctx)
	}()
	return s, nil
}

// End says the run has ended: the shipper ships what is left of the
// output, then the end of it, and stops.
func (s *Shipper) End() {
	select {
	case <-s.ended:
	default:
		close(s.ended)
	}
}

// Done is closed when the shipper has stopped; Err then says why, nil
// after the end of the output was shipped.
func (s *Shipper) Done() <-chan struct{} { return s.done }

// Err is why the shipper stopped (nil when it shipped the end, or ctx's
// error).
func (s *Shipper) Err() error {
	<-s.done
	return s.err
}

// offsetPath keeps the offset shipped so far beside the output.
func offsetPath(logPath string) string { return logPath + ".shipped" }

// readOffset reads "<offset>" or "<offset> end" (the run's end was
// shipped); a missing or unreadable file means from the start.
func readOffset(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, false
	}
	off, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil || off < 0 {
		return 0, false
	}
	return off, len(f) > 1 && f[1] == "end"
}

func (s *Shipper) writeOffset(end bool) error {
	v := strconv.FormatInt(s.offset, 10)
	if end {
		v += " end"
	}
	path := offsetPath(s.run.Path)
	if err := os.WriteFile(path+".tmp", []byte(v+"\n"), 0o640); err != nil {
		return fmt.Errorf("log offset: %w", err)
	}
	return os.Rename(path+".tmp", path)
}

// ship is the shipper's loop: read every complete line there is, ship
// it, wait for more (or the end).
func (s *Shipper) ship(ctx context.Context) error {
	f, err := s.open(ctx)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Seek(s.offset, io.SeekStart); err != nil {
		return fmt.Errorf("log %s: %w", s.run.Path, err)
	}
	r := bufio.NewReaderSize(f, s.lim.MaxLineBytes+1)
	lr := lineReader{r: r, max: s.lim.MaxLineBytes}
	t := time.NewTimer(s.lim.Poll)
	defer t.Stop()
	for {
		// Read the end flag before the file: what the workload wrote before
		// it ended is then in the file when ended is seen.
		ended := isClosed(s.ended)
		if err := s.drain(ctx, &lr); err != nil {
			return err
		}
		if ended {
			return s.finish(ctx, &lr)
		}
		t.Reset(s.lim.Poll)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.ended:
		case <-t.C:
		}
	}
}

// open opens the output file, waiting for it to appear (a runtime may
// create it after the start is reported) until the run ends.
func (s *Shipper) open(ctx context.Context) (*os.File, error) {
	for {
		f, err := os.Open(s.run.Path)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("log %s: %w", s.run.Path, err)
		}
		if isClosed(s.ended) {
			return nil, fmt.Errorf("log %s: %w", s.run.Path, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.ended:
		case <-time.After(s.lim.Poll):
		}
	}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// drain reads every complete line in the file and ships what the rate
// allows, then publishes the batch it built (and the count of what it
// dropped).
func (s *Shipper) drain(ctx context.Context, lr *lineReader) error {
	for {
		l, ok, err := lr.next()
		if err != nil {
			return fmt.Errorf("log %s: %w", s.run.Path, err)
		}
		if !ok {
			break
		}
		if err := s.take(ctx, l); err != nil {
			return err
		}
	}
	return s.flush(ctx, false)
}

// finish ships the last line (even without its newline), what is left and
// the end of the output.
func (s *Shipper) finish(ctx context.Context, lr *lineReader) error {
	if l, ok := lr.rest(); ok {
		if err := s.take(ctx, l); err != nil {
			return err
		}
	}
	return s.flush(ctx, true)
}

// take adds one line to the batch, or drops it when the run is over its
// rate; a batch is published when full and before a drop (a drop count
// belongs before the lines that follow it).
func (s *Shipper) take(ctx context.Context, l line) error {
	text := shizuv1.Truncate(strings.TrimSuffix(string(l.text), "\r"), s.lim.MaxLineBytes)
	// Once over its rate, a run drops until the bucket holds a full batch
	// again, so a flood is shipped as full batches between long runs of
	// drops, not as a message for every few lines that squeeze in.
	now := s.now()
	resume := min(s.lim.BurstBytes, float64(s.lim.MaxBatchBytes))
	if (s.dropping && !s.bucket.holds(now, resume)) || !s.bucket.take(now, float64(len(text)+LineOverhead)) {
		s.dropping = true
		if len(s.pending) > 0 {
			if err := s.flush(ctx, false); err != nil {
				return err
			}
		}
		s.dropped++
		s.offset += l.size
		s.counts.Dropped(ctx, 1)
		return nil
	}
	s.dropping = false
	if len(s.pending) >= s.lim.MaxBatchLines || s.pendingBytes+len(text) > s.lim.MaxBatchBytes {
		if err := s.flush(ctx, false); err != nil {
			return err
		}
	}
	if len(s.pending) == 0 {
		s.batchOff = s.offset
	}
	s.pending = append(s.pending, &shizuv1.LogLine{ReadAt: timestamppb.New(now), Text: text, Truncated: l.truncated})
	s.pendingBytes += len(text)
	s.offset += l.size
	return nil
}

// flush publishes the batch being built (with the drops before it; with
// end, the end of the output), retrying until the bus takes it or ctx
// ends, then records the offset shipped.
func (s *Shipper) flush(ctx context.Context, end bool) error {
	if len(s.pending) == 0 && s.dropped == 0 && !end {
		return nil
	}
	if len(s.pending) == 0 {
		s.batchOff = s.offset
	}
	id := fmt.Sprintf("log:%s:%d:%d-%d", s.run.RentalID, s.run.Attempt, s.batchOff, s.offset)
	if end {
		id += ":end"
	}
	b := &shizuv1.RentalLogBatch{
		Meta:     shizuv1.NewMeta(id, "node-agent/"+s.run.NodeID, "", s.run.RentalID, s.now()),
		RentalId: s.run.RentalID, TenantId: s.run.TenantID, NodeId: s.run.NodeID, Attempt: s.run.Attempt,
		Offset: s.batchOff, Lines: s.pending, DroppedLines: s.dropped, EndOfOutput: end,
	}
	err := s.publish(ctx, b)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		// Refused for good: the lines are lost, and counted so.
		s.counts.Dropped(ctx, len(s.pending))
		s.pending, s.pendingBytes, s.dropped = nil, 0, 0
		return s.writeOffset(end)
	}
	truncated := 0
	for _, l := range s.pending {
		if l.GetTruncated() {
			truncated++
		}
	}
	s.counts.Shipped(ctx, len(s.pending), truncated)
	s.pending, s.pendingBytes, s.dropped = nil, 0, 0
	return s.writeOffset(end)
}

// publish retries a failing publish with a backoff until ctx ends: the
// output waits in the file meanwhile.
func (s *Shipper) publish(ctx context.Context, b *shizuv1.RentalLogBatch) error {
	eb := backoff.NewExponentialBackOff(backoff.WithInitialInterval(100*time.Millisecond),
		backoff.WithMaxInterval(5*time.Second), backoff.WithMaxElapsedTime(0))
	return backoff.Retry(func() error { return s.pub.Publish(ctx, s.subj, b) }, backoff.WithContext(eb, ctx))
}

// line is one line read from the output: its text (cut at the cap,
// without the newline), whether it was cut, and how many bytes of the
// file it took.
type line struct {
	text      []byte
	truncated bool
	size      int64
}

// lineReader cuts a file into lines with bounded memory: a line longer
// than max keeps its first max bytes and skips the rest up to its
// newline; a line still being written (no newline yet) waits in partial.
type lineReader struct {
	r       *bufio.Reader
	max     int
	partial []byte
	// size and cut describe partial: bytes of the file it took (also
	// what was skipped) and whether it was cut.
	size int64
	cut  bool
}

// next returns the next complete line, false when the file has none yet.
func (lr *lineReader) next() (line, bool, error) {
	for {
		chunk, err := lr.r.ReadSlice('\n')
		lr.size += int64(len(chunk))
		room := lr.max - len(lr.partial)
		keep := bytes.TrimSuffix(chunk, []byte("\n"))
		if len(keep) > room {
			keep, lr.cut = keep[:max(room, 0)], true
		}
		lr.partial = append(lr.partial, keep...)
		switch {
		case err == nil:
			l := line{text: lr.partial, truncated: lr.cut, size: lr.size}
			lr.partial, lr.size, lr.cut = nil, 0, false
			return l, true, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			return line{}, false, nil
		default:
			return line{}, false, err
		}
	}
}

// rest returns the line being written when the output ended without a
// newline.
func (lr *lineReader) rest() (line, bool) {
	if lr.size == 0 {
		return line{}, false
	}
	l := line{text: lr.partial, truncated: lr.cut, size: lr.size}
	lr.partial, lr.size, lr.cut = nil, 0, false
	return l, true
}

// bucket is a token bucket of bytes, refilled at rate per second up to
// burst.
type bucket struct {
	rate, burst, tokens float64
	at                  time.Time
}

func (b *bucket) refill(now time.Time) {
	if el := now.Sub(b.at).Seconds(); el > 0 {
		b.tokens = min(b.burst, b.tokens+el*b.rate)
		b.at = now
	}
}

// holds reports whether the bucket has level tokens.
func (b *bucket) holds(now time.Time, level float64) bool {
	b.refill(now)
	return b.tokens >= level
}

func (b *bucket) take(now time.Time, cost float64) bool {
	b.refill(now)
	if b.tokens < cost {
		return false
	}
	b.tokens -= cost
	return true
}
