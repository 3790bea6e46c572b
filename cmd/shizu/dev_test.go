package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// TestDevStartsThePlatformAndStopsOnInterrupt builds the shizu binary and
// runs `shizu dev` as a real process, as the README tells a newcomer to.
func TestDevStartsThePlatformAndStopsOnInterrupt(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := filepath.Join(t.TempDir(), "shizu")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	data := filepath.Join(t.TempDir(), "data")
	cmd := exec.Command(bin, "dev", "-data", data, "-nats-port", "0", "-nats-monitor-port", "0", "-redis-port", "0")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	readyURL := regexp.MustCompile(`^\s+(\S+)\s+ready\s+(http://\S+/readyz)`)
	ready := map[string]string{}
	deadline := time.After(120 * time.Second)
	for len(ready) < 5 {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("shizu dev exited before it was up: %v\nstderr:\n%s", <-exited, stderr.String())
			}
			if m := readyURL.FindStringSubmatch(line); m != nil {
				ready[m[1]] = m[2]
			}
		case <-deadline:
			t.Fatalf("shizu dev not up within 120s; stderr:\n%s", stderr.String())
		}
	}
	for _, svc := range []string{"scheduler", "metering", "autoscaler", "failover", "node-agent"} {
		url, ok := ready[svc]
		if !ok {
			t.Fatalf("%s not listed as ready", svc)
		}
		resp, err := http.Get(url)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: GET %s: %v %v", svc, url, resp, err)
		}
		resp.Body.Close()
	}
	env, err := os.ReadFile(filepath.Join(data, "env"))
	if err != nil || !strings.Contains(string(env), "SHIZU_NATS_USER=admin") {
		t.Fatalf("env file: %v %q", err, env)
	}
	// The env file really lets a tool in as admin.
	vals := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(env)), "\n") {
		k, v, _ := strings.Cut(strings.TrimPrefix(l, "export "), "=")
		vals[k] = v
	}
	c, err := bus.Connect(t.Context(), bus.Config{URL: vals["SHIZU_NATS_URL"], User: vals["SHIZU_NATS_USER"], Password: vals["SHIZU_NATS_PASSWORD"]}, bus.Instruments{})
	if err != nil {
		t.Fatalf("connect with the env file's credentials: %v", err)
	}
	if _, err := c.JetStream().Stream(t.Context(), topology.StreamRentals); err != nil {
		t.Fatalf("RENTALS stream: %v", err)
	}
	_ = c.Close(context.Background())

	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	for range lines { // drain output
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("shizu dev exited with %v after Ctrl-C; stderr:\n%s", err, stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("shizu dev did not stop within 60s of Ctrl-C")
	}
	if _, err := os.Stat(filepath.Join(data, "nats", "jetstream")); err != nil {
		t.Fatalf("JetStream store not kept in the data folder: %v", err)
	}
}

func TestProvisionCreatesStreamsAsAdminOnly(t *testing.T) {
	t.Parallel()
	pw := func(u string) string { return "pw-" + u }
	n := testkit.StartNATS(t, testkit.WithUsers(topology.Users(), pw))
	var out, errOut bytes.Buffer
	code := run(t.Context(), []string{"provision", "-nats-url", n.URL, "-nats-user", "scheduler", "-nats-password", pw("scheduler")}, &out, &errOut)
	if code != 1 || !strings.Contains(errOut.String(), "ensure stream") {
		t.Fatalf("scheduler provisioning: exit %d, stderr %q; want a refusal", code, errOut.String())
	}
	out.Reset()
	code = run(t.Context(), []string{"provision", "-nats-url", n.URL, "-nats-password", pw("admin")}, &out, &errOut)
	if code != 0 || !strings.Contains(out.String(), fmt.Sprintf("provisioned %d streams", len(topology.Streams(1)))) {
		t.Fatalf("admin provisioning: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
	// Idempotent.
	if code := run(t.Context(), []string{"provision", "-nats-url", n.URL, "-nats-password", pw("admin")}, &out, &errOut); code != 0 {
		t.Fatalf("second provisioning: exit %d: %s", code, errOut.String())
	}
}

func TestCommandLineErrorsSayWhatIsWrong(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"an unknown command lists the commands", []string{"rnet"}, `unknown command "rnet"`},
		{"no command prints usage", nil, "Usage:"},
		{"provision refuses absurd replicas", []string{"provision", "-replicas", "9"}, "-replicas 9 is out of range 1..5"},
		{"dev refuses stray arguments", []string{"dev", "now"}, `unexpected argument "now"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			if code := run(t.Context(), c.args, &out, &errOut); code != 2 {
				t.Fatalf("exit %d, want 2", code)
			}
			if !strings.Contains(errOut.String(), c.want) {
				t.Fatalf("stderr %q does not say %q", errOut.String(), c.want)
			}
		})
	}
}
