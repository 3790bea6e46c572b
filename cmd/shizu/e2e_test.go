package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/services/metering/pricing"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// buildShizu builds the shizu binary once per test run.
func buildShizu(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "shizu-bin-")
		if err != nil {
			buildErr = err
			return
		}
		builtBin = filepath.Join(dir, "shizu")
		if out, err := exec.Command("go", "build", "-o", builtBin, ".").CombinedOutput(); err != nil {
			buildErr = errors.New("go build: " + err.Error() + "\n" + string(out))
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

// devProcess is a running `shizu dev` and the CLI pointed at it.
type devProcess struct {
	t       *testing.T
	bin     string
	dir     string
	out     []string // stdout up to "Ctrl-C stops everything."
	cmd     *exec.Cmd
	stderr  *bytes.Buffer
	lines   chan string
	exited  chan error
	stopped bool // interrupt has seen it exit
	cfgDir  string
}

// cli runs one shizu verb against the dev platform and returns its exit
// code, stdout and stderr.
func (d *devProcess) cli(args ...string) (int, string, string) {
	d.t.Helper()
	args = append(args, "-dev-dir", d.dir)
	cmd := exec.Command(d.bin, args...)
	// The tenant verbs use the key shizu dev made for tenant dev (from its
	// env file), never one of the environment or of a shizu login.
	cmd.Env = append(os.Environ(), "SHIZU_NATS_URL=", "SHIZU_NATS_USER=", "SHIZU_NATS_PASSWORD=", "SHIZU_REDIS_URL=", "SHIZU_TENANT=dev",
		"SHIZU_API_URL=", "SHIZU_API_KEY=", "SHIZU_CONFIG_DIR="+d.configDir())
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		d.t.Fatalf("run shizu %v: %v", args, err)
	}
	if strings.Contains(errOut.String(), "goroutine ") || strings.Contains(errOut.String(), "panic:") {
		d.t.Fatalf("shizu %v printed a stack trace:\n%s", args, errOut.String())
	}
	return code, out.String(), errOut.String()
}

// configDir is an empty config folder: no shizu login.
func (d *devProcess) configDir() string {
	if d.cfgDir == "" {
		d.cfgDir = d.t.TempDir()
	}
	return d.cfgDir
}

// json runs a verb with -o json, requires success and decodes its output.
func (d *devProcess) json(v any, args ...string) {
	d.t.Helper()
	code, out, errOut := d.cli(append(args, "-o", "json")...)
	if code != 0 {
		d.t.Fatalf("shizu %v: exit %d: %s", args, code, errOut)
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		d.t.Fatalf("shizu %v: %v\n%s", args, err, out)
	}
}

func startDev(t *testing.T, args ...string) *devProcess {
	t.Helper()
	return startDevWithEnv(t, nil, args...)
}

// startDevWithEnv starts `shizu dev` with env (nil: this process's).
func startDevWithEnv(t *testing.T, env []string, args ...string) *devProcess {
	t.Helper()
	d := &devProcess{t: t, bin: buildShizu(t), stderr: &bytes.Buffer{}, lines: make(chan string, 1000), exited: make(chan error, 1)}
	d.cmd = exec.Command(d.bin, append([]string{"dev", "-nats-port", "0", "-nats-monitor-port", "0", "-redis-port", "0", "-api-port", "0"}, args...)...)
	d.cmd.Env = env
	stdout, err := d.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	d.cmd.Stderr = d.stderr
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			d.lines <- sc.Text()
		}
		close(d.lines)
		d.exited <- d.cmd.Wait()
	}()
	t.Cleanup(func() {
		// A failed test still stops shizu dev with Ctrl-C, so an
		// ephemeral one kills its workloads and removes its folder.
		if d.stopped {
			return
		}
		_ = d.cmd.Process.Signal(syscall.SIGINT)
		select {
		case err := <-d.exited:
			if err != nil {
				t.Logf("shizu dev, stopped after the test: %v", err)
			}
		case <-time.After(30 * time.Second):
			_ = d.cmd.Process.Kill()
		}
	})
	dataLine := regexp.MustCompile(`^Shizu dev platform is up\. Data: (\S+) `)
	deadline := time.After(120 * time.Second)
	for {
		select {
		case line, ok := <-d.lines:
			if !ok {
				t.Fatalf("shizu dev exited before it was up: %v\nstderr:\n%s", <-d.exited, d.stderr.String())
			}
			d.out = append(d.out, line)
			if m := dataLine.FindStringSubmatch(line); m != nil {
				d.dir = m[1]
			}
			if strings.HasPrefix(line, "Ctrl-C stops everything") {
				if d.dir == "" {
					t.Fatal("shizu dev did not say where its data is")
				}
				return d
			}
		case <-deadline:
			t.Fatalf("shizu dev not up within 120s; stderr:\n%s", d.stderr.String())
		}
	}
}

// interrupt sends Ctrl-C and waits for a clean exit; it returns what
// shizu dev printed after it was up.
func (d *devProcess) interrupt() string {
	d.t.Helper()
	d.stopped = true
	if err := d.cmd.Process.Signal(syscall.SIGINT); err != nil {
		d.t.Fatal(err)
	}
	var rest []string
	for l := range d.lines {
		rest = append(rest, l)
	}
	select {
	case err := <-d.exited:
		if err != nil {
			d.t.Fatalf("shizu dev exited with %v after Ctrl-C; stderr:\n%s", err, d.stderr.String())
		}
	case <-time.After(60 * time.Second):
		d.t.Fatal("shizu dev did not stop within 60s of Ctrl-C")
	}
	return strings.Join(rest, "\n")
}

// expectedMicros is what metering bills: the list price per GPU-hour ×
// GPUs × milli/1000 × seconds / 3600, rounded half up to a micro-unit.
func expectedMicros(pricePerHour int64, gpus, milli int32, seconds int64) int64 {
	num := new(big.Int).Mul(big.NewInt(pricePerHour), big.NewInt(int64(gpus)*int64(milli)*seconds))
	den := big.NewInt(1000 * 3600)
	q, r := new(big.Int).QuoRem(num, den, new(big.Int))
	if new(big.Int).Mul(r, big.NewInt(2)).Cmp(den) >= 0 {
		q.Add(q, big.NewInt(1))
	}
	return q.Int64()
}

// billedSeconds: every second that starts before the end is billed.
func billedSeconds(start, stop time.Time) int64 {
	d := stop.Sub(start)
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

// TestEndToEndThroughTheCLI starts `shizu dev` as a real process and drives
// it only through the shizu CLI, as a tenant and an operator would: rent
// whole, fractional, NVLink and spot GPUs, list, break a node and see its
// rental migrate, stop, and check the bill to the micro-unit.
func TestEndToEndThroughTheCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	// No minimum charge: the bill must be exactly the seconds run.
	d := startDev(t, "-ephemeral", "-fleet", "h100x8:2,rtx4090x8:1", "-minimum-charge", "0s", "-autoscaler-policy", "testdata/pools.json")

	type rental struct {
		ID       string `json:"rental_id"`
		State    string `json:"state"`
		Why      string `json:"why"`
		Node     string `json:"node"`
		GPUs     []int  `json:"gpus"`
		Model    string `json:"model"`
		Segments []struct {
			Node      string     `json:"node"`
			StartedAt time.Time  `json:"started_at"`
			StoppedAt *time.Time `json:"stopped_at"`
		} `json:"segments"`
		Timeline []struct{ Event, Detail string } `json:"timeline"`
	}
	rent := func(args ...string) rental {
		var r rental
		d.json(&r, append([]string{"rent", "-wait", "60s"}, args...)...)
		if r.State != stateRunning {
			t.Fatalf("rent %v: %s (%s), want running", args, r.State, r.Why)
		}
		return r
	}
	whole := rent("-model", "RTX4090-24GB")
	frac := rent("-fraction", "0.25", "-vram", "6GiB", "-model", "RTX4090-24GB")
	nvl := rent("-gpus", "4", "-nvlink", "-model", "H100-SXM5-80GB")
	spot := rent("-plan", "spot", "-model", "RTX4090-24GB")
	if len(nvl.GPUs) != 4 || !strings.HasPrefix(nvl.Node, "h100x8-") {
		t.Fatalf("NVLink rental on %s GPUs %v", nvl.Node, nvl.GPUs)
	}
	if frac.Node != whole.Node || whole.Model != "RTX4090-24GB" {
		t.Fatalf("RTX rentals on %s and %s (%s)", whole.Node, frac.Node, whole.Model)
	}

	// Impossible specs and bad input: one line, non-zero exit.
	if code, _, errOut := d.cli("rent", "-fraction", "0.3"); code != 2 || !strings.Contains(errOut, "-vram") {
		t.Fatalf("fraction without VRAM: exit %d %q", code, errOut)
	}
	if code, _, errOut := d.cli("show", "r-missing"); code != exitNotFound || !strings.Contains(errOut, "no rental r-missing") {
		t.Fatalf("show of an unknown rental: exit %d %q", code, errOut)
	}

	var list []rental
	d.json(&list, "ls")
	if len(list) != 4 {
		t.Fatalf("ls lists %d rentals, want 4", len(list))
	}
	for _, r := range list {
		if r.State != stateRunning {
			t.Fatalf("ls: %s is %s", r.ID, r.State)
		}
	}

	// Kill the NVLink rental's node: failover sees its heartbeat expire,
	// fences it and announces the migration.
	if code, out, errOut := d.cli("chaos", "kill", nvl.Node); code != 0 || !strings.Contains(out, "stopped") {
		t.Fatalf("chaos kill: exit %d %q %q", code, out, errOut)
	}
	testkit.Eventually(t, 30*time.Second, func() error {
		var r rental
		d.json(&r, "show", nvl.ID)
		for _, s := range r.Timeline {
			if s.Event == "migrating" && strings.Contains(s.Detail, "from "+nvl.Node) {
				return nil
			}
		}
		return fmt.Errorf("no migration from %s in the timeline %+v", nvl.Node, r.Timeline)
	})
	// The scheduler places it again on the other H100 node, and failover
	// reports the move once it runs there.
	testkit.Eventually(t, 30*time.Second, func() error {
		var r rental
		d.json(&r, "show", nvl.ID)
		migrated := false
		for _, s := range r.Timeline {
			migrated = migrated || s.Event == "migrated"
		}
		if r.State != stateRunning || r.Node == nvl.Node || !migrated {
			return fmt.Errorf("%s on %s (%s), migrated %v; want running on the other node after a migration", r.State, r.Node, r.Why, migrated)
		}
		return nil
	})
	code, out, _ := d.cli("show", nvl.ID)
	if code != 0 || !strings.Contains(out, "migrating") || !strings.Contains(out, "migrated") {
		t.Fatalf("show after the kill: exit %d\n%s", code, out)
	}
	t.Logf("shizu show %s after its node was killed:\n%s", nvl.ID, out)
	var nodes []nodeView
	d.json(&nodes, "nodes")
	for _, n := range nodes {
		if n.ID == nvl.Node && n.Status != "dead" {
			t.Fatalf("killed node %s is %s in shizu nodes, want dead", n.ID, n.Status)
		}
		// shizu dev gives failover a system account user, so the agent's
		// closed connection (the server's disconnect advisory) finds the
		// loss before the heartbeat's TTL would.
		if n.ID == nvl.Node && !strings.HasPrefix(n.LastEvent, "lost: agent disconnected") {
			t.Fatalf("killed node %s: last event %q, want lost: agent disconnected", n.ID, n.LastEvent)
		}
	}
	// The node comes back; its agent stops the fenced workload.
	if code, _, errOut := d.cli("chaos", "restart", nvl.Node); code != 0 {
		t.Fatalf("chaos restart: exit %d %q", code, errOut)
	}

	// An Xid 48 (double-bit ECC) fails an idle GPU; shizu nodes shows it.
	if code, out, errOut := d.cli("chaos", "xid", "rtx4090x8-1", "-gpu", "7", "-xid", "48"); code != 0 || !strings.Contains(out, "Xid 48") {
		t.Fatalf("chaos xid: exit %d %q %q", code, out, errOut)
	}
	testkit.Eventually(t, 20*time.Second, func() error {
		d.json(&nodes, "nodes")
		for _, n := range nodes {
			if n.ID == "rtx4090x8-1" && n.GPUs[7].Health == "failed" {
				return nil
			}
		}
		return fmt.Errorf("rtx4090x8-1 GPU 7 not failed in %+v", nodes)
	})

	// Traffic above the pool's threshold scales it out (the policy's pool
	// "chat" of tenant demo starts at its minimum of one replica).
	var ps []poolView
	testkit.Eventually(t, 30*time.Second, func() error {
		if code, _, errOut := d.cli("traffic", "chat", "-concurrent", "40"); code != 0 {
			return fmt.Errorf("traffic: %s", errOut)
		}
		d.json(&ps, "pools", "chat", "-history", "5")
		if len(ps) == 1 && ps[0].Replicas > 1 && ps[0].Decisions[len(ps[0].Decisions)-1].Rule == "threshold:busy" {
			return nil
		}
		return fmt.Errorf("pools %+v", ps)
	})

	// Stop the other three and check the bill.
	for _, r := range []rental{whole, frac, spot} {
		var got rental
		d.json(&got, "stop", r.ID, "-wait", "60s")
		if got.State != stateStopped {
			t.Fatalf("stop %s: %s (%s)", r.ID, got.State, got.Why)
		}
	}
	cat, err := pricing.Shipped()
	if err != nil {
		t.Fatal(err)
	}
	rtx, err := cat.OnDemand("RTX4090-24GB")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		seconds, micros int64
	}{}
	for _, c := range []struct {
		r     rental
		milli int32
	}{{whole, 1000}, {frac, 250}, {spot, 1000}} { // spot: no market price yet, so the list price
		var got rental
		d.json(&got, "show", c.r.ID)
		if len(got.Segments) != 1 || got.Segments[0].StoppedAt == nil {
			t.Fatalf("%s segments %+v", c.r.ID, got.Segments)
		}
		secs := billedSeconds(got.Segments[0].StartedAt, *got.Segments[0].StoppedAt)
		want[c.r.ID] = struct{ seconds, micros int64 }{secs, expectedMicros(rtx.Micros, 1, c.milli, secs)}
	}
	var b billView
	testkit.Eventually(t, 30*time.Second, func() error {
		d.json(&b, "bill")
		n := 0
		for _, c := range b.Charges {
			if w, ok := want[c.Rental]; ok && c.Seconds == w.seconds {
				n++
			}
		}
		if n != len(want) {
			return fmt.Errorf("bill %+v, want the seconds %+v", b.Charges, want)
		}
		return nil
	})
	var total int64
	for _, c := range b.Charges {
		if w, ok := want[c.Rental]; ok {
			if c.Micros != w.micros {
				t.Errorf("%s billed %d µUSD for %d s, want %d (list price %d per GPU-hour)", c.Rental, c.Micros, c.Seconds, w.micros, rtx.Micros)
			}
			total += w.micros
		} else {
			total += c.Micros // the migrated rental: billed to its node's last heartbeat
		}
	}
	if b.Total != total || b.Currency != "USD" {
		t.Fatalf("bill total %d %s, want %d USD", b.Total, b.Currency, total)
	}
	if code, out, _ := d.cli("bill"); code != 0 || !strings.Contains(out, "TOTAL") {
		t.Fatalf("bill table: exit %d\n%s", code, out)
	}

	// Ctrl-C: a clean exit, and the ephemeral folder is gone.
	d.interrupt()
	if _, err := os.Stat(d.dir); !os.IsNotExist(err) {
		t.Fatalf("ephemeral data folder %s still exists: %v", d.dir, err)
	}
	if code, _, errOut := d.cli("ls"); code != 1 || !strings.Contains(errOut, "shizu dev") {
		t.Fatalf("ls after the platform stopped: exit %d %q, want a hint to start shizu dev", code, errOut)
	}
}

// TestPartitionThroughTheCLI cuts a node off the network with shizu chaos
// partition: its workload keeps running while failover fences the node
// and the rental migrates; when the node returns its agent stops the
// fenced workload, so the rental runs once.
func TestPartitionThroughTheCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	d := startDev(t, "-ephemeral", "-fleet", "rtx4090x8:2")
	type rental struct {
		ID       string                           `json:"rental_id"`
		State    string                           `json:"state"`
		Why      string                           `json:"why"`
		Node     string                           `json:"node"`
		Timeline []struct{ Event, Detail string } `json:"timeline"`
	}
	var r rental
	d.json(&r, "rent", "-wait", "60s", "-model", "RTX4090-24GB")
	if r.State != stateRunning {
		t.Fatalf("rent: %s (%s)", r.State, r.Why)
	}
	stateDir := func(node string) string { return filepath.Join(d.dir, "node-agent", node) }
	if n := leftWorkloads(stateDir(r.Node), false); n != 1 {
		t.Fatalf("%d workloads run on %s, want 1", n, r.Node)
	}

	if code, _, errOut := d.cli("chaos", "partition", r.Node, "-for", "0s"); code != 2 || !strings.Contains(errOut, "-for") {
		t.Fatalf("partition -for 0s: exit %d %q", code, errOut)
	}
	code, out, errOut := d.cli("chaos", "partition", r.Node, "-for", "15s")
	if code != 0 || !strings.Contains(out, "cut off") {
		t.Fatalf("chaos partition: exit %d %q %q", code, out, errOut)
	}
	if code, _, errOut := d.cli("chaos", "partition", r.Node); code != 1 || !strings.Contains(errOut, "already partitioned") {
		t.Fatalf("second partition: exit %d %q", code, errOut)
	}
	var list chaosReply
	d.json(&list, "chaos", "list")
	for _, n := range list.Nodes {
		if n.ID == r.Node && (!n.Running || !n.Partitioned) {
			t.Fatalf("chaos list: %+v, want running and partitioned", n)
		}
	}
	// Cut off, the agent runs on and so does the workload.
	if n := leftWorkloads(stateDir(r.Node), false); n != 1 {
		t.Fatalf("%d workloads on the partitioned %s, want 1 still running", n, r.Node)
	}

	// Failover fences the silent node and the rental runs elsewhere.
	testkit.Eventually(t, 60*time.Second, func() error {
		var got rental
		d.json(&got, "show", r.ID)
		migrating := false
		for _, s := range got.Timeline {
			migrating = migrating || (s.Event == "migrating" && strings.Contains(s.Detail, "from "+r.Node))
		}
		if !migrating || got.State != stateRunning || got.Node == r.Node {
			return fmt.Errorf("%s on %s (%s), migrating from %s seen: %v", got.State, got.Node, got.Why, r.Node, migrating)
		}
		return nil
	})

	// The partition heals: the agent reconnects, finds its allocation
	// fenced and stops the old workload, so only the new run is left.
	testkit.Eventually(t, 90*time.Second, func() error {
		if n := leftWorkloads(stateDir(r.Node), false); n != 0 {
			return fmt.Errorf("%d workloads still run on %s", n, r.Node)
		}
		var now chaosReply // fresh: "partitioned" is left out when false
		d.json(&now, "chaos", "list")
		for _, n := range now.Nodes {
			if n.ID == r.Node && n.Partitioned {
				return fmt.Errorf("%s still partitioned", n.ID)
			}
		}
		return nil
	})
	var got rental
	d.json(&got, "show", r.ID)
	if got.State != stateRunning || got.Node == r.Node {
		t.Fatalf("after the partition: %s on %s", got.State, got.Node)
	}
	if n := leftWorkloads(stateDir(got.Node), false); n != 1 {
		t.Fatalf("%d workloads on %s, want the one run of %s", n, got.Node, r.ID)
	}
	d.interrupt()
}
