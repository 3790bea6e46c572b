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

func replayCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("shizu replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	nodeFile := fs.String("nodes", "", "node CSV (default: "+replay.DefaultNodeFile+" in the trace folder)")
	podFile := fs.String("pods", "", "pod CSV (default: "+replay.DefaultPodFile+" in the trace folder); a bare variant name such as gpushare40 means csv/openb_pod_list_<name>.csv")
	traceDir := fs.String("trace-dir", "", "trace folder (default: shared/"+replay.TraceDirName+" found beside the repository, or $SHIZU_TRACE_DIR)")
	policies := fs.String("policies", "shizu,fgd,bestfit,packing,clustering,dotprod,random", "comma-separated policies, side by side")
	seeds := fs.Int("seeds", 10, "number of seeds")
	firstSeed := fs.Int64("seed", 42, "first seed (the paper uses 42..51)")
	mode := fs.String("mode", string(replay.ModeInflation), "inflation (the paper's protocol) or timeline (creation/deletion times, pending queue)")
	tune := fs.Float64("tune", replay.DefaultTune, "inflation target as a multiple of GPU capacity")
	stretch := fs.Float64("stretch", 1, "timeline mode: multiply every task's lifetime (raises the concurrent load)")
	out := fs.String("o", "table", "output: table or json")
	plot := fs.String("plot", "", "write an SVG plot of GPU allocation against arrived workload to this file")
	workers := fs.Int("workers", 0, "runs at once (default: GOMAXPROCS)")
	fs.Usage = func() {
		fmt.Fprint(stderr, `Replay the Alibaba GPU trace (FGD, ATC'23) through Shizu's placement
policies and report GPU allocation, unallocated GPU and fragmentation by
arrived workload, over seeds.

Examples:
  shizu replay                                     # all policies x 10 seeds, default trace
  shizu replay -policies fgd,bestfit -seeds 3 -o json
  shizu replay -pods gpushare40 -plot alloc.svg
  shizu replay -mode timeline -stretch 100 -seeds 1

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "shizu replay: unexpected arguments %v\n", fs.Args())
		return 2
	}
	m, err := replay.ParseMode(*mode)
	if err != nil {
		fmt.Fprintln(stderr, "shizu replay:", err)
		return 2
	}
	if *out != "table" && *out != "json" {
		fmt.Fprintf(stderr, "shizu replay: -o %q: want table or json\n", *out)
		return 2
	}
	if *seeds < 1 {
		fmt.Fprintln(stderr, "shizu replay: -seeds must be at least 1")
		return 2
	}
	var pols []placement.Policy
	for _, name := range strings.Split(*policies, ",") {
		p, err := placement.ParsePolicy(strings.TrimSpace(name))
		if err != nil {
			fmt.Fprintln(stderr, "shizu replay:", err)
			return 2
		}
		pols = append(pols, p)
	}
	nodes, pods, err := tracePaths(*traceDir, *nodeFile, *podFile)
	if err != nil {
		fmt.Fprintln(stderr, "shizu replay:", err)
		return 1
	}
	tr, err := replay.Load(nodes, pods)
	if err != nil {
		fmt.Fprintln(stderr, "shizu replay:", err)
		return 1
	}
	fmt.Fprintf(stderr, "replay: %d nodes (%d GPUs), %d pods from %s; %d policies x %d seeds, mode %s\n",
		len(tr.Nodes), tr.CapacityMilli()/placement.MilliPerGPU, len(tr.Pods), pods, len(pols), *seeds, m)
	start := time.Now()
	// A bar on a terminal, else a line per finished run; on stderr.
	bar := newProgress(stderr, "replay", len(pols)**seeds, 0)
	sums, _, err := replay.Execute(ctx, &tr, replay.Plan{
		Policies: pols, Seeds: replay.Seeds(*firstSeed, *seeds), Workers: *workers,
		Options: replay.Options{Mode: m, Tune: *tune, Stretch: *stretch},
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
		fmt.Fprintln(stderr, "shizu replay:", err)
		return 1
	}
	wall := time.Since(start)
	fmt.Fprintf(stderr, "replay: done in %.1fs\n", wall.Seconds())
	if *plot != "" {
		f, err := os.Create(*plot)
		if err == nil {
			err = replay.WriteSVG(f, fmt.Sprintf("%s, %s mode, %d seeds", filepath.Base(pods), m, *seeds), sums)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			fmt.Fprintln(stderr, "shizu replay: plot:", err)
			return 1
		}
	}
	if *out == "json" {
		err = replay.WriteJSON(stdout, replay.Report{Mode: string(m), NodeFile: nodes, PodFile: pods, WallSec: wall.Seconds(), Policies: sums})
	} else {
		err = replay.WriteTable(stdout, sums)
	}
	if err != nil {
		fmt.Fprintln(stderr, "shizu replay:", err)
		return 1
	}
	return 0
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
