package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
)

// Process runs workloads as local process groups. Each workload has a
// record in Dir (what it is, its pid and start time), its output in
// Dir/logs/<rental>-<attempt>.log, and its working directory in
// Dir/work/<rental>-<attempt>. A new Process over the same Dir adopts the
// workloads an earlier one left running and reports those that ended
// meanwhile.
type Process struct {
	dir   string
	now   func() time.Time
	mono  func() time.Duration // the boot clock: never stepped, runs on across agent restarts
	boot  string               // this boot's id
	exits chan Exit
	poll  time.Duration

	mu      sync.Mutex
	running map[string]*proc
	closed  bool
	wg      sync.WaitGroup
}

type proc struct {
	w         Workload
	done      chan struct{} // closed when the process ended
	requested bool          // Stop was called
}

type record struct {
	Spec      Spec      `json:"spec"`
	PID       int       `json:"pid"`
	PIDStart  uint64    `json:"pid_start"` // /proc/<pid>/stat starttime, against pid reuse
	StartedAt time.Time `json:"started_at"`
	// StartedBoot is the boot clock at StartedAt and BootID the boot it
	// belongs to: the stop is stamped StartedAt plus the boot clock's
	// elapsed time, so a stepped wall clock cannot make a stop before the
	// start, in this agent or the next one that adopts the workload.
	StartedBoot time.Duration `json:"started_boot_ns,omitempty"`
	BootID      string        `json:"boot_id,omitempty"`
	LogPath     string        `json:"log_path"`
	// StatusPath is where the workload's status shell writes its exit
	// status (exitstatus.go).
	StatusPath string   `json:"status_path,omitempty"`
	Exit       *exitRec `json:"exit,omitempty"`
}

type exitRec struct {
	StoppedAt time.Time `json:"stopped_at"`
	ExitCode  int       `json:"exit_code"`
	Detail    string    `json:"detail"`
}

// ProcessOption configures a Process.
type ProcessOption func(*Process)

// WithClock sets the wall clock that stamps starts. A stop is stamped
// from its start plus the time the (monotonic) boot clock measured.
func WithClock(now func() time.Time) ProcessOption { return func(p *Process) { p.now = now } }

// NewProcess opens the runtime over dir, adopting workloads left running
// there and queueing the ends of those that stopped while no agent ran.
func NewProcess(dir string, opts ...ProcessOption) (*Process, error) {
	p := &Process{dir: dir, now: time.Now, mono: bootClock, boot: bootID(), exits: make(chan Exit, 256),
		poll: 100 * time.Millisecond, running: map[string]*proc{}}
	for _, o := range opts {
		o(p)
	}
	for _, sub := range []string{"rentals", "logs", "work"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o750); err != nil {
			return nil, fmt.Errorf("runtime dir: %w", err)
		}
	}
	entries, err := os.ReadDir(filepath.Join(dir, "rentals"))
	if err != nil {
		return nil, fmt.Errorf("runtime dir: %w", err)
	}
	var ended []Exit
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		rec, err := p.read(strings.TrimSuffix(e.Name(), ".json"))
		if err != nil {
			return nil, err
		}
		w := Workload{Spec: rec.Spec, PID: rec.PID, StartedAt: rec.StartedAt, LogPath: rec.LogPath, Adopted: true}
		switch {
		case rec.Exit != nil:
			ended = append(ended, Exit{Workload: w, StoppedAt: rec.Exit.StoppedAt, ExitCode: rec.Exit.ExitCode, Detail: rec.Exit.Detail})
		case alive(rec.PID, rec.PIDStart):
			pr := &proc{w: w, done: make(chan struct{})}
			p.running[rec.Spec.RentalID] = pr
			p.wg.Add(1)
			go p.watchAdopted(pr)
		default:
			x, ok := p.fromStatusFile(rec, w)
			if !ok {
				x = Exit{Workload: w, StoppedAt: p.stoppedAt(rec), ExitCode: -1, Detail: "workload ended while no agent watched it"}
			}
			if x.Detail == "" {
				x.Detail = lastLine(rec.LogPath)
			}
			if err := p.writeExit(rec, x); err != nil {
				return nil, err
			}
			ended = append(ended, x)
		}
	}
	for _, x := range ended {
		p.exits <- x
	}
	return p, nil
}

func (p *Process) recordPath(rental string) string {
	return filepath.Join(p.dir, "rentals", rental+".json")
}

func (p *Process) read(rental string) (record, error) {
	var rec record
	b, err := os.ReadFile(p.recordPath(rental))
	if err != nil {
		return rec, fmt.Errorf("workload record %s: %w", rental, err)
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, fmt.Errorf("workload record %s: %w", rental, err)
	}
	return rec, nil
}

func (p *Process) write(rec record) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	path := p.recordPath(rec.Spec.RentalID)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o640); err != nil {
		return fmt.Errorf("workload record: %w", err)
	}
	return os.Rename(tmp, path)
}

func (p *Process) writeExit(rec record, x Exit) error {
	rec.Exit = &exitRec{StoppedAt: x.StoppedAt, ExitCode: x.ExitCode, Detail: x.Detail}
	return p.write(rec)
}

// Start runs spec's command in its own process group with the workload
// environment, its output captured in the rental's log.
func (p *Process) Start(_ context.Context, spec Spec) (Workload, error) {
	if len(spec.Command) == 0 {
		return Workload{}, errors.New("process runtime: the workload has no command")
	}
	if strings.ContainsAny(spec.RentalID, "/\\") || spec.RentalID == "" || strings.HasPrefix(spec.RentalID, ".") {
		return Workload{}, fmt.Errorf("process runtime: rental id %q cannot name a file", spec.RentalID)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return Workload{}, errors.New("process runtime closed")
	}
	if pr, ok := p.running[spec.RentalID]; ok {
		return pr.w, nil
	}
	name := fmt.Sprintf("%s-%d", spec.RentalID, spec.Attempt)
	logPath := filepath.Join(p.dir, "logs", name+".log")
	workDir := filepath.Join(p.dir, "work", name)
	if err := os.MkdirAll(workDir, 0o750); err != nil {
		return Workload{}, fmt.Errorf("workload dir: %w", err)
	}
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return Workload{}, fmt.Errorf("workload log: %w", err)
	}
	defer logFile.Close()
	statusPath := filepath.Join(p.dir, "rentals", name+".status")
	if err := os.Remove(statusPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return Workload{}, fmt.Errorf("workload status: %w", err)
	}
	cmd, err := wrapped(spec.Command, statusPath)
	if err != nil {
		return Workload{}, err
	}
	cmd.Dir = workDir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = environment(spec.Env, workDir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return Workload{}, fmt.Errorf("start workload: %w", err)
	}
	w := Workload{Spec: spec, PID: cmd.Process.Pid, StartedAt: p.now(), LogPath: logPath}
	rec := record{Spec: spec, PID: w.PID, PIDStart: startTime(w.PID), StartedAt: w.StartedAt, StartedBoot: p.mono(),
		BootID: p.boot, LogPath: logPath, StatusPath: statusPath}
	if err := p.write(rec); err != nil {
		_ = syscall.Kill(-w.PID, syscall.SIGKILL)
		_ = cmd.Wait()
		return Workload{}, err
	}
	pr := &proc{w: w, done: make(chan struct{})}
	p.running[spec.RentalID] = pr
	p.wg.Add(1)
	go p.watchChild(pr, cmd, rec)
	return w, nil
}

// environment is PATH, HOME (the work dir), LANG and the workload's own
// variables; nothing else of the agent's environment leaks in.
func environment(extra map[string]string, home string) []string {
	env := map[string]string{"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": home, "LANG": "C.UTF-8"}
	if v, ok := os.LookupEnv("PATH"); ok {
		env["PATH"] = v
	}
	maps.Copy(env, extra)
	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}

func (p *Process) watchChild(pr *proc, cmd *exec.Cmd, rec record) {
	defer p.wg.Done()
	err := cmd.Wait()
	if x, ok := p.fromStatusFile(rec, pr.w); ok {
		p.finish(pr, rec, x)
		return
	}
	// The status shell itself was killed (SIGKILL of the group).
	x := Exit{Workload: pr.w, StoppedAt: p.stoppedAt(rec), ExitCode: cmd.ProcessState.ExitCode()}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		x.ExitCode, x.Detail = -1, "killed by "+signalName(ws.Signal())
	} else if err != nil && x.ExitCode == 0 {
		x.ExitCode = -1
	}
	p.finish(pr, rec, x)
}

// watchAdopted polls a workload this process did not start (it cannot wait
// for it) until it is gone.
func (p *Process) watchAdopted(pr *proc) {
	defer p.wg.Done()
	rec, err := p.read(pr.w.Spec.RentalID)
	if err != nil {
		return
	}
	t := time.NewTicker(p.poll)
	defer t.Stop()
	for range t.C {
		if p.isClosed() {
			return
		}
		if !alive(rec.PID, rec.PIDStart) {
			x, ok := p.fromStatusFile(rec, pr.w)
			if !ok {
				x = Exit{Workload: pr.w, StoppedAt: p.stoppedAt(rec), ExitCode: -1, Detail: "ended (adopted workload; exit code unknown)"}
			}
			p.finish(pr, rec, x)
			return
		}
	}
}

// stoppedAt is when the workload of rec ends if it ends now: its start
// plus the time the boot clock measured since, never a wall-clock reading
// (a step back would put the stop before the start). Only after a reboot
// (another boot id, or a record from before boot times were kept) is the
// wall clock all there is, and then the stop is never before the start.
func (p *Process) stoppedAt(rec record) time.Time {
	if rec.BootID != "" && rec.BootID == p.boot && rec.StartedBoot > 0 {
		if elapsed := p.mono() - rec.StartedBoot; elapsed >= 0 {
			return rec.StartedAt.Add(elapsed)
		}
	}
	if now := p.now(); now.After(rec.StartedAt) {
		return now
	}
	return rec.StartedAt
}

// bootClock reads CLOCK_BOOTTIME: monotonic (never stepped), counting
// suspend, and shared by every process of one boot, so an agent that
// adopts a workload measures from the same origin as the one that started
// it.
func bootClock() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// bootID is the kernel's id of this boot ("" when it cannot be read: the
// boot clock is then not trusted across agents).
func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func (p *Process) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

func (p *Process) finish(pr *proc, rec record, x Exit) {
	p.mu.Lock()
	closed := p.closed
	if !closed {
		delete(p.running, pr.w.Spec.RentalID)
	}
	p.mu.Unlock()
	close(pr.done)
	if closed {
		return // a later agent adopts or reports it
	}
	if x.Detail == "" {
		x.Detail = lastLine(pr.w.LogPath)
	}
	_ = p.writeExit(rec, x)
	p.exits <- x
}

// Stop sends SIGTERM to the workload's process group, SIGKILL after grace,
// and waits for it to end (or ctx).
func (p *Process) Stop(ctx context.Context, rentalID string, grace time.Duration) error {
	p.mu.Lock()
	pr, ok := p.running[rentalID]
	if ok {
		pr.requested = true
	}
	p.mu.Unlock()
	if !ok {
		return ErrNotRunning
	}
	pid := pr.w.PID
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-pr.done:
		return nil
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	select {
	case <-pr.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// List returns the running workloads, sorted by rental id.
func (p *Process) List() []Workload {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Workload, 0, len(p.running))
	for _, pr := range p.running {
		out = append(out, pr.w)
	}
	slices.SortFunc(out, func(a, b Workload) int { return strings.Compare(a.Spec.RentalID, b.Spec.RentalID) })
	return out
}

// Exits reports ended workloads.
func (p *Process) Exits() <-chan Exit { return p.exits }

// Forget removes an ended workload's record (its log stays).
func (p *Process) Forget(rentalID string) error {
	p.mu.Lock()
	_, running := p.running[rentalID]
	p.mu.Unlock()
	if running {
		return fmt.Errorf("forget %s: still running", rentalID)
	}
	if rec, err := p.read(rentalID); err == nil && rec.StatusPath != "" {
		if err := os.Remove(rec.StatusPath); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if err := os.Remove(p.recordPath(rentalID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Close stops watching; the workloads keep running for the next agent.
func (p *Process) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	return nil
}

// alive reports whether pid runs and is the process that was recorded
// (same start time), not a zombie and not a reused pid.
func alive(pid int, start uint64) bool {
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	st, state := procStat(pid)
	if state == "Z" || state == "X" || state == "" {
		return false
	}
	return start == 0 || st == start
}

func startTime(pid int) uint64 {
	st, _ := procStat(pid)
	return st
}

// procStat reads a process's start time (clock ticks after boot) and state
// from /proc/<pid>/stat.
func procStat(pid int) (uint64, string) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, ""
	}
	fields := strings.Fields(s[i+1:])
	if len(fields) < 20 {
		return 0, ""
	}
	st, _ := strconv.ParseUint(fields[19], 10, 64) // field 22 overall
	return st, fields[0]
}

// maxDetail is the most bytes of an exit's Detail.
const maxDetail = 256

// lastLine returns the last non-empty line of a log, cut to maxDetail
// bytes on a rune boundary and valid UTF-8 (it goes into an event, which
// must encode: a progress bar of █ cut at a byte count would not).
func lastLine(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	const tail = 1024
	seeked := false
	if fi, err := f.Stat(); err == nil && fi.Size() > tail {
		_, err = f.Seek(-tail, io.SeekEnd)
		seeked = err == nil
	}
	b, _ := io.ReadAll(f)
	if seeked {
		// The tail may start inside a multi-byte rune.
		for len(b) > 0 && !utf8.RuneStart(b[0]) {
			b = b[1:]
		}
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return shizuv1.Truncate(strings.TrimSpace(lines[len(lines)-1]), maxDetail)
}

var _ Runtime = (*Process)(nil)

// signalName is the signal's constant name ("SIGTERM"), which operators
// search for, rather than its description ("terminated").
func signalName(sig syscall.Signal) string {
	if name := unix.SignalName(sig); name != "" {
		return name
	}
	return sig.String()
}
