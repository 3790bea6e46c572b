package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	failover "github.com/shizu-gpu/shizu/services/failover/app"
	metering "github.com/shizu-gpu/shizu/services/metering/app"
	scheduler "github.com/shizu-gpu/shizu/services/scheduler/app"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/quota"
	"github.com/shizu-gpu/shizu/shared/service"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

const (
	tenant = "acme"
	// heartbeatTTL is the agents' default and the bucket's.
	heartbeatTTL = 3 * time.Second
	sysUser      = "sys"
)

func password(user string) string { return "pw-" + user }

// withSystemUser gives the server an explicit system account with one user,
// who may read the client-disconnect advisories (failover's fast path).
func withSystemUser(user, pw string) func(*server.Options) {
	return func(o *server.Options) {
		sys := server.NewAccount("SYS")
		o.Accounts = append(o.Accounts, sys)
		o.SystemAccount = "SYS"
		o.Users = append(o.Users, &server.User{Username: user, Password: pw, Account: sys})
	}
}

// buildAgent is the workspace's node-agent binary, built once per test
// binary run.
func buildAgent(t testing.TB) string {
	return testkit.GoBuild(t, "github.com/shizu-gpu/shizu/services/node-agent/cmd/node-agent")
}

// stack is the whole platform under test: NATS, Redis, the scheduler,
// metering and failover in this process, node agents as child processes,
// and a recorder of every rental and node-loss event.
type stack struct {
	t     testing.TB
	nats  *testkit.NATS
	redis *testkit.Redis
	admin *bus.Conn
	js    jetstream.JetStream
	store *capacity.Store
	dir   string
	bin   string
	logs  *os.File

	agents map[string]*exec.Cmd
	nodes  []string
	// beat is each node's heartbeat interval (see startAgentBeating).
	beat map[string]time.Duration

	svcMu   sync.Mutex
	svcErrs []error

	rec *recorder
}

// stackConfig is what a scenario changes in the services.
type stackConfig struct {
	// MeterInterval and CloseGrace: records of running rentals close at
	// multiples of the interval, CloseGrace after the boundary. The grace
	// must outlast the detection of a loss, or a record published before
	// the RentalMigrating would bill part of the dead interval (metering's
	// documented limit).
	MeterInterval, CloseGrace time.Duration
	// Accounts is the accounts file (commitments and budgets) metering and
	// the scheduler read; empty means none.
	Accounts string
}

func newStack(t testing.TB, cfg stackConfig) *stack {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("reads the workloads' processes from /proc (Linux)")
	}
	s := &stack{t: t, dir: t.TempDir(), bin: buildAgent(t), agents: map[string]*exec.Cmd{}, beat: map[string]time.Duration{}}
	var err error
	if s.logs, err = os.Create(filepath.Join(s.dir, "services.log")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("service and agent logs: %s (kept: %v)", s.logs.Name(), keepLogs(s))
		}
		_ = s.logs.Close()
	})
	s.nats = testkit.StartNATS(t, testkit.WithUsers(topology.Users(), password), withSystemUser(sysUser, password(sysUser)))
	s.redis = testkit.StartRedis(t)
	s.admin, err = bus.Connect(t.Context(), bus.Config{URL: s.nats.URL, User: topology.Admin, Password: password(topology.Admin), Name: "e2e-admin"}, bus.Instruments{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.admin.Close(context.WithoutCancel(t.Context())) })
	// What `shizu provision` does.
	if err := s.admin.EnsureStreams(t.Context(), topology.Streams(1)...); err != nil {
		t.Fatal(err)
	}
	if _, err := quota.Ensure(t.Context(), s.admin.JetStream(), 1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.admin.EnsureHeartbeats(t.Context(), topology.Heartbeats(1, heartbeatTTL)); err != nil {
		t.Fatal(err)
	}
	if _, err := quota.Ensure(t.Context(), s.admin.JetStream(), 1); err != nil {
		t.Fatal(err)
	}
	if s.store, err = capacity.New(s.redis.Client(t)); err != nil {
		t.Fatal(err)
	}
	nc := s.nats.Connect(t, nats.UserInfo(topology.Admin, password(topology.Admin)))
	if s.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	s.rec = newRecorder(t, nc)

	base := func(name string) service.Config {
		c := service.Defaults(name)
		c.NATS = bus.Config{URL: s.nats.URL, Name: name, User: name, Password: password(name)}
		c.RedisURL = "redis://" + s.redis.Addr + "/0"
		c.HTTPAddr = ""
		c.LogLevel, c.LogFormat, c.LogWriter = "warn", "text", s.logs
		c.ShutdownTimeout = 10 * time.Second
		return c
	}
	sched := scheduler.DefaultConfig()
	sched.Service = base(topology.Scheduler)
	meter := metering.DefaultConfig()
	meter.Service = base(topology.Metering)
	meter.Rules.Interval, meter.CloseGrace, meter.Tick = cfg.MeterInterval, cfg.CloseGrace, 100*time.Millisecond
	meter.AccountsPath, sched.AccountsPath = cfg.Accounts, cfg.Accounts
	if err := meter.Validate(); err != nil {
		t.Fatal(err)
	}
	fail := failover.DefaultConfig() // default detection: 1 s beats, 3 s TTL
	fail.Service = base(topology.Failover)
	fail.Advisory = failover.AdvisoryConfig{URL: s.nats.URL, User: sysUser, Password: password(sysUser)}
	fail.StopGrace = time.Second
	s.runService(topology.Scheduler, func(ctx context.Context) error { return scheduler.Run(ctx, sched) })
	s.runService(topology.Metering, func(ctx context.Context) error { return metering.Run(ctx, meter) })
	s.runService(topology.Failover, func(ctx context.Context) error { return failover.Run(ctx, fail) })
	s.waitConsumers(topology.Scheduler, topology.Metering, topology.Failover)
	return s
}

// keepLogs copies the log file out of the test's temp dir so it survives.
func keepLogs(s *stack) string {
	dst, err := os.CreateTemp("", "shizu-e2e-*.log")
	if err != nil {
		return err.Error()
	}
	defer dst.Close()
	src, err := os.Open(s.logs.Name())
	if err != nil {
		return err.Error()
	}
	defer src.Close()
	_, _ = io.Copy(dst, src)
	return dst.Name()
}

// runService runs one service's app.Run until the test ends.
func (s *stack) runService(name string, run func(context.Context) error) {
	// Not canceled with the test's context: services stop in the cleanup,
	// after the agents (cleanups run last first).
	ctx, cancel := context.WithCancel(context.WithoutCancel(s.t.Context()))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			s.svcMu.Lock()
			s.svcErrs = append(s.svcErrs, fmt.Errorf("%s: %w", name, err))
			s.svcMu.Unlock()
		}
	}()
	s.t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			s.t.Errorf("%s did not stop within 20 s", name)
		}
		s.checkServices()
	})
}

func (s *stack) checkServices() {
	s.svcMu.Lock()
	defer s.svcMu.Unlock()
	for _, err := range s.svcErrs {
		s.t.Errorf("service ended: %v", err)
	}
	s.svcErrs = nil
}

// waitConsumers waits until every durable of the named services exists.
func (s *stack) waitConsumers(services ...string) {
	s.t.Helper()
	s.eventually(30*time.Second, func() error {
		s.svcMu.Lock()
		failed := slices.Clone(s.svcErrs)
		s.svcMu.Unlock()
		if len(failed) > 0 {
			s.t.Fatalf("a service did not start: %v", failed)
		}
		for _, name := range services {
			svc, _ := topology.ServiceNamed(name)
			for _, c := range svc.Consumers {
				if _, err := s.js.Consumer(s.t.Context(), c.Stream, c.Durable); err != nil {
					return fmt.Errorf("%s's consumer %s/%s: %w", name, c.Stream, c.Durable, err)
				}
			}
		}
		return nil
	})
}

func (s *stack) eventually(timeout time.Duration, cond func() error) {
	s.t.Helper()
	testkit.Eventually(s.t, timeout, cond)
}

// workloadScript is the rentals' command: it lives as long as the agent
// that started it (a killed host takes its workloads with it; a stopped,
// partitioned one keeps them running), so nothing outlives the test.
func (s *stack) workloadScript() string {
	script := filepath.Join(s.dir, "workload.sh")
	if _, err := os.Stat(script); err == nil {
		return script
	}
	// The workload lives while the agent that started it lives (a killed
	// agent stands for its host going down). Its parent is the agent's
	// status shell (shizu-workload), whose parent is the agent.
	const body = "#!/bin/sh\n" +
		"agent=$PPID\n" +
		"if tr '\\0' ' ' </proc/$PPID/cmdline | grep -q shizu-workload; then agent=$(sed 's/.*) //' /proc/$PPID/stat | cut -d' ' -f2); fi\n" +
		"while kill -0 \"$agent\" 2>/dev/null; do sleep 0.2; done\n"
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		s.t.Fatal(err)
	}
	return script
}

// startAgents starts n node agents (n00, n01, ...) and waits until every
// one has registered its node.
func (s *stack) startAgents(n int) {
	s.t.Helper()
	for i := range n {
		s.startAgent(fmt.Sprintf("n%02d", i))
	}
	s.waitNodesReady()
}

// waitNodesReady waits until every node of the stack is registered and
// ready.
func (s *stack) waitNodesReady() {
	s.t.Helper()
	s.eventually(60*time.Second, func() error {
		snap, err := s.store.Snapshot(s.t.Context())
		if err != nil {
			return err
		}
		ready := 0
		for _, nd := range snap.Nodes {
			if nd.Status == capacity.StatusReady {
				ready++
			}
		}
		if ready != len(s.nodes) {
			return fmt.Errorf("%d of %d nodes registered and ready", ready, len(s.nodes))
		}
		return nil
	})
}

// defaultBeat is the agents' default heartbeat interval.
const defaultBeat = time.Second

// beatInterval is how often node's agent beats.
func (s *stack) beatInterval(node string) time.Duration {
	if d, ok := s.beat[node]; ok {
		return d
	}
	return defaultBeat
}

// startAgent starts node's agent with the default heartbeat.
func (s *stack) startAgent(node string) { s.startAgentBeating(node, defaultBeat) }

// startAgentBeating starts node's agent beating every beat (its key's TTL
// twice that, when not the default).
func (s *stack) startAgentBeating(node string, beat time.Duration) {
	t := s.t
	// SIGUSR1 plays the provider's spot interruption notice (see notice).
	args := []string{"-simulate", "h100x8", "-node-id", node, "-state-dir", filepath.Join(s.dir, node),
		"-default-command", s.workloadScript(), "-telemetry-interval", "30s", "-http-addr=", "-stop-grace", "2s",
		"-simulate-notice-lead", noticeLead.String()}
	if beat != defaultBeat {
		args = append(args, "-heartbeat-interval", beat.String(), "-heartbeat-ttl", (2 * beat).String())
	}
	s.beat[node] = beat
	cmd := exec.Command(s.bin, args...)
	cmd.Env = append(os.Environ(), "SHIZU_NATS_URL="+s.nats.URL, "SHIZU_NATS_USER="+topology.NodeAgent,
		"SHIZU_NATS_PASSWORD="+password(topology.NodeAgent), "SHIZU_REDIS_URL=redis://"+s.redis.Addr+"/0",
		"SHIZU_LOG_LEVEL=warn", "SHIZU_LOG_FORMAT=text")
	cmd.Stdout, cmd.Stderr = s.logs, s.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(s.nodes, node) {
		s.nodes = append(s.nodes, node)
	}
	s.agents[node] = cmd
	t.Cleanup(func() {
		if cmd.ProcessState != nil {
			return
		}
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
}

// noticeLead is how far ahead of a simulated spot interruption notice its
// deadline lies (the agents' -simulate-notice-lead).
const noticeLead = time.Minute

// notice makes the simulated host of node deliver a spot interruption
// notice to its agent, deadline noticeLead ahead (SIGUSR1).
func (s *stack) notice(node string) {
	s.t.Helper()
	if err := s.agents[node].Process.Signal(syscall.SIGUSR1); err != nil {
		s.t.Fatal(err)
	}
}

// kill SIGKILLs the agents of nodes at once and reaps them.
func (s *stack) kill(nodes ...string) {
	s.t.Helper()
	for _, n := range nodes {
		if err := s.agents[n].Process.Signal(syscall.SIGKILL); err != nil {
			s.t.Fatal(err)
		}
	}
	for _, n := range nodes {
		_ = s.agents[n].Wait()
	}
}

// request publishes a tenant's RentalRequested, as the API does.
func (s *stack) request(rental string, spec *shizuv1.RentalSpec) {
	s.t.Helper()
	ev := &shizuv1.RentalRequested{
		Meta:     shizuv1.NewMeta("rental:"+rental+":requested", "e2e", "", rental, time.Now()),
		RentalId: rental, TenantId: tenant, Spec: spec,
	}
	if err := ev.Validate(); err != nil {
		s.t.Fatalf("test request is invalid: %v", err)
	}
	subj, err := subject.Format(subject.RentalRequested, tenant)
	if err != nil {
		s.t.Fatal(err)
	}
	if _, err := s.admin.Publish(s.t.Context(), subj, ev); err != nil {
		s.t.Fatal(err)
	}
}

// specFor is rental i's spec, all on-demand: per 20 rentals two whole
// GPUs, one pair of GPUs, one more whole GPU, eight halves and eight
// quarters (11 GPUs' worth), so what a kill displaces fits on the nodes
// left.
func specFor(i int) *shizuv1.RentalSpec {
	sp := &shizuv1.RentalSpec{Plan: shizuv1.Plan_PLAN_ON_DEMAND, CheckpointUri: "s3://ckpt/e2e/"}
	switch i % 10 {
	case 0:
		sp.GpuCount, sp.MilliGpu = 1, 1000
	case 5:
		sp.GpuCount, sp.MilliGpu = 1, 1000
		if i%20 == 5 {
			sp.GpuCount = 2
		}
	case 1, 3, 6, 8:
		sp.GpuCount, sp.MilliGpu, sp.VramMib = 1, 500, 40960
	default:
		sp.GpuCount, sp.MilliGpu, sp.VramMib = 1, 250, 20480
	}
	return sp
}

// rentAll requests n rentals (e2e-r000...) and waits until each runs.
func (s *stack) rentAll(n int) []string {
	s.t.Helper()
	var ids []string
	for i := range n {
		id := fmt.Sprintf("e2e-r%03d", i)
		ids = append(ids, id)
		s.request(id, specFor(i))
	}
	s.eventually(120*time.Second, func() error {
		missing := 0
		for _, id := range ids {
			if s.rec.startedAt(id, 1) == nil {
				missing++
			}
		}
		if missing > 0 {
			return fmt.Errorf("%d of %d rentals not started (pending %d, rejected %d)", missing, n, s.rec.count(func(r *recorder) int { return len(r.pending) }),
				s.rec.count(func(r *recorder) int { return len(r.rejected) }))
		}
		return nil
	})
	// Failover knows each rental's placement (from RentalScheduled) before
	// anything is killed.
	rdb := s.redis.Client(s.t)
	s.eventually(30*time.Second, func() error {
		for _, id := range ids {
			k, err := rdb.Exists(s.t.Context(), "shizu:failover:rental:"+id).Result()
			if err != nil {
				return fmt.Errorf("failover's index of %s: %w", id, err)
			}
			if k == 0 {
				return fmt.Errorf("failover has not indexed %s yet", id)
			}
		}
		return nil
	})
	return ids
}

// recorder keeps every rental event and node loss seen on the bus (core
// subscriptions as the admin user). Each event id is kept once.
type recorder struct {
	mu        sync.Mutex
	seen      map[string]bool
	scheduled map[string]map[int32]*shizuv1.RentalScheduled
	started   map[string]map[int32]*shizuv1.RentalStarted
	stopped   map[string]map[int32]*shizuv1.RentalStopped
	migrating map[string][]*shizuv1.RentalMigrating
	handedAt  map[string]time.Time // first RentalMigrating received
	migrated  map[string][]*shizuv1.RentalMigrated
	pending   map[string]*shizuv1.RentalPending
	rejected  map[string]*shizuv1.RentalRejected
	lost      map[string][]*shizuv1.NodeLost
}

func newRecorder(t testing.TB, nc *nats.Conn) *recorder {
	r := &recorder{seen: map[string]bool{}, scheduled: map[string]map[int32]*shizuv1.RentalScheduled{},
		started: map[string]map[int32]*shizuv1.RentalStarted{}, stopped: map[string]map[int32]*shizuv1.RentalStopped{},
		migrating: map[string][]*shizuv1.RentalMigrating{}, handedAt: map[string]time.Time{}, migrated: map[string][]*shizuv1.RentalMigrated{},
		pending: map[string]*shizuv1.RentalPending{}, rejected: map[string]*shizuv1.RentalRejected{}, lost: map[string][]*shizuv1.NodeLost{}}
	on := func(subj string, newEv func() proto.Message, keep func(proto.Message)) {
		if _, err := nc.Subscribe(subj, func(m *nats.Msg) {
			ev := newEv()
			if proto.Unmarshal(m.Data, ev) != nil {
				return
			}
			id := ev.ProtoReflect().Get(ev.ProtoReflect().Descriptor().Fields().ByName("meta")).Message().Interface().(*shizuv1.EventMeta).GetEventId()
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.seen[id] { // a publish retried: one event
				return
			}
			r.seen[id] = true
			keep(ev)
		}); err != nil {
			t.Fatal(err)
		}
	}
	on(subject.RentalScheduledAll, func() proto.Message { return &shizuv1.RentalScheduled{} }, func(m proto.Message) {
		ev := m.(*shizuv1.RentalScheduled)
		if r.scheduled[ev.GetRentalId()] == nil {
			r.scheduled[ev.GetRentalId()] = map[int32]*shizuv1.RentalScheduled{}
		}
		r.scheduled[ev.GetRentalId()][ev.GetAttempt()] = ev
	})
	on(subject.RentalStartedAll, func() proto.Message { return &shizuv1.RentalStarted{} }, func(m proto.Message) {
		ev := m.(*shizuv1.RentalStarted)
		if r.started[ev.GetRentalId()] == nil {
			r.started[ev.GetRentalId()] = map[int32]*shizuv1.RentalStarted{}
		}
		r.started[ev.GetRentalId()][ev.GetAttempt()] = ev
	})
	on(subject.RentalStoppedAll, func() proto.Message { return &shizuv1.RentalStopped{} }, func(m proto.Message) {
		ev := m.(*shizuv1.RentalStopped)
		if r.stopped[ev.GetRentalId()] == nil {
			r.stopped[ev.GetRentalId()] = map[int32]*shizuv1.RentalStopped{}
		}
		r.stopped[ev.GetRentalId()][ev.GetAttempt()] = ev
	})
	on(subject.RentalMigratingAll, func() proto.Message { return &shizuv1.RentalMigrating{} }, func(m proto.Message) {
		ev := m.(*shizuv1.RentalMigrating)
		if _, ok := r.handedAt[ev.GetRentalId()]; !ok {
			r.handedAt[ev.GetRentalId()] = time.Now()
		}
		r.migrating[ev.GetRentalId()] = append(r.migrating[ev.GetRentalId()], ev)
	})
	on(subject.RentalMigratedAll, func() proto.Message { return &shizuv1.RentalMigrated{} }, func(m proto.Message) {
		ev := m.(*shizuv1.RentalMigrated)
		r.migrated[ev.GetRentalId()] = append(r.migrated[ev.GetRentalId()], ev)
	})
	on(subject.RentalPendingAll, func() proto.Message { return &shizuv1.RentalPending{} }, func(m proto.Message) {
		ev := m.(*shizuv1.RentalPending)
		r.pending[ev.GetRentalId()] = ev
	})
	on(subject.RentalRejectedAll, func() proto.Message { return &shizuv1.RentalRejected{} }, func(m proto.Message) {
		ev := m.(*shizuv1.RentalRejected)
		r.rejected[ev.GetRentalId()] = ev
	})
	on(subject.NodeLostAll, func() proto.Message { return &shizuv1.NodeLost{} }, func(m proto.Message) {
		ev := m.(*shizuv1.NodeLost)
		r.lost[ev.GetNodeId()] = append(r.lost[ev.GetNodeId()], ev)
	})
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *recorder) count(fn func(*recorder) int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fn(r)
}

func (r *recorder) startedAt(rental string, attempt int32) *shizuv1.RentalStarted {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.started[rental][attempt]
}

// usage reads every UsageRecorded in the BILLING stream, by rental.
func (s *stack) usage() map[string][]*shizuv1.UsageRecorded {
	s.t.Helper()
	c, err := s.js.OrderedConsumer(s.t.Context(), topology.StreamBilling, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject.UsageRecordedAll}})
	if err != nil {
		s.t.Fatal(err)
	}
	out := map[string][]*shizuv1.UsageRecorded{}
	ids := map[string]bool{}
	for {
		batch, err := c.Fetch(500, jetstream.FetchMaxWait(300*time.Millisecond))
		if err != nil {
			s.t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			ev := &shizuv1.UsageRecorded{}
			if err := proto.Unmarshal(m.Data(), ev); err != nil {
				s.t.Fatal(err)
			}
			if ids[ev.GetMeta().GetEventId()] {
				s.t.Errorf("usage record %s stored twice", ev.GetMeta().GetEventId())
				continue
			}
			ids[ev.GetMeta().GetEventId()] = true
			out[ev.GetRentalId()] = append(out[ev.GetRentalId()], ev)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			s.t.Fatal(err)
		}
		if n == 0 {
			return out
		}
	}
}

// runs lists the rental workloads alive on this machine that agents of
// this stack started: rental -> the attempts running (one process each).
func (s *stack) runs() map[string][]string {
	out := map[string][]string{}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		cmdline, err := os.ReadFile(filepath.Join(p, "cmdline"))
		if err != nil || !strings.Contains(string(cmdline), s.workloadScript()) {
			continue
		}
		// The node agent's status shell (named shizu-workload) waits for
		// each workload to record its exit status; it is not a run.
		if strings.Contains(string(cmdline), "\x00shizu-workload\x00") {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join(p, "stat")); err == nil {
			// A zombie process (state Z) has exited already.
			if f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:])); len(f) > 0 && f[0] == "Z" {
				continue
			}
		}
		env, err := os.ReadFile(filepath.Join(p, "environ"))
		if err != nil {
			continue
		}
		var rental, attempt string
		for kv := range strings.SplitSeq(string(env), "\x00") {
			if v, ok := strings.CutPrefix(kv, "SHIZU_RENTAL_ID="); ok {
				rental = v
			}
			if v, ok := strings.CutPrefix(kv, "SHIZU_ATTEMPT="); ok {
				attempt = v
			}
		}
		if rental != "" {
			out[rental] = append(out[rental], attempt)
		}
	}
	return out
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(float64(len(s)-1)*p)]
}
