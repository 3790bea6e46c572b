package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/replay"
)

// replayOptions are `shizu replay`'s flags.
type replayOptions struct {
	nodeFile, podFile, traceDir string
	policies, mode, out, plot   string
	seeds, workers              int
	firstSeed                   int64
	tune, stretch               float64
}

func (o *replayOptions) register(fs *flag.FlagSet) {
	fs.StringVar(&o.nodeFile, "nodes", "", "node CSV (default: "+replay.DefaultNodeFile+" in the trace folder)")
	fs.StringVar(&o.podFile, "pods", "", "pod CSV (default: "+replay.DefaultPodFile+" in the trace folder); a bare variant name such as gpushare40 means csv/openb_pod_list_<name>.csv")
	fs.StringVar(&o.traceDir, "trace-dir", "", "trace folder (default: shared/"+replay.TraceDirName+" found beside the repository, or $SHIZU_TRACE_DIR)")
	fs.StringVar(&o.policies, "policies", "shizu,fgd,bestfit,packing,clustering,dotprod,random", "comma-separated policies, side by side")
	fs.IntVar(&o.seeds, "seeds", 10, "number of seeds")
	fs.Int64Var(&o.firstSeed, "seed", 42, "first seed (the paper uses 42..51)")
	fs.StringVar(&o.mode, "mode", string(replay.ModeInflation), "inflation (the paper's protocol) or timeline (creation/deletion times, pending queue)")
	fs.Float64Var(&o.tune, "tune", replay.DefaultTune, "inflation target as a multiple of GPU capacity")
	fs.Float64Var(&o.stretch, "stretch", 1, "timeline mode: multiply every task's lifetime (raises the concurrent load)")
	fs.StringVar(&o.out, "o", "table", "output: table or json")
	fs.StringVar(&o.plot, "plot", "", "write an SVG plot of GPU allocation against arrived workload to this file")
	fs.IntVar(&o.workers, "workers", 0, "runs at once (default: GOMAXPROCS)")
}

const replayUsage = `Replay the Alibaba GPU trace (FGD, ATC'23) through Shizu's placement
policies and report GPU allocation, unallocated GPU and fragmentation by
arrived workload, over seeds.

Examples:
  shizu replay                                     # all policies x 10 seeds, default trace
  shizu replay -policies fgd,bestfit -seeds 3 -o json
  shizu replay -pods gpushare40 -plot alloc.svg
  shizu replay -mode timeline -stretch 100 -seeds 1

Flags:
`

func replayCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("shizu replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o replayOptions
	o.register(fs)
	fs.Usage = func() {
		fmt.Fprint(stderr, replayUsage)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stderr); err != nil {
		return flagExit(err)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "shizu replay: unexpected arguments %v\n", fs.Args())
		return 2
	}
	m, pols, err := o.check()
	if err != nil {
		fmt.Fprintln(stderr, "shizu replay:", err)
		return 2
	}
	if err := runReplay(ctx, o, m, pols, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "shizu replay:", err)
		return 1
	}
	return 0
}

// check reads the mode and the policies, and refuses what cannot run.
func (o replayOptions) check() (replay.Mode, []placement.Policy, error) {
	m, err := replay.ParseMode(o.mode)
	if err != nil {
		return m, nil, err
	}
	if o.out != "table" && o.out != "json" {
		return m, nil, fmt.Errorf("-o %q: want table or json", o.out)
	}
	if o.seeds < 1 {
		return m, nil, errors.New("-seeds must be at least 1")
	}
	var pols []placement.Policy
	for _, name := range strings.Split(o.policies, ",") {
		p, err := placement.ParsePolicy(strings.TrimSpace(name))
		if err != nil {
			return m, nil, err
		}
		pols = append(pols, p)
	}
	return m, pols, nil
}

// runReplay loads the trace, runs every policy and seed (progress on
// stderr) and writes the report, and the plot with -plot.
func runReplay(ctx context.Context, o replayOptions, m replay.Mode, pols []placement.Policy, stdout, stderr io.Writer) error {
	nodes, pods, err := tracePaths(o.traceDir, o.nodeFile, o.podFile)
	if err != nil {
		return err
	}
	tr, err := replay.Load(nodes, pods)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "replay: %d nodes (%d GPUs), %d pods from %s; %d policies x %d seeds, mode %s\n",
		len(tr.Nodes), tr.CapacityMilli()/placement.MilliPerGPU, len(tr.Pods), pods, len(pols), o.seeds, m)
	start := time.Now()
	// A bar on a terminal, else a line per finished run; on stderr.
	bar := newProgress(stderr, "replay", len(pols)*o.seeds, 0)
	sums, _, err := replay.Execute(ctx, &tr, replay.Plan{
		Policies: pols, Seeds: replay.Seeds(o.firstSeed, o.seeds), Workers: o.workers,
		Options: replay.Options{Mode: m, Tune: o.tune, Stretch: o.stretch},
		Progress: func(done, total int, r replay.Result) {
			msg := fmt.Sprintf("%s seed %d: %d tasks, %d failed", r.Policy, r.Seed, r.Tasks, r.Failed)
			if lv, ok := r.At(100); ok {
				msg += fmt.Sprintf(", %.2f%% unallocated at 100%% arrived", lv.Unalloc)
			}
			bar.Update(done, fmt.Sprintf("%s (%.1fs)", msg, r.Wall.Seconds()))
		},
	})
	bar.Finish()
	if err != nil {
		return err
	}
	wall := time.Since(start)
	fmt.Fprintf(stderr, "replay: done in %.1fs\n", wall.Seconds())
	if o.plot != "" {
		if err := writePlot(o.plot, fmt.Sprintf("%s, %s mode, %d seeds", filepath.Base(pods), m, o.seeds), sums); err != nil {
			return fmt.Errorf("plot: %w", err)
		}
	}
	if o.out == "json" {
		return replay.WriteJSON(stdout, replay.Report{Mode: string(m), NodeFile: nodes, PodFile: pods, WallSec: wall.Seconds(), Policies: sums})
	}
	return replay.WriteTable(stdout, sums)
}

func writePlot(path, title string, sums []replay.Summary) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	err = replay.WriteSVG(f, title, sums)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// tracePaths resolves the node and pod files: explicit paths win; the
// rest come from the trace folder, found from the working directory and
// from the executable's directory.
func tracePaths(dir, nodes, pods string) (string, string, error) {
	variant := pods != "" && !strings.ContainsAny(pods, `/\`) && !strings.HasSuffix(pods, ".csv")
	if nodes != "" && pods != "" && !variant {
		return nodes, pods, nil
	}
	if dir == "" {
		wd, _ := os.Getwd()
		d, err := replay.FindTraceDir(wd)
		if err != nil {
			if exe, xerr := os.Executable(); xerr == nil {
				if d2, err2 := replay.FindTraceDir(filepath.Dir(exe)); err2 == nil {
					d, err = d2, nil
				}
			}
		}
		if err != nil {
			return "", "", fmt.Errorf("%w (or pass -nodes and -pods, or -trace-dir)", err)
		}
		dir = d
	}
	if nodes == "" {
		nodes = filepath.Join(dir, replay.DefaultNodeFile)
	}
	switch {
	case pods == "":
		pods = filepath.Join(dir, replay.DefaultPodFile)
	case variant:
		pods = filepath.Join(dir, "csv", "openb_pod_list_"+pods+".csv")
	}
	return nodes, pods, nil
}
