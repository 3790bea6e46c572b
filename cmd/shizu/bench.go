package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// benchResult is one check of `shizu bench`: what was measured, the
// ceiling measured in the same run on the same servers, and the goal.
type benchResult struct {
	Check    string  `json:"check"`
	Measured string  `json:"measured"` // what Value is
	Value    float64 `json:"value"`
	Unit     string  `json:"unit"`
	// Ceiling is the most the machine gives the same path in this run
	// (e.g. bare Redis reserves, bare JetStream consumes); Ratio is
	// Value / Ceiling.
	Ceiling     float64 `json:"ceiling"`
	CeilingWhat string  `json:"ceiling_measured"`
	Ratio       float64 `json:"ratio"`
	// Goal is the target from the design; AtMost says lower is better.
	Goal   float64 `json:"goal"`
	AtMost bool    `json:"goal_is_upper_bound,omitempty"`
	Pass   bool    `json:"pass"`
	// Size is the amount of work (requests, events, samples, decisions).
	Size    int                `json:"size"`
	Seconds float64            `json:"seconds"`
	Extra   map[string]float64 `json:"extra,omitempty"`
}

func (r *benchResult) finish() {
	if r.Ceiling > 0 {
		r.Ratio = r.Value / r.Ceiling
	}
	if r.AtMost {
		r.Pass = r.Value < r.Goal
	} else {
		r.Pass = r.Value >= r.Goal
	}
}

// benchReport is what `shizu bench -o json` prints.
type benchReport struct {
	Redis      string        `json:"redis"`
	Comparable bool          `json:"comparable"` // false on the embedded Redis fallback
	CPUs       int           `json:"cpus"`
	LoadAvg    string        `json:"loadavg,omitempty"`
	Results    []benchResult `json:"results"`
	NotHere    []string      `json:"not_here"`
}

// benchCheck runs one check at size n; step reports its progress (0..1).
type benchCheck struct {
	name        string
	summary     string
	defaultSize int
	run         func(ctx context.Context, env benchEnvFactory, n int, step func(phase string, frac float64)) (benchResult, error)
}

func benchChecks() []benchCheck {
	return []benchCheck{
		{"placement", "placement decisions/s of the pure package, 1,000 nodes x 8 GPUs, ~60% full", 20000, benchPlacement},
		{"scheduler", "rental requests placed end to end (NATS in, Redis reserve, RentalScheduled out)", 5000, benchScheduler},
		{"metering", "rental events metered exactly once (usage records published)", 5000, benchMetering},
		{"autoscaler", "traffic sample -> ScalingDecided latency", 200, benchAutoscaler},
	}
}

const benchNotHere = "failover re-placement after a node loss is a chaos scenario with node-agent processes: " +
	"cd cmd/shizu && go test -run '^$' -bench ChaosSIGKILL -benchtime=1x ./e2e/"

func benchCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("shizu bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	checks := benchChecks()
	var names []string
	for _, c := range checks {
		names = append(names, c.name)
	}
	only := fs.String("only", strings.Join(names, ","), "comma-separated checks to run: "+strings.Join(names, ", "))
	size := fs.Int("n", 0, "size of each selected check: decisions, requests, rentals (3 events each) or samples; 0: each check's default")
	out := fs.String("o", "table", "output: table or json")
	fs.Usage = func() {
		fmt.Fprint(stderr, `Run Shizu's performance checks on this machine, through the real code
paths: an embedded nats-server with JetStream and a redis-server child
(as shizu dev starts them; never mocks). Each check prints its measured
rate or latency next to a ceiling measured in the same run on the same
servers, the ratio, and the design's goal with pass or fail.

Checks:
`)
		for _, c := range checks {
			fmt.Fprintf(stderr, "  %-11s %s (default -n %d)\n", c.name, c.summary, c.defaultSize)
		}
		fmt.Fprintf(stderr, `
Not here: %s

Without redis-server on PATH the embedded Redis (miniredis) is used and
the numbers are not comparable with anything.

Examples:
  shizu bench
  shizu bench -only scheduler,metering -n 20000
  shizu bench -o json > bench.json

Flags:
`, benchNotHere)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "shizu bench: unexpected arguments %v\n", fs.Args())
		return 2
	}
	if *out != "table" && *out != "json" {
		fmt.Fprintf(stderr, "shizu bench: -o %q: want table or json\n", *out)
		return 2
	}
	if *size < 0 {
		fmt.Fprintf(stderr, "shizu bench: -n %d: want a positive size (or 0 for the defaults)\n", *size)
		return 2
	}
	var run []benchCheck
	for _, name := range strings.Split(*only, ",") {
		name = strings.TrimSpace(name)
		i := slices.IndexFunc(checks, func(c benchCheck) bool { return c.name == name })
		if i < 0 {
			fmt.Fprintf(stderr, "shizu bench: -only: unknown check %q; checks: %s\n", name, strings.Join(names, ", "))
			return 2
		}
		if !slices.ContainsFunc(run, func(c benchCheck) bool { return c.name == name }) {
			run = append(run, checks[i])
		}
	}
	rep, err := runBench(ctx, run, *size, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "shizu bench: %v\n", err)
		return 1
	}
	if *out == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(rep)
	} else {
		err = writeBenchTable(stdout, rep)
	}
	if err != nil {
		fmt.Fprintf(stderr, "shizu bench: %v\n", err)
		return 1
	}
	return 0
}

func runBench(ctx context.Context, checks []benchCheck, size int, stderr io.Writer) (benchReport, error) {
	rep := benchReport{CPUs: runtime.NumCPU(), NotHere: []string{benchNotHere}, Comparable: true}
	if data, err := os.ReadFile("/proc/loadavg"); err == nil {
		rep.LoadAvg = strings.Join(strings.Fields(string(data))[:3], " ")
	}
	if bin, err := exec.LookPath("redis-server"); err == nil {
		rep.Redis = "redis-server child (" + bin + ")"
	} else {
		rep.Redis = "embedded miniredis: redis-server is not installed, so these numbers are NOT comparable (apt-get install -y redis-server)"
		rep.Comparable = false
		fmt.Fprintln(stderr, "shizu bench: WARNING: redis-server is not on PATH; using the embedded miniredis, whose numbers are not comparable")
	}
	factory := benchEnvFactory{}
	bar := newProgress(stderr, "bench", len(checks)*100, 2*time.Second)
	defer bar.Finish()
	for i, c := range checks {
		n := size
		if n == 0 {
			n = c.defaultSize
		}
		// The bar counts percent of all checks; the note names the check.
		step := func(phase string, frac float64) {
			bar.Update(i*100+int(min(max(frac, 0), 1)*100), fmt.Sprintf("check %d/%d %s: %s", i+1, len(checks), c.name, phase))
		}
		step("starting", 0)
		res, err := c.run(ctx, factory, n, step)
		if err != nil {
			return rep, fmt.Errorf("%s: %w", c.name, err)
		}
		res.Check, res.Size = c.name, n
		res.finish()
		rep.Results = append(rep.Results, res)
		bar.Update((i+1)*100, fmt.Sprintf("%s: %s %s", c.name, formatFloat(res.Value), res.Unit))
	}
	return rep, nil
}

func writeBenchTable(w io.Writer, rep benchReport) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tMEASURED\tCEILING (same run)\tRATIO\tGOAL\tRESULT")
	for _, r := range rep.Results {
		goal := ">= "
		if r.AtMost {
			goal = "< "
		}
		verdict := "pass"
		if !r.Pass {
			verdict = "FAIL"
		}
		fmt.Fprintf(tw, "%s\t%s %s\t%s %s\t%.2f\t%s%s %s\t%s\n", r.Check, formatFloat(r.Value), r.Unit,
			formatFloat(r.Ceiling), r.Unit, r.Ratio, goal, formatFloat(r.Goal), r.Unit, verdict)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, r := range rep.Results {
		fmt.Fprintf(w, "%s: %s (n=%d, %.1fs); ceiling: %s", r.Check, r.Measured, r.Size, r.Seconds, r.CeilingWhat)
		keys := make([]string, 0, len(r.Extra))
		for k := range r.Extra {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "; %s %s", k, formatFloat(r.Extra[k]))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "\nRedis: %s\nCPUs: %d, load average %s (a shared machine makes rates noisy: compare ratios)\n", rep.Redis, rep.CPUs, rep.LoadAvg)
	for _, n := range rep.NotHere {
		fmt.Fprintf(w, "Not here: %s\n", n)
	}
	if !rep.Comparable {
		fmt.Fprintln(w, "WARNING: embedded Redis: these numbers are not comparable.")
	}
	return nil
}

// formatFloat prints rates as integers and small values with decimals.
func formatFloat(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 1:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.3f", v)
	}
}

// benchEnvFactory starts a fresh platform substrate for each check, so
// one check's events never reach another's consumers.
type benchEnvFactory struct{}

// benchEnv is an embedded nats-server with JetStream, the platform's users
// and streams, and a Redis: what `shizu dev` runs, without the services.
type benchEnv struct {
	stack     *devStack
	natsURL   string
	redisURL  string
	passwords map[string]string
	rdb       *redis.Client
	admin     *bus.Conn
}

func (f benchEnvFactory) start(ctx context.Context) (*benchEnv, error) {
	stack, err := startDevStores(ctx)
	if err != nil {
		return nil, err
	}
	e := &benchEnv{stack: stack, natsURL: stack.natsURL, redisURL: stack.redisURL, passwords: stack.passwords}
	ok := false
	defer func() {
		if !ok {
			e.close()
		}
	}()
	opts, err := redis.ParseURL(e.redisURL)
	if err != nil {
		return nil, err
	}
	opts.PoolSize = 64
	e.rdb = redis.NewClient(opts)
	if e.admin, err = bus.Connect(ctx, e.busConfig(topology.Admin), bus.Instruments{}); err != nil {
		return nil, err
	}
	ok = true
	return e, nil
}

func (e *benchEnv) busConfig(user string) bus.Config {
	return bus.Config{URL: e.natsURL, Name: "shizu-bench-" + user, User: user, Password: e.passwords[user]}
}

func (e *benchEnv) connect(ctx context.Context, user string) (*bus.Conn, error) {
	return bus.Connect(ctx, e.busConfig(user), bus.Instruments{})
}

func (e *benchEnv) close() {
	if e.admin != nil {
		_ = e.admin.Close(context.Background())
	}
	if e.rdb != nil {
		_ = e.rdb.Close()
	}
	e.stack.close()
}

// percentile of sorted durations, in milliseconds.
func percentileMS(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := min(len(sorted)-1, int(q*float64(len(sorted))))
	return float64(sorted[i].Microseconds()) / 1000
}
