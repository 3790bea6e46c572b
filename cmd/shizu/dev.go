package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	nodeagent "github.com/shizu-gpu/shizu/services/node-agent/app"
	"github.com/shizu-gpu/shizu/shared/topology"
)

type devOptions struct {
	dataDir   string
	ephemeral bool
	natsPort  int
	monPort   int
	redisURL  string
	redisPort int
	apiPort   int
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
JetStream, Redis (a redis-server child, or -redis-url), the five services
and the tenant API (the gateway, with a key for tenant dev),
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
	fs.IntVar(&o.apiPort, "api-port", devAPIPort, "port of the tenant API (the gateway) on 127.0.0.1; a free one is used when taken")
	fs.StringVar(&o.policy, "autoscaler-policy", "", "autoscaler pools and fleet policy file (JSON); see docs/autoscaler.md")
	fs.StringVar(&o.logLevel, "log-level", "info", "service log level: debug, info, warn, error")
	fs.StringVar(&o.fleet, "fleet", defaultFleet, "simulated GPU hosts: profile[:count[:spot]],... with profiles "+strings.Join(nodeagent.SimulatedProfiles(), ", "))
	fs.DurationVar(&o.interval, "meter-interval", time.Minute, "metering: usage records of running rentals close at multiples of this")
	fs.DurationVar(&o.minCharge, "minimum-charge", time.Minute, "metering: least an on-demand rental the tenant ends is billed")
	if err := parseFlags(fs, args, stderr); err != nil {
		return flagExit(err)
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

// runDev starts the platform and runs it until ctx ends or a part fails;
// whatever started is stopped in reverse order either way.
func runDev(ctx context.Context, o devOptions, stdout io.Writer) error {
	s := newDevStack(ctx, o, stdout)
	defer s.close()
	if err := s.start(ctx); err != nil {
		return err
	}
	return s.wait(ctx)
}

// printBanner says what runs where, and how to talk to it.
func (s *devStack) printBanner(context.Context) error {
	stdout := s.stdout
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	state := "kept across restarts"
	if s.o.ephemeral {
		state = "temporary, removed at exit"
	}
	fmt.Fprintf(tw, "Shizu dev platform is up. Data: %s (%s)\n\n", s.dataDir, state)
	fmt.Fprintf(tw, "  NATS\t%s\tJetStream, %d streams; monitor http://127.0.0.1:%d/jsz\n", s.natsURL, len(topology.Streams(1)), s.monPort)
	fmt.Fprintf(tw, "  Redis\t%s\t\n", s.redisURL)
	for _, u := range s.units {
		fmt.Fprintf(tw, "  %s\tready\thttp://%s/readyz  /metrics\n", u.name, u.cfg.HTTPAddr)
	}
	for _, n := range s.fleet.nodes() {
		fmt.Fprintf(tw, "  %s\tready\thttp://%s/readyz  node agent, simulated %s, %s\n", n.ID, n.HTTP, n.Profile, n.Market)
	}
	_ = tw.Flush()
	for _, n := range s.notes {
		if n != "" {
			fmt.Fprintf(stdout, "  note: %s\n", n)
		}
	}
	devFlag := ""
	if cwd, err := os.Getwd(); err != nil || filepath.Join(cwd, ".shizu") != s.dataDir {
		devFlag = " -dev-dir " + s.dataDir
	}
	s.printAPI(stdout)
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
	fmt.Fprintf(stdout, "Other tools: source %s (SHIZU_NATS_URL, _USER, _PASSWORD as admin, SHIZU_REDIS_URL)\nService logs: %s\nCtrl-C stops everything.\n", s.envPath, s.logPath)
	return nil
}
