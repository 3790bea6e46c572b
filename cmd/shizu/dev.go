package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	autoscaler "github.com/shizu-gpu/shizu/services/autoscaler/app"
	"github.com/shizu-gpu/shizu/services/autoscaler/policy"
	failover "github.com/shizu-gpu/shizu/services/failover/app"
	metering "github.com/shizu-gpu/shizu/services/metering/app"
	nodeagent "github.com/shizu-gpu/shizu/services/node-agent/app"
	"github.com/shizu-gpu/shizu/services/node-agent/gpu/simgpu"
	scheduler "github.com/shizu-gpu/shizu/services/scheduler/app"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/embednats"
	"github.com/shizu-gpu/shizu/shared/service"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// The system account of the embedded server and its one user, which
// failover uses for the client-disconnect advisories.
const (
	devSystemAccount = topology.SystemAccount
	devSystemUser    = topology.FailoverAdvisories
)

type devOptions struct {
	dataDir   string
	ephemeral bool
	natsPort  int
	monPort   int
	redisURL  string
	redisPort int
	logLevel  string
	fleet     string
	policy    string
	interval  time.Duration
	minCharge time.Duration
}

func devCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("shizu dev", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `Run the whole platform on this machine: an embedded NATS server with
JetStream, Redis (a redis-server child, or -redis-url), the five services,
each with its own NATS user, and a simulated fleet of GPU hosts (one node
agent each). Ctrl-C stops everything.

Examples:
  shizu dev                      # state in ./.shizu, kept across restarts
  shizu dev -ephemeral           # state in a temp dir, removed at exit
  shizu dev -fleet h100x8:2,a100x8:1,rtx4090x8:2:spot
  shizu dev -redis-url redis://127.0.0.1:6379/0

Flags:
`)
		fs.PrintDefaults()
	}
	var o devOptions
	fs.StringVar(&o.dataDir, "data", ".shizu", "folder for the JetStream store, logs and the env file")
	fs.BoolVar(&o.ephemeral, "ephemeral", false, "keep all state in a temporary folder removed at exit")
	fs.IntVar(&o.natsPort, "nats-port", 4222, "NATS client port; a free one is used when taken")
	fs.IntVar(&o.monPort, "nats-monitor-port", 8222, "NATS monitoring port (/healthz, /varz, /jsz); a free one is used when taken")
	fs.StringVar(&o.redisURL, "redis-url", "", "use this Redis instead of starting redis-server")
	fs.IntVar(&o.redisPort, "redis-port", 6379, "port for the redis-server child; a free one is used when taken")
	fs.StringVar(&o.policy, "autoscaler-policy", "", "autoscaler pools and fleet policy file (JSON); see docs/autoscaler.md")
	fs.StringVar(&o.logLevel, "log-level", "info", "service log level: debug, info, warn, error")
	fs.StringVar(&o.fleet, "fleet", defaultFleet, "simulated GPU hosts: profile[:count[:spot]],... with profiles "+strings.Join(simgpu.Profiles(), ", "))
	fs.DurationVar(&o.interval, "meter-interval", time.Minute, "metering: usage records of running rentals close at multiples of this")
	fs.DurationVar(&o.minCharge, "minimum-charge", time.Minute, "metering: least an on-demand rental the tenant ends is billed")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "shizu dev: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if _, err := parseFleet(o.fleet); err != nil {
		fmt.Fprintf(stderr, "shizu dev: -fleet: %v\n", err)
		return 2
	}
	if o.interval < time.Second || o.minCharge < 0 {
		fmt.Fprintf(stderr, "shizu dev: -meter-interval %s must be at least 1s and -minimum-charge %s not negative\n", o.interval, o.minCharge)
		return 2
	}
	if err := runDev(ctx, o, stdout); err != nil {
		fmt.Fprintf(stderr, "shizu dev: %v\n", err)
		return 1
	}
	return 0
}

// devStack is everything runDev started, stopped in reverse by close.
type devStack struct {
	nats       *server.Server
	redisCmd   *exec.Cmd
	redisExit  chan error
	redisURL   string
	mini       *miniredis.Miniredis
	cleanupDir string
	logFile    *os.File
}

func (s *devStack) close() {
	if s.redisCmd != nil {
		_ = s.redisCmd.Process.Signal(os.Interrupt)
		select {
		case <-s.redisExit:
		case <-time.After(5 * time.Second):
			_ = s.redisCmd.Process.Kill()
			<-s.redisExit
		}
	}
	if s.mini != nil {
		s.mini.Close()
	}
	if s.nats != nil {
		s.nats.Shutdown()
		s.nats.WaitForShutdown()
	}
	if s.logFile != nil {
		_ = s.logFile.Close()
	}
	if s.cleanupDir != "" {
		_ = os.RemoveAll(s.cleanupDir)
	}
}

func runDev(ctx context.Context, o devOptions, stdout io.Writer) error {
	stack := &devStack{}
	defer stack.close()
	if o.ephemeral {
		dir, err := os.MkdirTemp("", "shizu-dev-")
		if err != nil {
			return err
		}
		o.dataDir, stack.cleanupDir = dir, dir
	}
	dataDir, err := filepath.Abs(o.dataDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return fmt.Errorf("data folder: %w", err)
	}
	logPath := filepath.Join(dataDir, "shizu.log")
	if stack.logFile, err = os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
		return fmt.Errorf("log file: %w", err)
	}
	var notes []string
	passwords := map[string]string{}
	for _, u := range topology.Users() {
		passwords[u.Name] = randomPassword()
	}

	// NATS with JetStream and the platform's users.
	natsPort, note := pickPort(o.natsPort, "NATS")
	notes = append(notes, note)
	monPort, note := pickPort(o.monPort, "NATS monitoring")
	notes = append(notes, note)
	// A system account with one user lets failover read the server's
	// client-disconnect advisories: a killed agent is then found in about
	// a second, not at its heartbeat's TTL.
	sysAccount := server.NewAccount(devSystemAccount)
	sysPassword := randomPassword()
	stack.nats, err = embednats.Start(&server.Options{
		ServerName: "shizu-dev", Host: "127.0.0.1", Port: natsPort, HTTPHost: "127.0.0.1", HTTPPort: monPort,
		JetStream: true, StoreDir: filepath.Join(dataDir, "nats"), NoSigs: true, NoLog: true,
		Accounts: []*server.Account{sysAccount}, SystemAccount: devSystemAccount,
		Users: append(embednats.Users(topology.Users(), func(name string) string { return passwords[name] }),
			// As deploy/nats/users.conf: disconnect advisories only, no publishing.
			&server.User{Username: devSystemUser, Password: sysPassword, Account: sysAccount,
				Permissions: &server.Permissions{
					Subscribe: &server.SubjectPermission{Allow: []string{topology.DisconnectAdvisories}},
					Publish:   &server.SubjectPermission{Deny: []string{">"}},
				}}),
	}, 10*time.Second)
	if err != nil {
		return err
	}
	natsURL := stack.nats.ClientURL()
	if err := provision(ctx, bus.Config{URL: natsURL, Name: "shizu-dev", User: topology.Admin, Password: passwords[topology.Admin]}, 1, 3*time.Second); err != nil {
		return fmt.Errorf("provision streams: %w", err)
	}

	// Redis.
	if o.redisURL != "" {
		stack.redisURL = o.redisURL
	} else if err := stack.startRedis(o.redisPort, filepath.Join(dataDir, "redis"), !o.ephemeral, &notes); err != nil {
		return err
	}
	if err := pingRedis(ctx, stack.redisURL); err != nil {
		return err
	}

	// The five services, each with its own NATS user and health endpoint.
	base := func(name string) service.Config {
		c := service.Defaults(name)
		c.NATS = bus.Config{URL: natsURL, Name: name, User: name, Password: passwords[name]}
		c.RedisURL = stack.redisURL
		port, _ := pickPort(0, "")
		c.HTTPAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		c.LogLevel, c.LogFormat, c.LogWriter = o.logLevel, "text", stack.logFile
		c.ShutdownTimeout = 10 * time.Second
		return c
	}
	type unit struct {
		name string
		cfg  service.Config
		run  func(context.Context) error
	}
	sched, meter, scale, fail := scheduler.DefaultConfig(), metering.DefaultConfig(), autoscaler.DefaultConfig(), failover.DefaultConfig()
	sched.Service, meter.Service, scale.Service, fail.Service =
		base(topology.Scheduler), base(topology.Metering), base(topology.Autoscaler), base(topology.Failover)
	meter.Rules.Interval, meter.Rules.MinimumCharge = o.interval, o.minCharge
	fail.Advisory = failover.AdvisoryConfig{URL: natsURL, User: devSystemUser, Password: sysPassword}
	scale.PolicyFile = o.policy
	var scaleDeps autoscaler.Deps // set below, before the services start
	units := []unit{
		{topology.Scheduler, sched.Service, func(ctx context.Context) error { return scheduler.Run(ctx, sched) }},
		{topology.Metering, meter.Service, func(ctx context.Context) error { return metering.Run(ctx, meter) }},
		{topology.Autoscaler, scale.Service, func(ctx context.Context) error { return autoscaler.RunWith(ctx, scale, scaleDeps) }},
		{topology.Failover, fail.Service, func(ctx context.Context) error { return failover.Run(ctx, fail) }},
	}
	if err := meter.Validate(); err != nil {
		return fmt.Errorf("metering: %w", err)
	}

	// The simulated fleet: one node agent per node, each with its own node
	// id, state folder (workload records and logs) and health endpoint.
	nodes, err := parseFleet(o.fleet)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stack.logFile, nil))
	agentConfig := func(n fleetNode) nodeagent.Config {
		c := nodeagent.DefaultConfig()
		c.Service = base(topology.NodeAgent)
		c.Service.NATS.Name = "node-agent-" + n.ID
		c.NodeID, c.Simulate, c.Market = n.ID, n.Profile, n.Market
		c.StateDir = filepath.Join(dataDir, "node-agent", n.ID)
		return c
	}
	fleet, err := newFleetRunner(nodes, agentConfig, logger)
	if err != nil {
		return err
	}
	defer func() {
		left := 0
		for _, id := range fleet.ids() {
			left += leftWorkloads(filepath.Join(dataDir, "node-agent", id), o.ephemeral)
		}
		if left > 0 && !o.ephemeral {
			fmt.Fprintf(stdout, "%d rental workloads keep running: the next `shizu dev -data %s` adopts them (stop them first with shizu stop to end them)\n", left, dataDir)
		}
	}()

	svcCtx, stopServices := context.WithCancel(ctx)
	defer stopServices()
	// With a policy whose fleet section sells instance types, the
	// autoscaler provisions nodes for capacity shortages as more
	// in-process node agents.
	if o.policy != "" {
		data, err := os.ReadFile(o.policy)
		if err != nil {
			return fmt.Errorf("autoscaler policy: %w", err)
		}
		file, err := policy.Parse(data)
		if err != nil {
			return fmt.Errorf("autoscaler policy %s: %w", o.policy, err)
		}
		if len(file.Fleet.InstanceTypes) > 0 {
			scaleDeps.Provider = newDevProvider(svcCtx, fleet, file, agentConfig)
		}
	}
	var wg sync.WaitGroup
	failed := make(chan error, len(units))
	for _, u := range units {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := u.run(svcCtx); err != nil && !errors.Is(err, context.Canceled) {
				failed <- fmt.Errorf("%s: %w", u.name, err)
			}
		}()
	}
	defer wg.Wait()
	defer fleet.stopAll()
	defer stopServices()
	for _, n := range nodes {
		if err := fleet.start(svcCtx, n.ID); err != nil {
			return err
		}
	}

	for _, u := range units {
		if err := waitReady(ctx, u.cfg.HTTPAddr, failed); err != nil {
			return fmt.Errorf("%s did not become ready (log: %s): %w", u.name, logPath, err)
		}
	}
	for _, n := range fleet.nodes() {
		if err := waitReady(ctx, n.HTTP, failed); err != nil {
			if ferr := fleet.failed(n.ID); ferr != nil {
				err = ferr
			}
			return fmt.Errorf("node agent %s did not become ready (log: %s): %w", n.ID, logPath, err)
		}
	}

	// Chaos: `shizu chaos` asks this process, as admin, to break its nodes.
	chaosConn, err := nats.Connect(natsURL, nats.UserInfo(topology.Admin, passwords[topology.Admin]), nats.Name("shizu-dev-chaos"))
	if err != nil {
		return fmt.Errorf("chaos endpoint: %w", err)
	}
	defer chaosConn.Close()
	if _, err := fleet.serveChaos(svcCtx, chaosConn); err != nil {
		return fmt.Errorf("chaos endpoint: %w", err)
	}

	envPath := filepath.Join(dataDir, "env")
	env := fmt.Sprintf("export SHIZU_NATS_URL=%s\nexport SHIZU_NATS_USER=%s\nexport SHIZU_NATS_PASSWORD=%s\nexport SHIZU_REDIS_URL=%s\n",
		natsURL, topology.Admin, passwords[topology.Admin], stack.redisURL)
	if err := os.WriteFile(envPath, []byte(env), 0o600); err != nil {
		return fmt.Errorf("env file: %w", err)
	}
	defer os.Remove(envPath) // a stopped platform leaves no credentials that point nowhere

	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	state := "kept across restarts"
	if o.ephemeral {
		state = "temporary, removed at exit"
	}
	fmt.Fprintf(tw, "Shizu dev platform is up. Data: %s (%s)\n\n", dataDir, state)
	fmt.Fprintf(tw, "  NATS\t%s\tJetStream, %d streams; monitor http://127.0.0.1:%d/jsz\n", natsURL, len(topology.Streams(1)), monPort)
	fmt.Fprintf(tw, "  Redis\t%s\t\n", stack.redisURL)
	for _, u := range units {
		fmt.Fprintf(tw, "  %s\tready\thttp://%s/readyz  /metrics\n", u.name, u.cfg.HTTPAddr)
	}
	for _, n := range fleet.nodes() {
		fmt.Fprintf(tw, "  %s\tready\thttp://%s/readyz  node agent, simulated %s, %s\n", n.ID, n.HTTP, n.Profile, n.Market)
	}
	_ = tw.Flush()
	for _, n := range notes {
		if n != "" {
			fmt.Fprintf(stdout, "  note: %s\n", n)
		}
	}
	devFlag := ""
	if cwd, err := os.Getwd(); err != nil || filepath.Join(cwd, ".shizu") != dataDir {
		devFlag = " -dev-dir " + dataDir
	}
	fmt.Fprintf(stdout, "\nTalk to it from another terminal:\n")
	tw = tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	for _, l := range [][2]string{
		{"shizu rent -gpus 2 -nvlink", "rent GPUs; prints where they run"},
		{"shizu ls", "your rentals and their state"},
		{"shizu show <rental>", "a rental's timeline"},
		{"shizu nodes -gpus", "the fleet, GPU by GPU"},
		{"shizu chaos kill <node>", "break a node and watch failover"},
		{"shizu bill", "charges so far"},
	} {
		fmt.Fprintf(tw, "  %s%s\t# %s\n", l[0], devFlag, l[1])
	}
	_ = tw.Flush()
	fmt.Fprintf(stdout, "Other tools: source %s (SHIZU_NATS_URL, _USER, _PASSWORD as admin, SHIZU_REDIS_URL)\nService logs: %s\nCtrl-C stops everything.\n", envPath, logPath)

	select {
	case <-ctx.Done():
		fmt.Fprintln(stdout, "\nstopping...")
		return nil
	case err := <-failed:
		return err
	}
}

// pickPort returns preferred when it is free on loopback, else a free port
// and a note saying so. preferred 0 asks for any free port.
func pickPort(preferred int, what string) (int, string) {
	if preferred > 0 {
		if l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(preferred))); err == nil {
			_ = l.Close()
			return preferred, ""
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return preferred, ""
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	if preferred == 0 {
		return port, ""
	}
	return port, fmt.Sprintf("port %d is taken (another %s?); %s uses %d", preferred, what, what, port)
}

func (s *devStack) startRedis(port int, dir string, persist bool, notes *[]string) error {
	port, note := pickPort(port, "Redis")
	*notes = append(*notes, note)
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		// A fresh machine may lack redis-server: serve the same protocol
		// in process, and say what that costs.
		s.mini = miniredis.NewMiniRedis()
		if err := s.mini.StartAddr(net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err != nil {
			return fmt.Errorf("embedded redis: %w", err)
		}
		s.redisURL = fmt.Sprintf("redis://%s/0", s.mini.Addr())
		*notes = append(*notes, "WARNING: redis-server is not installed, so Redis is embedded (miniredis): "+
			"in memory only, slower, key TTLs do not expire; install it with apt-get install -y redis-server")
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// Append-only file in the data folder: node agents re-register their
	// nodes on restart, but the allocations of running rentals (which the
	// agents renew, and stop as zombies when missing) live only in Redis,
	// so a restarted `shizu dev` needs them back to keep its rentals.
	appendonly := "yes"
	if !persist {
		appendonly = "no"
	}
	s.redisCmd = exec.Command(bin, "--bind", "127.0.0.1", "--port", strconv.Itoa(port),
		"--save", "", "--appendonly", appendonly, "--appendfsync", "everysec", "--dir", dir, "--daemonize", "no", "--loglevel", "warning")
	s.redisCmd.Stdout, s.redisCmd.Stderr = s.logFileOrDiscard(), s.logFileOrDiscard()
	if err := s.redisCmd.Start(); err != nil {
		s.redisCmd = nil
		return fmt.Errorf("start redis-server: %w", err)
	}
	s.redisExit = make(chan error, 1)
	go func() { s.redisExit <- s.redisCmd.Wait() }()
	s.redisURL = fmt.Sprintf("redis://127.0.0.1:%d/0", port)
	return nil
}

func (s *devStack) logFileOrDiscard() io.Writer {
	if s.logFile == nil {
		return io.Discard
	}
	return s.logFile
}

func pingRedis(ctx context.Context, url string) error {
	opts, err := redis.ParseURL(url)
	if err != nil {
		return fmt.Errorf("redis url: %w", err)
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := rdb.Ping(ctx).Err()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("redis at %s does not answer: %w", opts.Addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitReady(ctx context.Context, addr string, failed <-chan error) error {
	deadline := time.NewTimer(60 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if service.Healthcheck(ctx, addr) == nil {
			return nil
		}
		select {
		case err := <-failed:
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return errors.New("not ready after 60s")
		case <-tick.C:
		}
	}
}

func randomPassword() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
