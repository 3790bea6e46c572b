package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestRenderBar(t *testing.T) {
	cases := []struct {
		name               string
		done, total, width int
		elapsed            time.Duration
		note               string
		want, wantPrefix   string
	}{
		{name: "an empty bar at the start has no eta", done: 0, total: 4, width: 60, elapsed: 0,
			want: "bench [..........] 0/4   0% 0.0s"},
		{name: "half way the bar is half full and the eta is the time so far", done: 2, total: 4, width: 60, elapsed: 3 * time.Second,
			want: "bench [#####.....] 2/4  50% 3.0s eta 3.0s"},
		{name: "a finished bar is full", done: 4, total: 4, width: 60, elapsed: 90 * time.Second,
			want: "bench [##########] 4/4 100% 1m30s"},
		{name: "a wide terminal gets a bar of thirty cells", done: 1, total: 3, width: 200, elapsed: time.Second, note: "metering",
			want: "bench [##########....................] 1/3  33% 1.0s eta 2.0s  metering"},
		{name: "more done than total is clamped", done: 9, total: 4, width: 60, elapsed: time.Second,
			want: "bench [##########] 4/4 100% 1.0s"},
		{name: "a long note is cut to the terminal's width", done: 1, total: 2, width: 50, elapsed: time.Second,
			note: strings.Repeat("x", 100), wantPrefix: "bench [#####.....] 1/2  50% 1.0s eta 1.0s  xxx"},
		{name: "a narrow terminal keeps a bar of ten cells", done: 1, total: 2, width: 20, elapsed: time.Second,
			want: "bench [#####.....] "},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := renderBar("bench", c.done, c.total, c.elapsed, c.width, c.note)
			if c.want != "" && got != c.want {
				t.Fatalf("got  %q\nwant %q", got, c.want)
			}
			if !strings.HasPrefix(got, c.wantPrefix) {
				t.Fatalf("got %q, want the prefix %q", got, c.wantPrefix)
			}
			if n := len([]rune(got)); n > c.width-1 {
				t.Fatalf("%q is %d columns, wider than %d-1", got, n, c.width)
			}
		})
	}
}

// clock is a settable clock for the progress display.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestProgressWritesPlainLinesAtMostOncePerInterval(t *testing.T) {
	var buf bytes.Buffer
	c := &clock{t: time.Unix(1000, 0)}
	p := newProgress(&buf, "bench", 10, 2*time.Second)
	p.now, p.start = c.now, c.t
	if p.tty {
		t.Fatal("a buffer is not a terminal")
	}
	for i := 1; i <= 10; i++ {
		c.t = c.t.Add(500 * time.Millisecond)
		p.Update(i, "step")
	}
	p.Finish()
	got := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []string{"bench: [1/10] 0.5s step", "bench: [5/10] 2.5s step", "bench: [9/10] 4.5s step", "bench: [10/10] 5.0s step"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("lines\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if strings.ContainsAny(buf.String(), "\r\x1b") {
		t.Fatalf("plain output has terminal controls: %q", buf.String())
	}
}

func TestProgressRedrawsOneLineOnATerminal(t *testing.T) {
	var buf bytes.Buffer
	c := &clock{t: time.Unix(1000, 0)}
	p := newProgress(&buf, "replay", 2, 0)
	p.now, p.start, p.tty, p.width = c.now, c.t, true, 60
	c.t = c.t.Add(time.Second)
	p.Update(1, "fgd seed 42")
	c.t = c.t.Add(time.Second)
	p.Update(2, "fgd seed 43")
	p.Finish()
	want := "\rreplay [#####.....] 1/2  50% 1.0s eta 1.0s  fgd seed 42\x1b[K" +
		"\rreplay [##########] 2/2 100% 2.0s  fgd seed 43\x1b[K\n"
	if buf.String() != want {
		t.Fatalf("got  %q\nwant %q", buf.String(), want)
	}
}

func TestProgressRedrawsATerminalAtMostTenTimesASecond(t *testing.T) {
	var buf bytes.Buffer
	c := &clock{t: time.Unix(1000, 0)}
	p := newProgress(&buf, "bench", 100, 2*time.Second)
	p.now, p.start, p.tty, p.width = c.now, c.t, true, 60
	for i := 1; i <= 100; i++ {
		c.t = c.t.Add(10 * time.Millisecond)
		p.Update(i, "")
	}
	// At 0.01 s, then every 0.1 s, and the last one.
	if n := strings.Count(buf.String(), "\r"); n != 11 {
		t.Fatalf("%d redraws for 100 updates over 1 s, want 11:\n%q", n, buf.String())
	}
	if !strings.HasSuffix(buf.String(), "100/100 100% 1.0s\x1b[K") {
		t.Fatalf("the last update is not drawn: %q", buf.String())
	}
}

func TestProgressDrawsNothingAfterFinish(t *testing.T) {
	var buf bytes.Buffer
	c := &clock{t: time.Unix(1000, 0)}
	p := newProgress(&buf, "replay", 2, 0)
	p.now, p.start, p.tty, p.width = c.now, c.t, true, 60
	p.Update(1, "")
	p.Finish()
	before := buf.String()
	// The ticker fired while Finish held the lock.
	c.t = c.t.Add(time.Second)
	p.redraw()
	if buf.String() != before {
		t.Fatalf("drawn after Finish: %q", strings.TrimPrefix(buf.String(), before))
	}
}
