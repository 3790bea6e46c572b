// Package app wires the node agent to the bus, the capacity store, the
// GPU backend and the workload runtime, and runs it.
package app

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/node-agent/agent"
	"github.com/shizu-gpu/shizu/services/node-agent/gpu"
	"github.com/shizu-gpu/shizu/services/node-agent/gpu/nvmlgpu"
	"github.com/shizu-gpu/shizu/services/node-agent/gpu/simgpu"
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

	// Fleet, when set, is the simulated host to use instead of building
	// one from Simulate (tests inject faults into it). Not a flag.
	Fleet *simgpu.Fleet
	// Now is the clock (default time.Now). Not a flag.
	Now func() time.Time

	envErrs []error // SHIZU_* values that did not parse
}

// DefaultConfig is the configuration on a developer machine.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{Service: service.Defaults(topology.NodeAgent), NodeID: host,
		Zone: "local", Market: "on-demand", Price: "2.00", Currency: "USD",
		HeartbeatInterval: time.Second, HeartbeatTTL: 3 * time.Second,
		TelemetryInterval: 5 * time.Second, LeaseInterval: 2 * time.Second,
		DefaultCommand: []string{"sleep", "infinity"}, StopGrace: 10 * time.Second}
}

// RegisterFlags binds the node agent's own flags, each defaulting to its
// SHIZU_* environment variable.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	str := func(p *string, name, env, usage string) {
		if v, ok := os.LookupEnv(env); ok {
			*p = v
		}
		fs.StringVar(p, name, *p, fmt.Sprintf("%s [%s]", usage, env))
	}
	dur := func(p *time.Duration, name, env, usage string) {
		if v, ok := os.LookupEnv(env); ok {
			if d, err := time.ParseDuration(v); err == nil {
				*p = d
			} else {
				c.envErrs = append(c.envErrs, fmt.Errorf("%s: %q is not a duration (e.g. 15s)", env, v))
			}
		}
		fs.DurationVar(p, name, *p, fmt.Sprintf("%s [%s]", usage, env))
	}
	i64 := func(p *int64, name, env, usage string) {
		if v, ok := os.LookupEnv(env); ok {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				*p = n
			} else {
				c.envErrs = append(c.envErrs, fmt.Errorf("%s: %q is not a whole number", env, v))
			}
		}
		fs.Int64Var(p, name, *p, fmt.Sprintf("%s [%s]", usage, env))
	}
	str(&c.NodeID, "node-id", "SHIZU_NODE_ID", "this host's node id, a subject token")
	str(&c.Simulate, "simulate", "SHIZU_SIMULATE", "simulated GPU profile for hosts without GPUs: "+strings.Join(simgpu.Profiles(), ", "))
	str(&c.Zone, "zone", "SHIZU_NODE_ZONE", "zone of this node")
	str(&c.Market, "market", "SHIZU_NODE_MARKET", "how the node is bought: on-demand or spot")
	str(&c.Price, "price", "SHIZU_PRICE", "on-demand price of one GPU for one hour, e.g. 2.49")
	str(&c.Currency, "currency", "SHIZU_CURRENCY", "ISO 4217 currency of -price")
	str(&c.InstanceType, "instance-type", "SHIZU_NODE_INSTANCE_TYPE", "provider instance type (default: the simulated profile's)")
	i64(&c.CPUMilli, "cpu-milli", "SHIZU_CPU_MILLI", "host CPU for rentals in milli-cores (0: 90% of the host)")
	i64(&c.MemoryMiB, "memory-mib", "SHIZU_MEMORY_MIB", "host memory for rentals in MiB (0: 90% of the host)")
	dur(&c.HeartbeatInterval, "heartbeat-interval", "SHIZU_HEARTBEAT_INTERVAL", "time between heartbeats")
	dur(&c.HeartbeatTTL, "heartbeat-ttl", "SHIZU_HEARTBEAT_TTL", "how long the heartbeat key outlives the last beat")
	dur(&c.TelemetryInterval, "telemetry-interval", "SHIZU_TELEMETRY_INTERVAL", "time between GPU telemetry samples")
	dur(&c.LeaseInterval, "lease-interval", "SHIZU_LEASE_INTERVAL", "time between registration checks and allocation renewals")
	str(&c.StateDir, "state-dir", "SHIZU_STATE_DIR", "directory for workload records, logs and working directories (default <tmp>/shizu-node-agent/<node id>)")
	dur(&c.StopGrace, "stop-grace", "SHIZU_STOP_GRACE", "default grace period between SIGTERM and SIGKILL")
	dur(&c.SimulateNoticeLead, "simulate-notice-lead", "SHIZU_SIMULATE_NOTICE_LEAD",
		"with -simulate only: SIGUSR1 delivers a simulated spot interruption notice with this lead time (0: off)")
	if v, ok := os.LookupEnv("SHIZU_DEFAULT_COMMAND"); ok {
		c.DefaultCommand = strings.Fields(v)
	}
	fs.Func("default-command", fmt.Sprintf("command of a rental that names none, split on spaces (default %q) [SHIZU_DEFAULT_COMMAND]",
		strings.Join(c.DefaultCommand, " ")), func(v string) error {
		c.DefaultCommand = strings.Fields(v)
		return nil
	})
}

// Validate reports every problem in the configuration.
func (c Config) Validate() error {
	errs := append([]error(nil), c.envErrs...)
	if err := c.Service.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := subject.Token(c.NodeID); err != nil {
		errs = append(errs, fmt.Errorf("node.id: %w", err))
	}
	if c.Simulate != "" && c.Fleet == nil {
		if _, err := simgpu.Lookup(c.Simulate); err != nil {
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
	if c.SimulateNoticeLead < 0 || (c.SimulateNoticeLead > 0 && c.Simulate == "" && c.Fleet == nil) {
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
	switch c.Market {
	case "on-demand":
		f.Market = shizuv1.Market_MARKET_ON_DEMAND
	case "spot":
		f.Market = shizuv1.Market_MARKET_SPOT
	default:
		errs = append(errs, fmt.Errorf("market: %q, want on-demand or spot", c.Market))
	}
	micros, err := parseMicros(c.Price)
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

// parseMicros reads a non-negative decimal amount ("2.49") as micro-units.
func parseMicros(s string) (int64, error) {
	whole, frac, _ := strings.Cut(strings.TrimSpace(s), ".")
	if whole == "" || len(frac) > 6 {
		return 0, fmt.Errorf("%q is not an amount with at most 6 decimals", s)
	}
	w, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || w < 0 || w > math.MaxInt64/1_000_000-1 {
		return 0, fmt.Errorf("%q is not a non-negative amount", s)
	}
	var f int64
	if frac != "" {
		if f, err = strconv.ParseInt(frac+strings.Repeat("0", 6-len(frac)), 10, 64); err != nil || f < 0 {
			return 0, fmt.Errorf("%q is not a non-negative amount", s)
		}
	}
	return w*1_000_000 + f, nil
}

// backend is the GPU backend the agent runs on, with what a simulated
// profile says of the host.
type backend struct {
	host gpu.Host
	load gpu.LoadModel // nil on real GPUs
	// cpuMilli, memMiB and instanceType are the simulated profile's (zero
	// on real GPUs: the host's own are used); simulated names the profile.
	cpuMilli, memMiB        int64
	instanceType, simulated string
}

// openBackend returns the GPU backend: the injected or named simulated
// fleet (whose load then follows the workloads, and which with
// SimulateNoticeLead turns SIGUSR1 into spot notices until the host is
// closed), else real NVML (which refuses to start without a driver).
func (c Config) openBackend(log *slog.Logger) (backend, error) {
	fleet := c.Fleet
	if fleet == nil && c.Simulate != "" {
		h := fnv.New64a()
		_, _ = h.Write([]byte(c.NodeID))
		f, err := simgpu.New(c.Simulate, h.Sum64())
		if err != nil {
			return backend{}, err
		}
		fleet = f
	}
	if fleet == nil {
		h, err := nvmlgpu.New(nvml.New(), nvmlgpu.WithClock(c.clock()))
		return backend{host: h}, err
	}
	h, err := fleet.Host(nvmlgpu.WithClock(c.clock()))
	if err != nil {
		return backend{}, err
	}
	p := fleet.Profile
	b := backend{host: h, load: fleet, cpuMilli: p.CPUMilli, memMiB: p.MemoryMiB, instanceType: p.InstanceType, simulated: p.Name}
	if c.SimulateNoticeLead > 0 {
		stop := fleet.NoticeOnSignal(c.SimulateNoticeLead, c.clock(), log, syscall.SIGUSR1)
		b.host = closedWith{Host: h, also: stop}
	}
	return b, nil
}

// closedWith is a Host whose Close also ends what came with it.
type closedWith struct {
	gpu.Host
	also func()
}

func (h closedWith) Close() error {
	h.also()
	return h.Host.Close()
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
