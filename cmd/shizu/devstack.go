package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	autoscaler "github.com/shizu-gpu/shizu/services/autoscaler/app"
	failover "github.com/shizu-gpu/shizu/services/failover/app"
	metering "github.com/shizu-gpu/shizu/services/metering/app"
	nodeagent "github.com/shizu-gpu/shizu/services/node-agent/app"
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

// devStack is the platform `shizu dev` runs. Its start steps run in
// order; each records how to stop what it started, and close stops it all
// in reverse order, whether a step failed or the platform ran until
// Ctrl-C.
type devStack struct {
	o      devOptions
	stdout io.Writer
	// ctx is the lifetime of the services and node agents; close ends it
	// first, so they all see their context end at once, as at Ctrl-C.
	ctx    context.Context
	cancel context.CancelFunc
	stops  []func()

	dataDir, logPath string
	logFile          *os.File
	notes            []string
	passwords        map[string]string
	sysPassword      string
	natsURL          string
	monPort          int
	redisURL         string
	envPath          string
	apiURL           string
	keys             devKeys

	units  []serviceUnit
	fleet  *fleetRunner
	failed chan error // a service that ended with an error
}

// serviceUnit is one of the services that run once (the node agents run
// in the fleet).
type serviceUnit struct {
	name string
	cfg  service.Config
	run  func(context.Context) error
}

func newDevStack(ctx context.Context, o devOptions, stdout io.Writer) *devStack {
	s := &devStack{o: o, stdout: stdout, passwords: map[string]string{}}
	s.ctx, s.cancel = context.WithCancel(ctx)
	return s
}

// start runs the start steps in order until one fails.
func (s *devStack) start(ctx context.Context) error {
	for _, step := range []func(context.Context) error{
		s.openDataDir, s.startNATS, s.provision, s.startRedis,
		s.configureServices, s.configureFleet, s.startServices, s.startFleet,
		s.waitReady, s.makeDevKeys, s.serveChaos, s.writeEnv, s.printBanner,
	} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	return nil
}

// onStop records how to stop what a step started.
func (s *devStack) onStop(stop func()) { s.stops = append(s.stops, stop) }

// close ends the services' and agents' context, then stops everything in
// reverse order of starting.
func (s *devStack) close() {
	s.cancel()
	for i := len(s.stops) - 1; i >= 0; i-- {
		s.stops[i]()
	}
	s.stops = nil
}

// wait returns when ctx ends (Ctrl-C) or a service or agent fails.
func (s *devStack) wait(ctx context.Context) error {
	select {
	case <-ctx.Done():
		fmt.Fprintln(s.stdout, "\nstopping...")
		return nil
	case err := <-s.failed:
		return err
	}
}

// openDataDir makes the data folder (a temporary one with -ephemeral,
// removed at exit), takes its lock (one shizu dev a folder) and opens the
// service log in it.
func (s *devStack) openDataDir(context.Context) error {
	dir := s.o.dataDir
	if s.o.ephemeral {
		tmp, err := os.MkdirTemp("", "shizu-dev-")
		if err != nil {
			return err
		}
		s.onStop(func() { _ = os.RemoveAll(tmp) })
		dir = tmp
	}
	dataDir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return fmt.Errorf("data folder: %w", err)
	}
	unlock, err := lockDataDir(dataDir)
	if err != nil {
		return err
	}
	s.onStop(unlock)
	s.dataDir, s.logPath = dataDir, filepath.Join(dataDir, "shizu.log")
	if s.logFile, err = os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
		return fmt.Errorf("log file: %w", err)
	}
	log := s.logFile
	s.onStop(func() { _ = log.Close() })
	return nil
}

// startNATS starts the embedded NATS server with JetStream, one user per
// service and the system account's advisory reader.
func (s *devStack) startNATS(context.Context) error {
	for _, u := range topology.Users() {
		s.passwords[u.Name] = randomPassword()
	}
	natsPort, note := pickPort(s.o.natsPort, "NATS")
	s.notes = append(s.notes, note)
	monPort, note := pickPort(s.o.monPort, "NATS monitoring")
	s.notes = append(s.notes, note)
	// A system account with one user lets failover read the server's
	// client-disconnect advisories: a killed agent is then found in about
	// a second, not at its heartbeat's TTL.
	sysAccount := server.NewAccount(devSystemAccount)
	s.sysPassword = randomPassword()
	ns, err := embednats.Start(&server.Options{
		ServerName: "shizu-dev", Host: "127.0.0.1", Port: natsPort, HTTPHost: "127.0.0.1", HTTPPort: monPort,
		JetStream: true, StoreDir: filepath.Join(s.dataDir, "nats"), NoSigs: true, NoLog: true,
		Accounts: []*server.Account{sysAccount}, SystemAccount: devSystemAccount,
		Users: append(embednats.Users(topology.Users(), func(name string) string { return s.passwords[name] }),
			// As deploy/nats/users.conf: disconnect advisories only, no publishing.
			&server.User{Username: devSystemUser, Password: s.sysPassword, Account: sysAccount,
				Permissions: &server.Permissions{
					Subscribe: &server.SubjectPermission{Allow: []string{topology.DisconnectAdvisories}},
					Publish:   &server.SubjectPermission{Deny: []string{">"}},
				}}),
	}, 10*time.Second)
	if err != nil {
		return err
	}
	s.onStop(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	s.natsURL, s.monPort = ns.ClientURL(), monPort
	return nil
}

// provision creates the streams and the heartbeat bucket as admin.
func (s *devStack) provision(ctx context.Context) error {
	admin := bus.Config{URL: s.natsURL, Name: "shizu-dev", User: topology.Admin, Password: s.passwords[topology.Admin]}
	if err := provision(ctx, admin, 1, 3*time.Second); err != nil {
		return fmt.Errorf("provision streams: %w", err)
	}
	return nil
}

// startRedis uses -redis-url, or starts a redis-server child (miniredis
// where none is installed), and waits until it answers.
func (s *devStack) startRedis(ctx context.Context) error {
	if s.o.redisURL != "" {
		s.redisURL = s.o.redisURL
	} else {
		r, err := startDevRedis(s.o.redisPort, filepath.Join(s.dataDir, "redis"), !s.o.ephemeral, s.logFile)
		if err != nil {
			return err
		}
		s.onStop(r.stop)
		s.redisURL = r.url
		s.notes = append(s.notes, r.notes...)
	}
	return pingRedis(ctx, s.redisURL)
}

// serviceConfig is a service's common configuration in dev: its own NATS
// user, the shared Redis, a free health port and the service log.
func (s *devStack) serviceConfig(name string) service.Config {
	c := service.Defaults(name)
	c.NATS = bus.Config{URL: s.natsURL, Name: name, User: name, Password: s.passwords[name]}
	c.RedisURL = s.redisURL
	port, _ := pickPort(0, "")
	c.HTTPAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	c.LogLevel, c.LogFormat, c.LogWriter = s.o.logLevel, "text", s.logFile
	c.ShutdownTimeout = 10 * time.Second
	return c
}

// configureServices builds the configuration of the five services; they
// start in startServices.
func (s *devStack) configureServices(context.Context) error {
	sched, meter, scale, fail := scheduler.DefaultConfig(), metering.DefaultConfig(), autoscaler.DefaultConfig(), failover.DefaultConfig()
	sched.Service, meter.Service, scale.Service, fail.Service =
		s.serviceConfig(topology.Scheduler), s.serviceConfig(topology.Metering), s.serviceConfig(topology.Autoscaler), s.serviceConfig(topology.Failover)
	meter.Rules.Interval, meter.Rules.MinimumCharge = s.o.interval, s.o.minCharge
	fail.Advisory = failover.AdvisoryConfig{URL: s.natsURL, User: devSystemUser, Password: s.sysPassword}
	scale.PolicyFile = s.o.policy
	// The scheduler keeps a request only the policy's instance types could
	// hold pending (the autoscaler provisions for it) and rejects one that
	// neither a node nor an instance type could ever hold.
	sched.FleetPolicyPath = s.o.policy
	if err := meter.Validate(); err != nil {
		return fmt.Errorf("metering: %w", err)
	}
	if err := scale.Validate(); err != nil {
		return fmt.Errorf("autoscaler: %w", err)
	}
	// With a policy whose fleet section sells instance types, the
	// autoscaler provisions nodes for capacity shortages as more
	// in-process node agents of the simulated fleet.
	scaleDeps := autoscaler.Deps{NewProvider: s.fleetProvider}
	s.units = []serviceUnit{
		{topology.Scheduler, sched.Service, func(ctx context.Context) error { return scheduler.Run(ctx, sched) }},
		{topology.Metering, meter.Service, func(ctx context.Context) error { return metering.Run(ctx, meter) }},
		{topology.Autoscaler, scale.Service, func(ctx context.Context) error { return autoscaler.RunWith(ctx, scale, scaleDeps) }},
		{topology.Failover, fail.Service, func(ctx context.Context) error { return failover.Run(ctx, fail) }},
		s.gatewayUnit(),
	}
	return nil
}

// agentConfig is a simulated node's agent configuration: its own node id,
// state folder (workload records and logs) and health endpoint.
func (s *devStack) agentConfig(n fleetNode) nodeagent.Config {
	c := nodeagent.DefaultConfig()
	c.Service = s.serviceConfig(topology.NodeAgent)
	c.Service.NATS.Name = "node-agent-" + n.ID
	c.NodeID, c.Simulate, c.Market = n.ID, n.Profile, n.Market
	c.StateDir = filepath.Join(s.dataDir, "node-agent", n.ID)
	return c
}

// configureFleet builds the simulated fleet (not started yet). At exit it says how many workloads keep running for the next start to
// adopt (an ephemeral stack ends them).
func (s *devStack) configureFleet(context.Context) error {
	nodes, err := parseFleet(s.o.fleet)
	if err != nil {
		return err
	}
	if s.fleet, err = newFleetRunner(nodes, s.agentConfig, slog.New(slog.NewTextHandler(s.logFile, nil))); err != nil {
		return err
	}
	s.onStop(s.noteLeftWorkloads)
	return nil
}

func (s *devStack) noteLeftWorkloads() {
	left := 0
	for _, id := range s.fleet.ids() {
		left += leftWorkloads(filepath.Join(s.dataDir, "node-agent", id), s.o.ephemeral)
	}
	if left > 0 && !s.o.ephemeral {
		fmt.Fprintf(s.stdout, "%d rental workloads keep running: the next `shizu dev -data %s` adopts them (stop them first with shizu stop to end them)\n", left, s.dataDir)
	}
}

// startServices runs the services until the stack closes; one that
// ends with an error fails the stack.
func (s *devStack) startServices(context.Context) error {
	var wg sync.WaitGroup
	s.failed = make(chan error, len(s.units))
	for _, u := range s.units {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := u.run(s.ctx); err != nil && !errors.Is(err, context.Canceled) {
				s.failed <- fmt.Errorf("%s: %w", u.name, err)
			}
		}()
	}
	s.onStop(wg.Wait)
	return nil
}

// startFleet starts every node's agent.
func (s *devStack) startFleet(context.Context) error {
	s.onStop(s.fleet.stopAll)
	for _, id := range s.fleet.ids() {
		if err := s.fleet.start(s.ctx, id); err != nil {
			return err
		}
	}
	return nil
}

// waitReady waits until every service and agent answers its readiness
// check.
func (s *devStack) waitReady(ctx context.Context) error {
	for _, u := range s.units {
		if err := waitReady(ctx, u.cfg.HTTPAddr, s.failed); err != nil {
			return fmt.Errorf("%s did not become ready (log: %s): %w", u.name, s.logPath, err)
		}
	}
	for _, n := range s.fleet.nodes() {
		if err := waitReady(ctx, n.HTTP, s.failed); err != nil {
			if ferr := s.fleet.failed(n.ID); ferr != nil {
				err = ferr
			}
			return fmt.Errorf("node agent %s did not become ready (log: %s): %w", n.ID, s.logPath, err)
		}
	}
	return nil
}

// serveChaos answers `shizu chaos`, which asks this process, as admin,
// to break its nodes.
func (s *devStack) serveChaos(context.Context) error {
	nc, err := nats.Connect(s.natsURL, nats.UserInfo(topology.Admin, s.passwords[topology.Admin]), nats.Name("shizu-dev-chaos"))
	if err != nil {
		return fmt.Errorf("chaos endpoint: %w", err)
	}
	s.onStop(nc.Close)
	if _, err := s.fleet.serveChaos(s.ctx, nc); err != nil {
		return fmt.Errorf("chaos endpoint: %w", err)
	}
	return nil
}

// writeEnv writes the admin's credentials for other tools, and the
// gateway's URL and keys for the tenant verbs; a stopped
// platform leaves no credentials that point nowhere.
func (s *devStack) writeEnv(context.Context) error {
	s.envPath = filepath.Join(s.dataDir, "env")
	env := fmt.Sprintf("export SHIZU_NATS_URL=%s\nexport SHIZU_NATS_USER=%s\nexport SHIZU_NATS_PASSWORD=%s\nexport SHIZU_REDIS_URL=%s\n",
		s.natsURL, topology.Admin, s.passwords[topology.Admin], s.redisURL) + s.devEnvAPI()
	if err := os.WriteFile(s.envPath, []byte(env), 0o600); err != nil {
		return fmt.Errorf("env file: %w", err)
	}
	path := s.envPath
	s.onStop(func() { _ = os.Remove(path) })
	return nil
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

// waitReady waits up to 60 s for the health endpoint at addr to report
// ready; a failure on failed ends the wait.
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
