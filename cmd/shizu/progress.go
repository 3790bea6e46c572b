package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// progress shows how far long work has come, always on stderr so that
// stdout (tables, -o json) stays clean: on a terminal a bar redrawn in
// place, otherwise plain lines, at most one per interval.
type progress struct {
	w     io.Writer
	tty   bool
	width int // terminal columns; 0 when not a terminal
	label string
	total int
	every time.Duration // plain lines: the least time between two
	now   func() time.Time

	mu       sync.Mutex
	start    time.Time
	done     int
	note     string
	lastLine time.Time // the last plain line or redraw
	drawn    bool      // a bar is on the terminal's last line
	finished bool      // Finish ran: nothing is drawn any more
	stop     chan struct{}
}

// newProgress starts a progress display of total steps on w. every is the
// least time between plain lines (0: a line per update).
func newProgress(w io.Writer, label string, total int, every time.Duration) *progress {
	cols, tty := terminalWidth(w)
	p := &progress{w: w, tty: tty, width: cols, label: label, total: total, every: every, now: time.Now}
	p.start = p.now()
	if tty {
		// Keep the elapsed time moving between updates.
		p.stop = make(chan struct{})
		go p.tick(p.stop, time.Second)
	}
	return p
}

// tick redraws the bar every interval until stop is closed.
func (p *progress) tick(stop <-chan struct{}, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			p.redraw()
		}
	}
}

// redraw draws the bar again (the elapsed time moved) unless Finish ran:
// the ticker may fire while Finish holds the lock.
func (p *progress) redraw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.finished {
		return
	}
	p.draw()
}

// draw redraws the bar; p.mu is held.
func (p *progress) draw() {
	fmt.Fprint(p.w, "\r"+renderBar(p.label, p.done, p.total, p.now().Sub(p.start), p.width, p.note)+"\x1b[K")
	p.drawn = true
}

// terminalWidth reports whether w is a terminal and how many columns it has.
func terminalWidth(w io.Writer) (int, bool) {
	f, ok := w.(*os.File)
	if !ok {
		return 0, false
	}
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		return 0, false
	}
	if ws.Col == 0 {
		return 80, true
	}
	return int(ws.Col), true
}

// Update records that done steps are finished, with a short note on the
// latest one, and redraws the bar or prints a line.
func (p *progress) Update(done int, note string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done, p.note = done, note
	now := p.now()
	if p.tty {
		// A terminal is redrawn at most ten times a second (and at the end).
		if now.Sub(p.lastLine) >= 100*time.Millisecond || done >= p.total {
			p.lastLine = now
			p.draw()
		}
		return
	}
	if p.every > 0 && now.Sub(p.lastLine) < p.every && done < p.total {
		return
	}
	p.lastLine = now
	fmt.Fprintln(p.w, plainLine(p.label, p.done, p.total, now.Sub(p.start), p.note))
}

// Finish ends the display: the bar's line is closed on a terminal.
func (p *progress) Finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.finished = true
	if p.stop != nil {
		close(p.stop)
		p.stop = nil
	}
	if p.tty && p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}

// plainLine is one progress line for a log or a pipe.
func plainLine(label string, done, total int, elapsed time.Duration, note string) string {
	s := fmt.Sprintf("%s: [%d/%d] %s", label, done, total, formatElapsed(elapsed))
	if note != "" {
		s += " " + note
	}
	return s
}

// renderBar draws "label [#####.....] done/total pct elapsed eta note" in at
// most width columns (the note is cut first, then the bar narrowed).
func renderBar(label string, done, total int, elapsed time.Duration, width int, note string) string {
	if total < 1 {
		total = 1
	}
	done = min(max(done, 0), total)
	frac := float64(done) / float64(total)
	tail := fmt.Sprintf(" %d/%d %3.0f%% %s", done, total, frac*100, formatElapsed(elapsed))
	if done > 0 && done < total {
		eta := time.Duration(float64(elapsed) * float64(total-done) / float64(done))
		tail += " eta " + formatElapsed(eta)
	}
	if width <= 0 {
		width = 80
	}
	// label + " [" + bar + "]" + tail + note: the bar's length depends on
	// the width alone (so it does not jump as the text changes), 10 to 30
	// cells; the note gets what is left.
	cells := min(30, max(10, (width-40)/2))
	fill := int(frac * float64(cells))
	bar := strings.Repeat("#", fill) + strings.Repeat(".", cells-fill)
	s := label + " [" + bar + "]" + tail
	if note != "" {
		s += "  " + note
	}
	if r := []rune(s); len(r) > width-1 {
		s = string(r[:max(width-1, 0)])
	}
	return s
}

// formatElapsed prints a duration to a tenth of a second below a minute
// and to the second above.
func formatElapsed(d time.Duration) string {
	if d < time.Minute {
		return fmt.Sprintf("%.1fs", d.Seconds())
	}
	return d.Round(time.Second).String()
}
