package main

import (
	"context"
	"encoding/json"
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

	"github.com/shizu-gpu/shizu/shared/benchkit"
)

// benchResult is one check of `shizu bench`: its name and the Result of
// its benchmark's Run.
type benchResult struct {
	Check string `json:"check"`
	benchkit.Result
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

// missed names the checks that missed their goal.
func (r benchReport) missed() []string {
	var out []string
	for _, res := range r.Results {
		if !res.Pass {
			out = append(out, res.Check)
		}
	}
	return out
}

func benchCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runBenchCommand(ctx, args, benchChecks(), stdout, stderr)
}

// benchOptions are the flags of `shizu bench`.
type benchOptions struct {
	run        []benchCheck
	size       int
	out        string
	reportOnly bool
}

// runBenchCommand is `shizu bench` over checks: it prints the report and
// exits 1 when a check misses its goal (0 with -report-only), 2 on bad
// flags.
func runBenchCommand(ctx context.Context, args []string, checks []benchCheck, stdout, stderr io.Writer) int {
	o, code := parseBenchFlags(args, checks, stderr)
	if code >= 0 {
		return code
	}
	rep, err := runBench(ctx, o.run, o.size, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "shizu bench: %v\n", err)
		return 1
	}
	if o.out == "json" {
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
	if missed := rep.missed(); len(missed) > 0 && !o.reportOnly {
		fmt.Fprintf(stderr, "shizu bench: %s missed its goal (FAIL above); -report-only exits 0 whatever the verdicts\n", strings.Join(missed, ", "))
		return 1
	}
	return 0
}

// parseBenchFlags reads the flags; code is the exit status when the
// command ends here (help, bad flags), -1 to go on.
func parseBenchFlags(args []string, checks []benchCheck, stderr io.Writer) (o benchOptions, code int) {
	fs := flag.NewFlagSet("shizu bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var names []string
	for _, c := range checks {
		names = append(names, c.name)
	}
	only := fs.String("only", strings.Join(names, ","), "comma-separated checks to run: "+strings.Join(names, ", "))
	fs.IntVar(&o.size, "n", 0, "size of each selected check: decisions, requests, rentals (3 events each) or samples; 0: each check's default")
	fs.StringVar(&o.out, "o", "table", "output: table or json")
	fs.BoolVar(&o.reportOnly, "report-only", false, "exit 0 even when a check misses its goal (the report still says FAIL)")
	fs.Usage = func() { benchUsage(fs, checks, stderr) }
	if err := parseFlags(fs, args, stderr); err != nil {
		return o, flagExit(err)
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "shizu bench: unexpected arguments %v\n", fs.Args())
		return o, 2
	case o.out != "table" && o.out != "json":
		fmt.Fprintf(stderr, "shizu bench: -o %q: want table or json\n", o.out)
		return o, 2
	case o.size < 0:
		fmt.Fprintf(stderr, "shizu bench: -n %d: want a positive size (or 0 for the defaults)\n", o.size)
		return o, 2
	}
	for _, name := range strings.Split(*only, ",") {
		name = strings.TrimSpace(name)
		i := slices.IndexFunc(checks, func(c benchCheck) bool { return c.name == name })
		if i < 0 {
			fmt.Fprintf(stderr, "shizu bench: -only: unknown check %q; checks: %s\n", name, strings.Join(names, ", "))
			return o, 2
		}
		if !slices.ContainsFunc(o.run, func(c benchCheck) bool { return c.name == name }) {
			o.run = append(o.run, checks[i])
		}
	}
	return o, -1
}

func benchUsage(fs *flag.FlagSet, checks []benchCheck, stderr io.Writer) {
	fmt.Fprint(stderr, `Run Shizu's performance checks on this machine, through the real code
paths: an embedded nats-server with JetStream and a redis-server child
(as shizu dev starts them; never mocks). Each check is the same Run as its
service's go test benchmark; it prints its measured rate or latency next
to a ceiling measured in the same run on the same servers, the ratio, and
the design's goal with pass or fail.

Checks:
`)
	for _, c := range checks {
		fmt.Fprintf(stderr, "  %-11s %s (default -n %d)\n", c.name, c.summary, c.defaultSize)
	}
	fmt.Fprintf(stderr, `
Not here: %s

Without redis-server on PATH the embedded Redis (miniredis) is used and
the numbers are not comparable with anything.

Exit status: 0 when every check met its goal, 1 when one missed it (after
the whole report) or a check could not run, 2 for bad flags. -report-only
exits 0 whatever the verdicts.

Examples:
  shizu bench
  shizu bench -only scheduler,metering -n 20000
  shizu bench -o json -report-only > bench.json

Flags:
`, benchNotHere)
	fs.PrintDefaults()
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
		res, err := runCheck(ctx, c, n, step)
		if err != nil {
			return rep, fmt.Errorf("%s: %w", c.name, err)
		}
		rep.Results = append(rep.Results, benchResult{Check: c.name, Result: res})
		bar.Update((i+1)*100, fmt.Sprintf("%s: %s %s", c.name, formatFloat(res.Value), res.Unit))
	}
	return rep, nil
}

// runCheck runs one check on fresh servers (or none, for a pure one); its
// Seconds include starting them.
func runCheck(ctx context.Context, c benchCheck, n int, step func(string, float64)) (benchkit.Result, error) {
	start := time.Now()
	env := &benchkit.Env{}
	if c.servers {
		var closeEnv func()
		var err error
		if env, closeEnv, err = startBenchEnv(ctx); err != nil {
			return benchkit.Result{}, err
		}
		defer closeEnv()
	}
	env.Progress = step
	res, err := c.run(ctx, env, n)
	res.Seconds = time.Since(start).Seconds()
	return res, err
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
