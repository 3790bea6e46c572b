// Package app wires the node agent to the bus, the capacity store, the
// GPU backend and the workload runtime, and runs it.
package app

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"time"

	"github.com/shizu-gpu/shizu/services/node-agent/agent"
	"github.com/shizu-gpu/shizu/services/node-agent/logship"
	"github.com/shizu-gpu/shizu/shared/rent"
	"github.com/shizu-gpu/shizu/shared/service"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Config is the node agent's configuration.
type Config struct {
	Service service.Config
	// NodeID names this GPU host on the bus; it defaults to the hostname.
	NodeID string
	// Simulate names a simulated GPU profile (e.g. h100x8) for hosts
	// without GPUs; empty means real NVML discovery.
	Simulate string
	// Zone, Market ("on-demand" or "spot"), Price (per GPU-hour, decimal)
	// and Currency describe how the node is sold.
	Zone     string
	Market   string
	Price    string
	Currency string
	// InstanceType is the provider's instance type; defaults to the
	// simulated profile's.
	InstanceType string
	// CPUMilli and MemoryMiB are the host resources rentals may use; 0
	// means 90% of the host's (or the simulated profile's).
	CPUMilli  int64
	MemoryMiB int64
	// HeartbeatInterval and HeartbeatTTL: how often the agent beats, and
	// how long its key outlives the last beat.
	HeartbeatInterval time.Duration
	HeartbeatTTL      time.Duration
	// TelemetryInterval is how often GPUs are sampled and reported.
	TelemetryInterval time.Duration
	// LeaseInterval is how often the agent checks its registration and
	// renews the allocations of its running workloads.
	LeaseInterval time.Duration
	// StateDir holds workload records, logs and working directories; empty
	// means <tmp>/shizu-node-agent/<node id>. Two agents must never share
	// one (each would adopt the other's workloads).
	StateDir string
	// DefaultCommand runs when a rental names no command (the process
	// runtime has no image entrypoint to fall back on).
	DefaultCommand []string
	// StopGrace is the default time between the polite signal and the kill.
	StopGrace time.Duration
	// SimulateNoticeLead, with Simulate, lets a test play the cloud
	// provider: SIGUSR1 makes the simulated host deliver a spot
	// interruption notice whose deadline is this far ahead. 0 (the
	// default) leaves SIGUSR1 alone; an agent on real GPUs refuses it.
	SimulateNoticeLead time.Duration
	// Logs bound the shipping of each workload's output to the LOGS
	// stream: line and batch caps, the rate per run, the read interval.
	Logs logship.Limits

	// Simulated, when set, is the simulated host to run on instead of
	// building one from Simulate, so that the caller (`shizu dev`, a test)
	// can inject faults into it. Not a flag.
	Simulated *SimulatedHost
	// Now is the clock (default time.Now). Not a flag.
	Now func() time.Time
}

// DefaultConfig is the configuration on a developer machine.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{Service: service.Defaults(topology.NodeAgent), NodeID: host,
		Zone: "local", Market: "on-demand", Price: "2.00", Currency: "USD",
		HeartbeatInterval: time.Second, HeartbeatTTL: 3 * time.Second,
		TelemetryInterval: 5 * time.Second, LeaseInterval: 2 * time.Second,
		DefaultCommand: []string{"sleep", "infinity"}, StopGrace: 10 * time.Second, Logs: logship.DefaultLimits()}
}

// RegisterFlags binds the node agent's own flags, each with a
// SHIZU_NODE_AGENT_<FLAG> variable (service.Flags) and the older,
// documented SHIZU_* name as its alias.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	f := c.Service.Flags(fs)
	a := service.Alias
	f.String(&c.NodeID, "node-id", "this host's node id, a subject token", a("SHIZU_NODE_ID"))
	f.String(&c.Simulate, "simulate", "simulated GPU profile for hosts without GPUs: "+strings.Join(SimulatedProfiles(), ", "), a("SHIZU_SIMULATE"))
	f.String(&c.Zone, "zone", "zone of this node", a("SHIZU_NODE_ZONE"))
	f.String(&c.Market, "market", "how the node is bought: on-demand or spot", a("SHIZU_NODE_MARKET"))
	f.String(&c.Price, "price", "on-demand price of one GPU for one hour, e.g. 2.49", a("SHIZU_PRICE"))
	f.String(&c.Currency, "currency", "ISO 4217 currency of -price", a("SHIZU_CURRENCY"))
	f.String(&c.InstanceType, "instance-type", "provider instance type (default: the simulated profile's)", a("SHIZU_NODE_INSTANCE_TYPE"))
	f.Int64(&c.CPUMilli, "cpu-milli", "host CPU for rentals in milli-cores (0: 90% of the host)", a("SHIZU_CPU_MILLI"))
	f.Int64(&c.MemoryMiB, "memory-mib", "host memory for rentals in MiB (0: 90% of the host)", a("SHIZU_MEMORY_MIB"))
	f.Duration(&c.HeartbeatInterval, "heartbeat-interval", "time between heartbeats", a("SHIZU_HEARTBEAT_INTERVAL"))
	f.Duration(&c.HeartbeatTTL, "heartbeat-ttl", "how long the heartbeat key outlives the last beat", a("SHIZU_HEARTBEAT_TTL"))
	f.Duration(&c.TelemetryInterval, "telemetry-interval", "time between GPU telemetry samples", a("SHIZU_TELEMETRY_INTERVAL"))
	f.Duration(&c.LeaseInterval, "lease-interval", "time between registration checks and allocation renewals", a("SHIZU_LEASE_INTERVAL"))
	f.String(&c.StateDir, "state-dir", "directory for workload records, logs and working directories (default <tmp>/shizu-node-agent/<node id>)",
		a("SHIZU_STATE_DIR"))
	f.Duration(&c.StopGrace, "stop-grace", "default grace period between SIGTERM and SIGKILL", a("SHIZU_STOP_GRACE"))
	f.Duration(&c.SimulateNoticeLead, "simulate-notice-lead",
		"with -simulate only: SIGUSR1 delivers a simulated spot interruption notice with this lead time (0: off)", a("SHIZU_SIMULATE_NOTICE_LEAD"))
	f.Float64(&c.Logs.RateBytes, "log-rate", "bytes per second of output each workload may ship to its log; more is dropped and counted",
		a("SHIZU_LOG_RATE"))
	f.Float64(&c.Logs.BurstBytes, "log-burst", "bytes of output a workload may ship at once above -log-rate", a("SHIZU_LOG_BURST"))
	f.Duration(&c.Logs.Poll, "log-poll", "how often a workload's output file is read for new lines", a("SHIZU_LOG_POLL"))
	f.Var((*commandLine)(&c.DefaultCommand), "default-command", "command of a rental that names none, split on spaces",
		a("SHIZU_DEFAULT_COMMAND"))
}

// commandLine is a command given as one string, split on spaces.
type commandLine []string

func (c *commandLine) String() string { return strings.Join(*c, " ") }

func (c *commandLine) Set(v string) error {
	*c = strings.Fields(v)
	return nil
}

// Validate reports every problem in the configuration.
func (c Config) Validate() error {
	var errs []error
	if err := c.Service.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := subject.Token(c.NodeID); err != nil {
		errs = append(errs, fmt.Errorf("node.id: %w", err))
	}
	if c.Simulate != "" && c.Simulated == nil {
		if err := checkProfile(c.Simulate); err != nil {
			errs = append(errs, fmt.Errorf("simulate: %w", err))
		}
	}
	if _, err := c.facts(0, 0); err != nil {
		errs = append(errs, err)
	}
	if c.HeartbeatInterval <= 0 {
		errs = append(errs, fmt.Errorf("heartbeat.interval: %s, want > 0", c.HeartbeatInterval))
	}
	if c.HeartbeatTTL < time.Second || c.HeartbeatTTL <= c.HeartbeatInterval {
		errs = append(errs, fmt.Errorf("heartbeat.ttl: %s, want >= 1s (the server's minimum) and above the interval %s", c.HeartbeatTTL, c.HeartbeatInterval))
	}
	if c.TelemetryInterval <= 0 || c.LeaseInterval <= 0 {
		errs = append(errs, fmt.Errorf("telemetry.interval %s and lease.interval %s must be > 0", c.TelemetryInterval, c.LeaseInterval))
	}
	if len(c.DefaultCommand) == 0 {
		errs = append(errs, errors.New("default.command: required"))
	}
	if c.StopGrace < 0 {
		errs = append(errs, fmt.Errorf("stop.grace: %s is negative", c.StopGrace))
	}
	if err := c.Logs.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.SimulateNoticeLead < 0 || (c.SimulateNoticeLead > 0 && c.Simulate == "" && c.Simulated == nil) {
		errs = append(errs, fmt.Errorf("simulate.notice_lead: %s needs a simulated host (-simulate) and must not be negative; real hosts get notices from their provider only", c.SimulateNoticeLead))
	}
	return errors.Join(errs...)
}

// facts are the operator's facts about the node, with host defaults
// filled from cpu/mem (milli-cores, MiB) when not configured.
func (c Config) facts(cpu, mem int64) (agent.Facts, error) {
	f := agent.Facts{NodeID: c.NodeID, Zone: c.Zone, Currency: c.Currency, CPUMilli: c.CPUMilli, MemoryMiB: c.MemoryMiB,
		InstanceType: c.InstanceType}
	var errs []error
	m, err := rent.ParseMarket(c.Market)
	if err != nil {
		errs = append(errs, err)
	}
	f.Market = m.Proto()
	micros, err := rent.ParseMicros(c.Price)
	if err != nil {
		errs = append(errs, fmt.Errorf("price: %w", err))
	}
	f.PriceMicros = micros
	if err := subject.Token(c.Zone); err != nil {
		errs = append(errs, fmt.Errorf("zone: %w", err))
	}
	if c.CPUMilli < 0 || c.MemoryMiB < 0 {
		errs = append(errs, fmt.Errorf("cpu.milli %d and memory.mib %d must not be negative", c.CPUMilli, c.MemoryMiB))
	}
	if f.CPUMilli == 0 {
		f.CPUMilli = cpu
	}
	if f.MemoryMiB == 0 {
		f.MemoryMiB = mem
	}
	return f, errors.Join(errs...)
}

// stateDir is StateDir with its per-node default.
func (c Config) stateDir() string {
	if c.StateDir != "" {
		return c.StateDir
	}
	return filepath.Join(os.TempDir(), "shizu-node-agent", c.NodeID)
}

func (c Config) clock() func() time.Time {
	if c.Now != nil {
		return c.Now
	}
	return time.Now
}

// hostResources is 90% of this machine's CPUs and memory.
func hostResources() (cpuMilli, memMiB int64) {
	cpuMilli = int64(goruntime.NumCPU()) * 900
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return cpuMilli, 1024
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var kb int64
		if _, err := fmt.Sscanf(sc.Text(), "MemTotal: %d kB", &kb); err == nil {
			return cpuMilli, kb / 1024 * 9 / 10
		}
	}
	return cpuMilli, 1024
}

// clientName is the NATS connection name of the agent of node; failover
// recognises it (services/failover/detect.NodeFromClientName).
func clientName(node string) string { return "node-agent:" + node }

// Run runs the node agent until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	// The connection name says which node this is, so failover can read a
	// crashed agent's disconnect from the server's advisories at once
	// instead of waiting for its heartbeat to expire.
	cfg.Service.NATS.Name = clientName(cfg.NodeID)
	return service.Run(ctx, cfg.Service, func(ctx context.Context, rt *service.Runtime) ([]service.Part, error) {
		a, err := start(ctx, cfg, rt)
		if err != nil {
			return nil, err
		}
		return []service.Part{a}, nil
	})
}
