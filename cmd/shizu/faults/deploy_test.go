package faults

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/quota"
	"github.com/shizu-gpu/shizu/shared/service"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// The deployed shape as child processes: nats-server (the pinned module,
// built into a binary), redis-server, each service's binary and one node
// agent per simulated host. Every part can be SIGKILLed and started again;
// logs go to files in the deployment's folder, which is kept (and its
// path printed) when the test fails.

const (
	tenant       = "acme"
	heartbeatTTL = 3 * time.Second
	// preemptionNotice is the scheduler's -preemption-notice here.
	preemptionNotice = 4 * time.Second
)

// shape is what a scenario deploys.
type shape struct {
	// Nodes is how many simulated hosts run a node agent (n00, n01, ...);
	// SpotNodes of them are sold on the spot market.
	Nodes, SpotNodes int
	// Profile is the simulated host (-simulate), h100x8 by default.
	Profile string
	// Schedulers is how many scheduler replicas run (default 1).
	Schedulers int
	// PersistentRedis gives Redis an AOF fsynced on every write.
	PersistentRedis bool
	// InProcessAgents names nodes whose agent the scenario runs itself
	// (startAgentInProcess); no child process is started for them.
	InProcessAgents []string
}

// proc is one child process of the deployment.
type proc struct {
	name   string
	bin    string
	args   []string
	env    []string
	log    *os.File
	cmd    *exec.Cmd
	exited chan struct{}
	// kills counts the SIGKILLs the scenario sent it (a killed process
	// ended on purpose).
	kills int
}

func (p *proc) start() error {
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env, cmd.Stdout, cmd.Stderr = p.env, p.log, p.log
	// A process group of its own: the test's signals go to it alone.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	p.cmd, p.exited = cmd, exited
	return nil
}

func (p *proc) running() bool {
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// kill SIGKILLs the process and reaps it.
func (p *proc) kill() {
	if !p.running() {
		return
	}
	p.kills++
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// stop asks the process to drain (SIGTERM) and kills it after grace.
func (p *proc) stop(grace time.Duration) {
	if !p.running() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(grace):
		p.kill()
	}
}

// deployment is one running platform.
type deployment struct {
	t     testing.TB
	shape shape
	dir   string
	nats  *testkit.NATSProcess
	redis *testkit.RedisProcess
	admin *bus.Conn
	js    jetstream.JetStream
	rdb   *redis.Client
	store *capacity.Store
	// procs are the services and agents by name: scheduler, scheduler-2,
	// metering, failover, autoscaler, agent-n00, ...
	procs    map[string]*proc
	order    []string
	nodes    []string
	workload string
}

// deploy starts the platform of sh and waits until every consumer exists
// and every node is registered and ready.
func deploy(t testing.TB, sh shape) *deployment {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("reads the workloads' processes from /proc (Linux)")
	}
	if sh.Profile == "" {
		sh.Profile = "h100x8"
	}
	sh.Schedulers = max(sh.Schedulers, 1)
	d := &deployment{t: t, shape: sh, procs: map[string]*proc{}}
	d.openDir()
	d.nats = testkit.StartNATSProcess(t, d.subdir("nats"))
	d.redis = testkit.StartRedisProcess(t, d.subdir("redis"), sh.PersistentRedis)
	d.connect()
	d.provision()
	d.writeWorkload()
	d.startServices()
	for i := range sh.Nodes {
		node := fmt.Sprintf("n%02d", i)
		d.nodes = append(d.nodes, node)
		if !slices.Contains(sh.InProcessAgents, node) {
			d.startAgent(node, i >= sh.Nodes-sh.SpotNodes)
		}
	}
	d.waitConsumers()
	if len(sh.InProcessAgents) == 0 {
		d.waitNodesReady()
	}
	return d
}

// openDir makes the deployment's folder; it is removed when the test
// passes and kept, with its path in the test log, when it fails (or
// SHIZU_FAULTS_KEEP is set).
func (d *deployment) openDir() {
	dir, err := os.MkdirTemp("", "shizu-faults-")
	if err != nil {
		d.t.Fatal(err)
	}
	d.dir = dir
	d.t.Cleanup(func() {
		if d.t.Failed() || os.Getenv("SHIZU_FAULTS_KEEP") != "" {
			d.t.Logf("deployment folder (logs: */*.log): %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
}

func (d *deployment) subdir(name string) string {
	p := filepath.Join(d.dir, name)
	if err := os.MkdirAll(p, 0o755); err != nil {
		d.t.Fatal(err)
	}
	return p
}

func (d *deployment) connect() {
	t := d.t
	var err error
	d.admin, err = bus.Connect(t.Context(), bus.Config{URL: d.nats.URL, User: topology.Admin, Password: testkit.Password(topology.Admin), Name: "faults-admin"}, bus.Instruments{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.admin.Close(context.WithoutCancel(t.Context())) })
	nc, err := nats.Connect(d.nats.URL, nats.UserInfo(topology.Admin, testkit.Password(topology.Admin)), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if d.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	d.rdb = redis.NewClient(&redis.Options{Addr: d.redis.Addr})
	t.Cleanup(func() { _ = d.rdb.Close() })
	if d.store, err = capacity.New(d.rdb); err != nil {
		t.Fatal(err)
	}
}

// provision is what `shizu provision` does.
func (d *deployment) provision() {
	if err := d.admin.EnsureStreams(d.t.Context(), topology.Streams(1)...); err != nil {
		d.t.Fatal(err)
	}
	if _, err := d.admin.EnsureHeartbeats(d.t.Context(), topology.Heartbeats(1, heartbeatTTL)); err != nil {
		d.t.Fatal(err)
	}
	if _, err := quota.Ensure(d.t.Context(), d.admin.JetStream(), 1); err != nil {
		d.t.Fatal(err)
	}
}

// writeWorkload writes the rentals' command: with an argument it sleeps
// that many seconds and exits 0 (a short workload that completes);
// without, it lives as long as the agent that started it, so nothing
// outlives the test. (Its parent is the agent's status shell,
// shizu-workload, whose parent is the agent.)
func (d *deployment) writeWorkload() {
	d.workload = filepath.Join(d.dir, "workload.sh")
	const body = "#!/bin/sh\n" +
		"if [ -n \"$1\" ]; then sleep \"$1\"; exit 0; fi\n" +
		"agent=$PPID\n" +
		"if tr '\\0' ' ' </proc/$PPID/cmdline | grep -q shizu-workload; then agent=$(sed 's/.*) //' /proc/$PPID/stat | cut -d' ' -f2); fi\n" +
		"while kill -0 \"$agent\" 2>/dev/null; do sleep 0.2; done\n"
	if err := os.WriteFile(d.workload, []byte(body), 0o755); err != nil {
		d.t.Fatal(err)
	}
}

// serviceEnv is the environment of a process connecting as user.
func (d *deployment) serviceEnv(user string) []string {
	return append(os.Environ(), "SHIZU_NATS_URL="+d.nats.URL, "SHIZU_NATS_USER="+user,
		"SHIZU_NATS_PASSWORD="+testkit.Password(user), "SHIZU_REDIS_URL="+d.redis.URL(),
		"SHIZU_LOG_LEVEL=info", "SHIZU_LOG_FORMAT=text", "SHIZU_HTTP_ADDR=")
}

// add registers and starts a process.
func (d *deployment) add(name, bin, user string, args ...string) {
	d.t.Helper()
	log, err := os.OpenFile(filepath.Join(d.subdir("logs"), name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		d.t.Fatal(err)
	}
	p := &proc{name: name, bin: bin, args: args, env: d.serviceEnv(user), log: log}
	if err := p.start(); err != nil {
		d.t.Fatal(err)
	}
	d.procs[name] = p
	d.order = append(d.order, name)
	// Cleanups run last first: agents stop before the services, services
	// before NATS and Redis.
	d.t.Cleanup(func() {
		p.stop(15 * time.Second)
		_ = log.Close()
	})
}

const module = "github.com/shizu-gpu/shizu/services/"

func (d *deployment) startServices() {
	t := d.t
	sched := []string{"-preemption-notice", preemptionNotice.String(), "-reconcile-interval", "2s", "-reconcile-age", "10s"}
	for i := range d.shape.Schedulers {
		name := topology.Scheduler
		if i > 0 {
			name = fmt.Sprintf("%s-%d", topology.Scheduler, i+1)
		}
		d.add(name, testkit.GoBuild(t, module+"scheduler/cmd/scheduler"), topology.Scheduler, sched...)
	}
	d.add(topology.Metering, testkit.GoBuild(t, module+"metering/cmd/metering"), topology.Metering,
		"-minimum-charge", "0s") // billed seconds are then exactly the run's, rounded up
	d.add(topology.Failover, testkit.GoBuild(t, module+"failover/cmd/failover"), topology.Failover,
		"-advisory-url", d.nats.URL, "-advisory-user", topology.FailoverAdvisories,
		"-advisory-password", testkit.Password(topology.FailoverAdvisories))
	d.add(topology.Autoscaler, testkit.GoBuild(t, module+"autoscaler/cmd/autoscaler"), topology.Autoscaler)
}

// startAgent starts node's agent as a child process.
func (d *deployment) startAgent(node string, spot bool) {
	market := "on-demand"
	if spot {
		market = "spot"
	}
	d.add("agent-"+node, testkit.GoBuild(d.t, module+"node-agent/cmd/node-agent"), topology.NodeAgent,
		"-simulate", d.shape.Profile, "-node-id", node, "-market", market, "-state-dir", d.subdir(filepath.Join("state", node)),
		"-default-command", d.workload, "-telemetry-interval", "30s", "-stop-grace", "2s")
}

// restart starts a killed process again with its arguments.
func (d *deployment) restart(name string) {
	d.t.Helper()
	p := d.procs[name]
	if p.running() {
		d.t.Fatalf("%s is running", name)
	}
	if err := p.start(); err != nil {
		d.t.Fatal(err)
	}
}

// unexpectedExits lists processes that ended though the scenario did not
// kill them last (a service that gave up during an outage).
func (d *deployment) unexpectedExits() []string {
	var out []string
	for _, name := range d.order {
		if !d.procs[name].running() {
			out = append(out, fmt.Sprintf("%s (%v)", name, d.procs[name].cmd.ProcessState))
		}
	}
	return out
}

// waitConsumers waits until every durable of every service exists.
func (d *deployment) waitConsumers() {
	d.t.Helper()
	testkit.Eventually(d.t, 60*time.Second, func() error {
		if gone := d.unexpectedExits(); len(gone) > 0 {
			d.t.Fatalf("processes ended at start: %v (logs in %s)", gone, d.dir)
		}
		for _, svc := range topology.Services() {
			for _, c := range svc.Consumers {
				if _, err := d.js.Consumer(d.t.Context(), c.Stream, c.Durable); err != nil {
					return fmt.Errorf("%s's consumer %s/%s: %w", svc.Name, c.Stream, c.Durable, err)
				}
			}
		}
		return nil
	})
}

// waitNodesReady waits until every node is registered and ready.
func (d *deployment) waitNodesReady() {
	d.t.Helper()
	testkit.Eventually(d.t, 60*time.Second, func() error {
		snap, err := d.store.Snapshot(d.t.Context())
		if err != nil {
			return err
		}
		ready := 0
		for _, nd := range snap.Nodes {
			if nd.Status == capacity.StatusReady {
				ready++
			}
		}
		if ready != len(d.nodes) {
			return fmt.Errorf("%d of %d nodes registered and ready", ready, len(d.nodes))
		}
		return nil
	})
}

// serviceDefaults is the service configuration an in-process part uses
// (the clock-step agent).
func (d *deployment) serviceDefaults(name, user string) service.Config {
	c := service.Defaults(name)
	c.NATS = bus.Config{URL: d.nats.URL, Name: name, User: user, Password: testkit.Password(user)}
	c.RedisURL = d.redis.URL()
	c.HTTPAddr = ""
	c.LogLevel, c.LogFormat = "info", "text"
	c.ShutdownTimeout = 10 * time.Second
	return c
}
