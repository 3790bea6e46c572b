package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	gateway "github.com/shizu-gpu/shizu/services/gateway/app"
	"github.com/shizu-gpu/shizu/services/gateway/identity"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/service"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// gatewayStack is the gateway's Run with its own NATS user on the test
// kit's platform, two tenants with a key each, and a dev folder whose env
// file names the gateway, tenant a's key and the admin, as shizu dev's
// does. The test plays the scheduler and the node agent on the bus.
type gatewayStack struct {
	t      *testing.T
	d      *testkit.Deployment
	url    string
	dir    *identity.Directory
	devDir string
	keyA   string
	keyB   string
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func startGatewayStack(t *testing.T) *gatewayStack {
	t.Helper()
	return startGatewayStackOn(t, testkit.Platform(t))
}

// startGatewayStackOn runs the gateway on d.
func startGatewayStackOn(t *testing.T, d *testkit.Deployment) *gatewayStack {
	t.Helper()
	cfg := gateway.DefaultConfig()
	cfg.Service = d.ServiceConfig(t, topology.Gateway)
	cfg.Service.RedisURL = ""
	cfg.Service.HTTPAddr = freeAddr(t)
	cfg.Listen = freeAddr(t)
	ctx, stop := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- gateway.Run(ctx, cfg) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("gateway: %v", err)
		}
	})
	testkit.Eventually(t, 20*time.Second, func() error { return service.Healthcheck(t.Context(), cfg.Service.HTTPAddr) })
	dir, err := identity.Open(t.Context(), d.Admin.JetStream())
	if err != nil {
		t.Fatal(err)
	}
	s := &gatewayStack{t: t, d: d, url: "http://" + cfg.Listen, dir: dir}
	s.keyA, s.keyB = s.tenantKey("a", identity.ReadWrite), s.tenantKey("b", identity.ReadWrite)
	s.devDir = s.devDirFor(s.keyA)
	s.waitKey(s.keyB)
	return s
}

// devDirFor is a dev folder whose env file names the gateway, key and the
// admin, as shizu dev's does, once the gateway takes key.
func (s *gatewayStack) devDirFor(key string) string {
	s.t.Helper()
	dir := s.t.TempDir()
	env := fmt.Sprintf("export SHIZU_NATS_URL=%s\nexport SHIZU_NATS_USER=%s\nexport SHIZU_NATS_PASSWORD=%s\nexport %s=%s\nexport %s=%s\n",
		s.d.NATS.URL, topology.Admin, testkit.Password(topology.Admin), envAPIURL, s.url, envAPIKey, key)
	if err := os.WriteFile(filepath.Join(dir, "env"), []byte(env), 0o600); err != nil {
		s.t.Fatal(err)
	}
	s.waitKey(key)
	return dir
}

// waitKey waits until the gateway takes key (its watched cache has a new
// key within milliseconds).
func (s *gatewayStack) waitKey(key string) {
	s.t.Helper()
	testkit.Eventually(s.t, 5*time.Second, func() error {
		c, err := newAPIClient(s.url, key, "", 5*time.Second)
		if err != nil {
			return err
		}
		return c.do(s.t.Context(), request{method: "GET", path: "/v1/rentals?limit=1"}, nil)
	})
}

func (s *gatewayStack) tenantKey(tenant string, scope identity.Scope) string {
	s.t.Helper()
	if _, err := s.dir.GetTenant(s.t.Context(), tenant); err != nil {
		if _, err := s.dir.CreateTenant(s.t.Context(), tenant, ""); err != nil {
			s.t.Fatal(err)
		}
	}
	_, key, err := s.dir.CreateKey(s.t.Context(), tenant, scope, "test")
	if err != nil {
		s.t.Fatal(err)
	}
	return key
}

// cli runs a verb against the stack (-dev-dir its folder) and returns the
// exit code, stdout and stderr; stderr must be at most one line.
func (s *gatewayStack) cli(args ...string) (int, string, string) {
	s.t.Helper()
	var out, errOut bytes.Buffer
	code := run(s.t.Context(), append(args, "-dev-dir", s.devDir), &out, &errOut)
	if msg := strings.TrimSpace(errOut.String()); strings.Contains(msg, "\n") {
		s.t.Fatalf("shizu %v: stderr is not one line:\n%s", args, msg)
	}
	return code, out.String(), errOut.String()
}

func (s *gatewayStack) json(v any, args ...string) {
	s.t.Helper()
	code, out, errOut := s.cli(append(args, "-o", "json")...)
	if code != 0 {
		s.t.Fatalf("shizu %v: exit %d: %s", args, code, errOut)
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		s.t.Fatalf("shizu %v: %v\n%s", args, err, out)
	}
}

// publish sends ev for tenant on form as the admin (the scheduler's or
// the node agent's part).
func (s *gatewayStack) publish(form, tenant string, ev proto.Message) {
	s.t.Helper()
	subj, err := subject.Format(form, tenant)
	if err != nil {
		s.t.Fatal(err)
	}
	if _, err := s.d.Admin.Publish(s.t.Context(), subj, ev); err != nil {
		s.t.Fatal(err)
	}
}

// requests delivers the rental ids the gateway asks for on tenant's
// requested subject.
func (s *gatewayStack) requests(form, tenant string) <-chan string {
	s.t.Helper()
	subj, err := subject.Format(form, tenant)
	if err != nil {
		s.t.Fatal(err)
	}
	ids := make(chan string, 16)
	sub, err := s.d.Admin.NATS().Subscribe(subj, func(m *nats.Msg) {
		if ev := decode(m.Header.Get(bus.HeaderEvent), m.Data); ev != nil {
			ids <- rentalIDOfEvent(ev)
		}
	})
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { _ = sub.Unsubscribe() })
	return ids
}

func rentalIDOfEvent(m proto.Message) string {
	if g, ok := m.(interface{ GetRentalId() string }); ok {
		return g.GetRentalId()
	}
	return ""
}

// place plays the scheduler and the node agent: the rental is scheduled
// on n1 GPU 0 and runs.
func (s *gatewayStack) place(tenant, rid string) {
	now := time.Now()
	s.publish(subject.RentalScheduled, tenant, &shizuv1.RentalScheduled{Meta: shizuv1.NewMeta("rental:"+rid+":scheduled:1", "test", "", rid, now),
		RentalId: rid, TenantId: tenant, NodeId: "n1", NodeEpoch: 1, Attempt: 1, GpuModel: "H100-SXM5-80GB",
		Gpus: []*shizuv1.GpuAssignment{{GpuIndex: 0, GpuUuid: "GPU-0", MilliGpu: 1000, VramMib: 81920}}})
	s.publish(subject.RentalStarted, tenant, &shizuv1.RentalStarted{Meta: shizuv1.NewMeta("rental:"+rid+":started:1", "test", "", rid, now),
		RentalId: rid, TenantId: tenant, NodeId: "n1", NodeEpoch: 1, Attempt: 1, StartedAt: timestamppb.New(now)})
}

func (s *gatewayStack) stopped(tenant, rid string) {
	now := time.Now()
	s.publish(subject.RentalStopped, tenant, &shizuv1.RentalStopped{Meta: shizuv1.NewMeta("rental:"+rid+":stopped:1", "test", "", rid, now),
		RentalId: rid, TenantId: tenant, NodeId: "n1", NodeEpoch: 1, Attempt: 1, StartedAt: timestamppb.New(now.Add(-time.Second)),
		StoppedAt: timestamppb.New(now), ExitReason: shizuv1.ExitReason_EXIT_REASON_CANCELLED})
}

// async runs a verb in the background; its result arrives on the channel.
func (s *gatewayStack) async(v any, args ...string) <-chan error {
	done := make(chan error, 1)
	go func() {
		var out, errOut bytes.Buffer
		code := run(s.t.Context(), append(args, "-dev-dir", s.devDir, "-o", "json"), &out, &errOut)
		if code != 0 {
			done <- fmt.Errorf("shizu %v: exit %d: %s", args, code, errOut.String())
			return
		}
		done <- json.Unmarshal(out.Bytes(), v)
	}()
	return done
}

func wait(t *testing.T, ch <-chan string) string {
	t.Helper()
	select {
	case id := <-ch:
		return id
	case <-time.After(20 * time.Second):
		t.Fatal("the gateway published no request within 20 s")
		return ""
	}
}

func waitErr(t *testing.T, ch <-chan error) {
	t.Helper()
	select {
	case err := <-ch:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the verb did not return within 30 s")
	}
}

// The tenant verbs through a real gateway: rent follows the rental's
// events until it runs, ls and show read it back, another tenant's key
// sees none of it, stop asks the gateway and follows until it stopped,
// and the gateway's problems are one line with the request id and an
// exit code by status.
func TestTenantVerbsGoThroughTheGateway(t *testing.T) {
	t.Setenv(envAPIURL, "")
	t.Setenv(envAPIKey, "")
	t.Setenv(envConfigDir, t.TempDir())
	s := startGatewayStack(t)
	requested := s.requests(subject.RentalRequested, "a")
	cancels := s.requests(subject.RentalCancelRequested, "a")

	var r rentalView
	done := s.async(&r, "rent", "-model", "H100-SXM5-80GB", "-label", "team=ml", "-wait", "20s")
	rid := wait(t, requested)
	s.place("a", rid)
	waitErr(t, done)
	if r.ID != rid || r.Tenant != "a" || r.State != stateRunning || r.Node != "n1" || r.Model != "H100-SXM5-80GB" {
		t.Fatalf("rent answered %+v, want %s running on n1 for tenant a", r, rid)
	}

	var list []rentalView
	s.json(&list, "ls")
	if len(list) != 1 || list[0].ID != rid || list[0].State != stateRunning {
		t.Fatalf("ls: %+v", list)
	}
	if code, out, _ := s.cli("ls"); code != 0 || !strings.Contains(out, "RENTAL") || !strings.Contains(out, rid) {
		t.Fatalf("ls table: exit %d\n%s", code, out)
	}
	var shown rentalView
	s.json(&shown, "show", rid)
	if len(shown.Timeline) < 3 || shown.Timeline[0].Event != "requested" {
		t.Fatalf("show: timeline %+v", shown.Timeline)
	}

	// Tenant b's key, from the environment (which wins over the env file).
	t.Setenv(envAPIKey, s.keyB)
	if code, _, errOut := s.cli("show", rid); code != exitNotFound || !strings.Contains(errOut, "shizu show: Not found: no rental "+rid) ||
		!strings.Contains(errOut, "(request id req-") {
		t.Fatalf("show of another tenant's rental: exit %d %q, want %d naming it with the request id", code, errOut, exitNotFound)
	}
	if code, _, errOut := s.cli("stop", rid); code != exitNotFound {
		t.Fatalf("stop of another tenant's rental: exit %d %q", code, errOut)
	}
	s.json(&list, "ls")
	if len(list) != 0 {
		t.Fatalf("b lists a's rentals: %+v", list)
	}
	t.Setenv(envAPIKey, "")

	done = s.async(&r, "stop", rid, "-reason", "done", "-wait", "20s")
	if got := wait(t, cancels); got != rid {
		t.Fatalf("cancel requested for %s, want %s", got, rid)
	}
	s.stopped("a", rid)
	waitErr(t, done)
	if r.State != stateStopped {
		t.Fatalf("stop answered %s (%s), want stopped", r.State, r.Why)
	}

	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"a priority above the platform's bound is the gateway's problem naming the field", []string{"rent", "-priority", "500"}, exitUsage,
			"shizu rent: The request is not valid: priority: at most 100"},
		{"a rental id is the platform's", []string{"rent", "-id", "r-mine"}, exitUsage, "the platform assigns rental ids"},
		{"the tenant is the key's", []string{"ls", "-tenant", "b"}, exitUsage, "the tenant is the one your API key acts for"},
		{"an unknown rental is not found", []string{"show", "r-missing"}, exitNotFound, "no rental r-missing"},
	} {
		code, _, errOut := s.cli(c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("%s: exit %d %q, want %d and %q", c.name, code, errOut, c.code, c.want)
		}
	}

	// A revoked key is refused (3); a gateway that is not there is 5.
	t.Setenv(envAPIKey, s.keyB)
	if _, err := s.dir.RevokeKey(t.Context(), s.keyB[4:16]); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		if code, _, errOut := s.cli("ls"); code != exitDenied || !strings.Contains(errOut, "not valid") || !strings.Contains(errOut, envAPIKey) {
			return fmt.Errorf("ls with a revoked key: exit %d %q", code, errOut)
		}
		return nil
	})
	t.Setenv(envAPIKey, "")
	t.Setenv(envAPIURL, "http://"+freeAddr(t))
	if code, _, errOut := s.cli("ls"); code != exitUnavailable || !strings.Contains(errOut, "cannot reach the gateway") {
		t.Fatalf("ls of no gateway: exit %d %q", code, errOut)
	}
}

// rent -w prints a line for each state until the rental is rejected, and
// exits 1.
func TestRentWatchFollowsUntilRejected(t *testing.T) {
	t.Setenv(envAPIURL, "")
	t.Setenv(envAPIKey, "")
	t.Setenv(envConfigDir, t.TempDir())
	s := startGatewayStack(t)
	requested := s.requests(subject.RentalRequested, "a")
	type result struct {
		code     int
		out, err string
	}
	done := make(chan result, 1)
	go func() {
		code, out, errOut := s.cli("rent", "-gpus", "9", "-w")
		done <- result{code, out, errOut}
	}()
	rid := wait(t, requested)
	now := time.Now()
	s.publish(subject.RentalRejected, "a", &shizuv1.RentalRejected{Meta: shizuv1.NewMeta("rental:"+rid+":rejected", "test", "", rid, now),
		RentalId: rid, TenantId: "a", Reason: shizuv1.RejectReason_REJECT_REASON_UNSATISFIABLE, Message: "needs 9 GPUs on one node; the largest node has 8"})
	var got result
	select {
	case got = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("rent -w did not return within 30 s of the rejection")
	}
	if got.code != exitFail || !strings.Contains(got.out, rid+" requested") || !strings.Contains(got.out, rid+" rejected") ||
		!strings.Contains(got.out, "the largest node has 8") || !strings.Contains(got.err, "was rejected") {
		t.Fatalf("rent -w: exit %d\n%s\n%s", got.code, got.out, got.err)
	}
}

// shizu login checks the key and keeps it (0600 in a 0700 folder); the
// verbs then use it; SHIZU_API_KEY wins; logout forgets it; a refused key
// is not saved.
func TestLoginKeepsTheKeyAndLogoutForgetsIt(t *testing.T) {
	t.Setenv(envAPIURL, "")
	t.Setenv(envAPIKey, "")
	cfgDir := filepath.Join(t.TempDir(), "shizu")
	t.Setenv(envConfigDir, cfgDir)
	s := startGatewayStack(t)
	s.devDir = t.TempDir() // no env file: only what login keeps
	var out bytes.Buffer
	if err := login(t.Context(), s.url, "", strings.NewReader(s.keyB+"\n"), 5*time.Second, &out); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(cfgDir, "credentials")
	for p, want := range map[string]os.FileMode{path: 0o600, cfgDir: 0o700} {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm() != want {
			t.Fatalf("%s: %v, mode %v; want %v", p, err, fi.Mode().Perm(), want)
		}
	}
	requested := s.requests(subject.RentalRequested, "b")
	if code, _, errOut := s.cli("rent", "-wait", "0"); code != 0 {
		t.Fatalf("rent with the saved key: exit %d %s", code, errOut)
	}
	wait(t, requested)
	t.Setenv(envAPIKey, "shz_000000000000_000000000000000000000000000000000000000000000000")
	if code, _, errOut := s.cli("ls"); code != exitDenied || !strings.Contains(errOut, envAPIKey) {
		t.Fatalf("SHIZU_API_KEY does not win: exit %d %q", code, errOut)
	}
	t.Setenv(envAPIKey, "")
	err := login(t.Context(), s.url, "shz_000000000000_000000000000000000000000000000000000000000000000", nil, 5*time.Second, &out)
	if err == nil || !strings.Contains(err.Error(), "nothing saved") {
		t.Fatalf("login with a bad key: %v", err)
	}
	if b, _ := os.ReadFile(path); !strings.Contains(string(b), s.keyB) {
		t.Fatal("a refused login replaced the saved key")
	}
	var lo bytes.Buffer
	if code := run(t.Context(), []string{"logout"}, &lo, &lo); code != 0 || !strings.Contains(lo.String(), "logged out") {
		t.Fatalf("logout: %d %s", code, lo.String())
	}
	if code, _, errOut := s.cli("ls"); code != exitFail || !strings.Contains(errOut, "run `shizu login`") {
		t.Fatalf("ls after logout: exit %d %q", code, errOut)
	}
}

// The API's JSON spec carries what the flags say, in the API's words.
func TestRentSpecJSONUsesTheAPIsWords(t *testing.T) {
	t.Parallel()
	o := rentOptions{gpus: 2, nvlink: true, plan: "spot", maxPrice: "1.20", currency: "USD", labels: labelFlag{"team": "ml"}, pendingTimeout: 30 * time.Minute}
	spec, err := o.spec([]string{"python", "train.py"})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(specJSON(spec))
	want := `{"gpu_count":2,"milli_gpu":1000,"interconnect":"nvlink","plan":"spot","max_spot_price_per_gpu_hour":{"micros":1200000,"currency":"USD"},` +
		`"command":["python","train.py"],"labels":{"team":"ml"},"pending_timeout":"30m0s"}`
	if string(b) != want {
		t.Fatalf("spec JSON\n%s\nwant\n%s", b, want)
	}
}

// readSSE joins data lines, skips comments and stops when told.
func TestReadSSE(t *testing.T) {
	t.Parallel()
	stream := ": keep-alive\n\nevent: rental\nid: 3\ndata: {\"a\":\ndata: 1}\n\nevent: rental\ndata: two\n\nevent: rental\ndata: three\n\n"
	var got []string
	if err := readSSE(strings.NewReader(stream), func(ev, data string) bool {
		got = append(got, ev+"="+data)
		return len(got) == 2
	}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"rental={\"a\":\n1}", "rental=two"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}
