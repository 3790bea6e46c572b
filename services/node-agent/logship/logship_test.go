package logship_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/node-agent/logship"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

// recorder is a Publisher that keeps what it was given, failing the
// first failures calls (permanently with permanent).
type recorder struct {
	mu        sync.Mutex
	subjects  []string
	batches   []*shizuv1.RentalLogBatch
	failures  int
	permanent bool
	ids       map[string]bool
}

func (r *recorder) Publish(_ context.Context, subj string, ev proto.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := ev.(*shizuv1.RentalLogBatch)
	if err := b.Validate(); err != nil {
		return backoff.Permanent(err)
	}
	if r.failures > 0 {
		r.failures--
		if r.permanent {
			return backoff.Permanent(errors.New("permission denied"))
		}
		return errors.New("no responders")
	}
	if r.ids == nil {
		r.ids = map[string]bool{}
	}
	if r.ids[b.GetMeta().GetEventId()] {
		return nil // stored once, as the stream does
	}
	r.ids[b.GetMeta().GetEventId()] = true
	r.subjects = append(r.subjects, subj)
	r.batches = append(r.batches, proto.CloneOf(b))
	return nil
}

// lines returns every shipped line's text and the drop markers as
// "[dropped N]", and whether the end was shipped.
func (r *recorder) lines() ([]string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	end := false
	for _, b := range r.batches {
		if b.GetDroppedLines() > 0 {
			out = append(out, fmt.Sprintf("[dropped %d]", b.GetDroppedLines()))
		}
		for _, l := range b.GetLines() {
			t := l.GetText()
			if l.GetTruncated() {
				t = fmt.Sprintf("[cut %d bytes]", len(t))
			}
			out = append(out, t)
		}
		end = end || b.GetEndOfOutput()
	}
	return out, end
}

type counts struct {
	mu                          sync.Mutex
	shipped, truncated, dropped int
}

func (c *counts) Shipped(_ context.Context, lines, truncated int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.shipped += lines
	c.truncated += truncated
}

func (c *counts) Dropped(_ context.Context, lines int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropped += lines
}

var t0 = time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)

// frozen is a clock that never moves: the rate bucket never refills.
func frozen() time.Time { return t0 }

func limits() logship.Limits {
	l := logship.DefaultLimits()
	l.Poll = 5 * time.Millisecond
	return l
}

func output(t *testing.T) (string, func(string)) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "r-1-1.log")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return path, func(s string) {
		if _, err := f.WriteString(s); err != nil {
			t.Fatal(err)
		}
	}
}

func run(path string) logship.Run {
	return logship.Run{RentalID: "r-1", TenantID: "acme", NodeID: "n1", Attempt: 1, Path: path}
}

func start(t *testing.T, ctx context.Context, path string, pub logship.Publisher, lim logship.Limits, c logship.Counts) *logship.Shipper {
	t.Helper()
	s, err := logship.Start(ctx, run(path), pub, lim, frozen, c)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func ended(t *testing.T, s *logship.Shipper) {
	t.Helper()
	s.End()
	select {
	case <-s.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("shipper did not stop after End")
	}
	if err := s.Err(); err != nil {
		t.Fatalf("shipper stopped with %v", err)
	}
}

func TestLinesAreShippedWholeAsTheyAreWrittenAndTheEndLast(t *testing.T) {
	t.Parallel()
	path, write := output(t)
	rec, c := &recorder{}, &counts{}
	s := start(t, t.Context(), path, rec, limits(), c)
	write("hello\nwor")
	testkit.Eventually(t, 5*time.Second, func() error {
		if got, _ := rec.lines(); fmt.Sprint(got) != "[hello]" {
			return fmt.Errorf("shipped %q", got)
		}
		return nil
	})
	write("ld\r\nno newline at the end")
	ended(t, s)
	got, end := rec.lines()
	if want := "[hello world no newline at the end]"; fmt.Sprint(got) != want || !end {
		t.Fatalf("shipped %q (end %v), want %s and the end", got, end, want)
	}
	if rec.subjects[0] != "log.acme.r-1" || rec.batches[0].GetOffset() != 0 || rec.batches[1].GetOffset() != 6 {
		t.Fatalf("subject %s, offsets %d, %d", rec.subjects[0], rec.batches[0].GetOffset(), rec.batches[1].GetOffset())
	}
	if c.shipped != 3 || c.dropped != 0 {
		t.Fatalf("counted %+v", c)
	}
	// The end is recorded: a shipper started again for the run ships nothing.
	again := start(t, t.Context(), path, rec, limits(), c)
	ended(t, again)
	if n := len(rec.batches); n != 3 {
		t.Fatalf("%d batches after a second shipper of an ended run, want 3", n)
	}
}

func TestALongLineIsCutAndMarkedAndTheNextLineIsWhole(t *testing.T) {
	t.Parallel()
	path, write := output(t)
	rec, c := &recorder{}, &counts{}
	lim := limits()
	lim.MaxLineBytes, lim.MaxBatchBytes = 1000, 4000
	s := start(t, t.Context(), path, rec, lim, c)
	write(strings.Repeat("x", 100_000) + "\nnext\n" + strings.Repeat("é", 800) + "\n")
	ended(t, s)
	got, _ := rec.lines()
	// 800 two-byte runes cut at 1,000 bytes: 500 runes, never half of one.
	if want := "[[cut 1000 bytes] next [cut 1000 bytes]]"; fmt.Sprint(got) != want {
		t.Fatalf("shipped %q, want %s", got, want)
	}
	if c.truncated != 2 {
		t.Fatalf("counted %d truncated lines, want 2", c.truncated)
	}
}

func TestANoisyRunIsHeldToItsRateAndEveryDroppedLineIsCounted(t *testing.T) {
	t.Parallel()
	path, write := output(t)
	rec, c := &recorder{}, &counts{}
	lim := limits()
	lim.MaxLineBytes, lim.BurstBytes, lim.MaxBatchLines = 100, 10*(10+logship.LineOverhead), 4
	s := start(t, t.Context(), path, rec, lim, c)
	var b strings.Builder
	for i := range 1000 {
		fmt.Fprintf(&b, "line %04d\n", i) // 9 bytes + newline
	}
	write(b.String())
	ended(t, s)
	got, end := rec.lines()
	// The burst holds ten 9-byte lines; the clock never moves, so the rest
	// is dropped, and said so before the end.
	want := "[line 0000 line 0001 line 0002 line 0003 line 0004 line 0005 line 0006 line 0007 line 0008 line 0009 [dropped 990]]"
	if fmt.Sprint(got) != want || !end {
		t.Fatalf("shipped %q (end %v)\nwant %s and the end", got, end, want)
	}
	if c.shipped+c.dropped != 1000 || c.dropped != 990 {
		t.Fatalf("counted %+v, want 10 shipped and 990 dropped", c)
	}
	for _, bt := range rec.batches {
		if len(bt.GetLines()) > lim.MaxBatchLines {
			t.Fatalf("a batch of %d lines, the limit is %d", len(bt.GetLines()), lim.MaxBatchLines)
		}
	}
}

// ticking is a clock that moves step on every reading.
func ticking(step time.Duration) func() time.Time {
	var mu sync.Mutex
	at := t0
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		at = at.Add(step)
		return at
	}
}

func TestAFloodIsShippedInFullBatchesBetweenLongRunsOfDrops(t *testing.T) {
	t.Parallel()
	path, write := output(t)
	rec, c := &recorder{}, &counts{}
	lim := limits()
	// A batch of 2,000 bytes is about 47 lines; the bucket refills 1 byte
	// per millisecond, and the clock moves a millisecond per line read.
	lim.MaxLineBytes, lim.MaxBatchBytes, lim.BurstBytes, lim.RateBytes = 100, 2000, 2000, 1000
	s, err := logship.Start(t.Context(), run(path), rec, lim, ticking(time.Millisecond), c)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for i := range 10_000 {
		fmt.Fprintf(&b, "line %04d\n", i)
	}
	write(b.String())
	ended(t, s)
	if c.shipped+c.dropped != 10_000 || c.dropped < 9000 {
		t.Fatalf("counted %+v, want 10,000 lines in all, most dropped", c)
	}
	markers := 0
	for i, bt := range rec.batches {
		if n := bt.GetDroppedLines(); n > 0 {
			markers++
			if i < len(rec.batches)-1 && n < 1000 {
				t.Fatalf("batch %d says %d lines dropped: drops should come in long runs, not a few at a time", i, n)
			}
		}
	}
	if markers == 0 || len(rec.batches) > 2*markers+2 {
		t.Fatalf("%d batches with %d drop markers for a flood", len(rec.batches), markers)
	}
}

func TestARestartedShipperGoesOnWhereTheLastStoppedWithNothingLostOrRepeated(t *testing.T) {
	t.Parallel()
	path, write := output(t)
	rec, c := &recorder{}, &counts{}
	ctx, cancel := context.WithCancel(t.Context())
	first := start(t, ctx, path, rec, limits(), c)
	write("one\ntwo\n")
	testkit.Eventually(t, 5*time.Second, func() error {
		if got, _ := rec.lines(); len(got) != 2 {
			return fmt.Errorf("shipped %q", got)
		}
		return nil
	})
	cancel() // the agent stops; the workload runs on
	<-first.Done()
	write("three\n")
	second := start(t, t.Context(), path, rec, limits(), c)
	write("four\n")
	ended(t, second)
	if got, end := rec.lines(); fmt.Sprint(got) != "[one two three four]" || !end {
		t.Fatalf("shipped %q (end %v), want each line once and the end", got, end)
	}
}

func TestABusThatFailsForAWhileLosesNothingAndARefusalIsCounted(t *testing.T) {
	t.Parallel()
	path, write := output(t)
	rec, c := &recorder{failures: 3}, &counts{}
	s := start(t, t.Context(), path, rec, limits(), c)
	write("kept\n")
	ended(t, s)
	if got, _ := rec.lines(); fmt.Sprint(got) != "[kept]" {
		t.Fatalf("shipped %q after transient failures, want the line", got)
	}

	path2, write2 := output(t)
	refused, c2 := &recorder{failures: 1, permanent: true}, &counts{}
	write2("refused\n")
	s2 := start(t, t.Context(), path2, refused, limits(), c2)
	testkit.Eventually(t, 5*time.Second, func() error {
		c2.mu.Lock()
		defer c2.mu.Unlock()
		if c2.dropped != 1 {
			return fmt.Errorf("%d dropped", c2.dropped)
		}
		return nil
	})
	write2("later\n")
	ended(t, s2)
	if got, _ := refused.lines(); fmt.Sprint(got) != "[later]" {
		t.Fatalf("shipped %q, want only the line after the refusal", got)
	}
}

func TestBadLimitsAndKeysAreRefused(t *testing.T) {
	t.Parallel()
	bad := logship.DefaultLimits()
	bad.MaxLineBytes, bad.Poll = shizuv1.MaxLogLineBytes+1, 0
	err := bad.Validate()
	if err == nil || !strings.Contains(err.Error(), "log.max_line_bytes") || !strings.Contains(err.Error(), "log.poll") {
		t.Fatalf("Validate = %v, want both problems named", err)
	}
	r := run("/nonexistent")
	r.TenantID = "a.b"
	if _, err := logship.Start(t.Context(), r, &recorder{}, logship.DefaultLimits(), frozen, &counts{}); err == nil {
		t.Fatal("a tenant with a dot was accepted")
	}
}
