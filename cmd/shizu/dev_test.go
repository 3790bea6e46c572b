package main

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// TestDevStartsThePlatformAndStopsOnInterrupt builds the shizu binary and
// runs `shizu dev` as a real process, as the README tells a newcomer to;
// then starts it again on the same data folder and finds its rental still
// running.
func TestDevStartsThePlatformAndStopsOnInterrupt(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	data := filepath.Join(t.TempDir(), "data")
	d := startDev(t, "-data", data, "-fleet", "rtx4090x8:1")
	readyURL := regexp.MustCompile(`^\s+(\S+)\s+ready\s+(http://\S+/readyz)`)
	ready := map[string]string{}
	for _, line := range d.out {
		if m := readyURL.FindStringSubmatch(line); m != nil {
			ready[m[1]] = m[2]
		}
	}
	for _, svc := range []string{"scheduler", "metering", "autoscaler", "failover", "gateway", "rtx4090x8-1"} {
		url, ok := ready[svc]
		if !ok {
			t.Fatalf("%s not listed as ready in:\n%s", svc, strings.Join(d.out, "\n"))
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
	_ = c.Close(t.Context())
	// The gateway's URL and the dev tenant's key: the banner says where
	// it saved the key and prints it this once; the key works.
	key := vals[envAPIKey]
	if !strings.Contains(strings.Join(d.out, "\n"), "API key of tenant dev saved in "+filepath.Join(data, "env")) ||
		!strings.Contains(strings.Join(d.out, "\n"), "new key, shown only now: "+key) || !strings.HasPrefix(key, "shz_") {
		t.Fatalf("the banner does not say where the key is and print it once:\n%s", strings.Join(d.out, "\n"))
	}
	api, err := newAPIClient(vals[envAPIURL], key, "", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := api.do(t.Context(), request{method: http.MethodGet, path: "/v1/rentals"}, nil); err != nil {
		t.Fatalf("the env file's key on the env file's gateway: %v", err)
	}
	// The catalogue lists the prices dev's metering bills at.
	var models struct {
		Models []struct {
			Model string `json:"model"`
			Price *struct {
				PerHour int64 `json:"per_gpu_hour_micros"`
			} `json:"on_demand_price"`
		} `json:"models"`
	}
	if err := api.do(t.Context(), request{method: http.MethodGet, path: "/v1/models"}, &models); err != nil {
		t.Fatalf("GET /v1/models: %v", err)
	}
	priced := 0
	for _, m := range models.Models {
		if m.Price != nil && m.Price.PerHour > 0 {
			priced++
		}
	}
	if priced == 0 {
		t.Fatalf("GET /v1/models lists %d models and no price: %+v", len(models.Models), models.Models)
	}
	if fi, err := os.Stat(filepath.Join(data, "env")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("env file mode: %v %v", fi, err)
	}

	type rental struct {
		ID       string `json:"rental_id"`
		State    string `json:"state"`
		Node     string `json:"node"`
		Attempt  int    `json:"attempt"`
		Segments []struct {
			StartedAt time.Time  `json:"started_at"`
			StoppedAt *time.Time `json:"stopped_at"`
		} `json:"segments"`
	}
	var r rental
	d.json(&r, "rent", "-wait", "60s")
	if r.State != stateRunning {
		t.Fatalf("rent: %+v", r)
	}
	if out := d.interrupt(); !strings.Contains(out, "1 rental workloads keep running") {
		t.Fatalf("Ctrl-C did not say the workload keeps running:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(data, "nats", "jetstream")); err != nil {
		t.Fatalf("JetStream store not kept in the data folder: %v", err)
	}
	if _, err := os.Stat(filepath.Join(data, "env")); !os.IsNotExist(err) {
		t.Fatalf("the env file outlives the platform: %v", err)
	}

	// A second start on the same folder: the node agent adopts the
	// workload, finds its allocation (Redis's append-only file) and keeps it.
	d2 := startDev(t, "-data", data, "-fleet", "rtx4090x8:1")
	// The same keys again, not printed again.
	if vals2 := readEnvFile(filepath.Join(data, "env")); vals2[envAPIKey] != key || strings.Contains(strings.Join(d2.out, "\n"), "shown only now") {
		t.Fatalf("a restart made a new key (or printed it):\n%s", strings.Join(d2.out, "\n"))
	}
	var again rental
	d2.json(&again, "show", r.ID)
	if again.State != stateRunning || again.Node != r.Node || again.Attempt != 1 || len(again.Segments) != 1 || again.Segments[0].StoppedAt != nil {
		t.Fatalf("after a restart: %+v, want still running attempt 1 on %s", again, r.Node)
	}
	// The agent checks adopted workloads against the store as it starts: a
	// workload without its allocation would have been stopped as a zombie.
	var nodes []nodeView
	testkit.Eventually(t, 20*time.Second, func() error {
		d2.json(&nodes, "nodes")
		if len(nodes) != 1 || nodes[0].Rentals != 1 || nodes[0].Epoch != 1 {
			return fmt.Errorf("nodes %+v, want the one node at epoch 1 holding the rental", nodes)
		}
		return nil
	})
	d2.json(&again, "show", r.ID)
	if again.State != stateRunning {
		t.Fatalf("the adopted rental did not survive the agent's lease check: %+v", again)
	}
	d2.json(&again, "stop", r.ID, "-wait", "60s")
	if again.State != stateStopped {
		t.Fatalf("stop after the restart: %+v", again)
	}
	d2.interrupt()
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
