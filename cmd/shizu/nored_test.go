package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/shared/testkit"
)

// pathWithout is a PATH of one folder holding links to every program on
// this process's PATH except those named in hide, as on a machine where
// they are not installed.
func pathWithout(t *testing.T, hide ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range filepath.SplitList(os.Getenv("PATH")) {
		entries, err := os.ReadDir(d)
		if err != nil {
			continue
		}
		for _, e := range entries {
			name := e.Name()
			hidden := false
			for _, h := range hide {
				hidden = hidden || name == h
			}
			link := filepath.Join(dir, name)
			if _, err := os.Lstat(link); hidden || err == nil {
				continue // hidden, or an earlier PATH folder had it
			}
			if err := os.Symlink(filepath.Join(d, name), link); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}

// TestDevRunsWithoutRedisServer is the README's first command on a fresh
// machine that has Go but no redis-server: shizu dev warns and embeds a
// Redis-compatible server, and every capacity, metering and autoscaler
// script works on it (whole, fractional, MIG and NVLink rentals, a stop,
// a bill).
func TestDevRunsWithoutRedisServer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	path := pathWithout(t, "redis-server")
	env := []string{"PATH=" + path, "HOME=" + t.TempDir(), "TMPDIR=" + os.TempDir()}
	d := startDevWithEnv(t, env, "-ephemeral", "-fleet", "h100x8:1,h100x8-mig:1", "-minimum-charge", "0s")
	if up := strings.Join(d.out, "\n"); !strings.Contains(up, "WARNING: redis-server is not installed") {
		t.Fatalf("shizu dev did not warn that Redis is embedded:\n%s", up)
	}

	type rental struct {
		ID    string `json:"rental_id"`
		State string `json:"state"`
		Why   string `json:"why"`
		Node  string `json:"node"`
		GPUs  []int  `json:"gpus"`
	}
	rent := func(args ...string) rental {
		var r rental
		d.json(&r, append([]string{"rent", "-wait", "60s"}, args...)...)
		if r.State != stateRunning {
			t.Fatalf("rent %v: %s (%s), want running", args, r.State, r.Why)
		}
		return r
	}
	whole := rent()
	rent("-fraction", "0.25", "-vram", "20GiB")
	mig := rent("-mig", "1g.10gb")
	nvl := rent("-gpus", "4", "-nvlink")
	if mig.Node != "h100x8-mig-1" || len(nvl.GPUs) != 4 {
		t.Fatalf("MIG rental on %s, NVLink rental on GPUs %v", mig.Node, nvl.GPUs)
	}

	if code, out, errOut := d.cli("stop", whole.ID); code != 0 || !strings.Contains(out, "stopped") {
		t.Fatalf("stop: exit %d %q %q", code, out, errOut)
	}
	// The stop's record is closed at once (no minimum charge): billed.
	testkit.Eventually(t, 30*time.Second, func() error {
		var b billView
		d.json(&b, "bill")
		for _, c := range b.Charges {
			if c.Rental == whole.ID && c.Micros > 0 && c.Seconds > 0 {
				return nil
			}
		}
		return fmt.Errorf("the stopped rental %s is not billed yet: %+v", whole.ID, b.Charges)
	})
	d.interrupt()
}
