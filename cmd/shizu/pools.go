package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sort"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// poolView is a pool's scaling history.
type poolView struct {
	Pool      string           `json:"pool_id"`
	Replicas  int32            `json:"replicas"`
	Decisions []decisionRecord `json:"decisions"`
}

type decisionRecord struct {
	At        time.Time `json:"at"`
	From      int32     `json:"from"`
	To        int32     `json:"to"`
	Rule      string    `json:"rule"`
	Metric    string    `json:"metric,omitempty"`
	Observed  float64   `json:"observed"`
	Threshold float64   `json:"threshold"`
	Reason    string    `json:"reason,omitempty"`
}

func pools(events []event) []poolView {
	by := map[string]*poolView{}
	for _, e := range events {
		m, ok := e.Msg.(*shizuv1.ScalingDecided)
		if !ok {
			continue
		}
		p := by[m.GetPoolId()]
		if p == nil {
			p = &poolView{Pool: m.GetPoolId()}
			by[m.GetPoolId()] = p
		}
		p.Replicas = m.GetToReplicas()
		p.Decisions = append(p.Decisions, decisionRecord{At: ts(m.GetMeta().GetOccurredAt()), From: m.GetFromReplicas(), To: m.GetToReplicas(),
			Rule: m.GetRule(), Metric: m.GetMetric(), Observed: m.GetObservedValue(), Threshold: m.GetThreshold(), Reason: m.GetReason()})
	}
	out := []poolView{}
	for _, p := range by {
		out = append(out, *p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pool < out[j].Pool })
	return out
}

var poolsVerb = verb{
	name:    "pools",
	summary: "Show autoscaled pools: replicas now and the autoscaler's decisions (ScalingDecided events).",
	usage:   "[pool] [flags]",
	examples: `  shizu pools
  shizu pools chat-api -history 20
`,
	setup: func(fs *flag.FlagSet) func(context.Context, []string, io.Writer) error {
		var cf clientFlags
		cf.register(fs)
		history := fs.Int("history", 1, "decisions to show per pool, newest last")
		return func(ctx context.Context, args []string, stdout io.Writer) error {
			filter := subject.ScaleDecidedAll
			if len(args) > 1 {
				return usagef("want at most one pool id")
			}
			if len(args) == 1 {
				var err error
				if filter, err = subject.Format(subject.ScaleDecided, args[0]); err != nil {
					return usagef("pool id: %w", err)
				}
			}
			if *history < 1 {
				return usagef("-history %d: want at least 1", *history)
			}
			conn, _, err := cf.connect(ctx)
			if err != nil {
				return err
			}
			defer conn.Close(context.WithoutCancel(ctx))
			evs, err := readStream(ctx, conn, topology.StreamScaling, filter)
			if err != nil {
				return err
			}
			ps := pools(evs)
			for i := range ps {
				if d := ps[i].Decisions; len(d) > *history {
					ps[i].Decisions = d[len(d)-*history:]
				}
			}
			if cf.output == "json" {
				return printJSON(stdout, ps)
			}
			tw := table(stdout)
			fmt.Fprintln(tw, "POOL\tREPLICAS\tAT\tCHANGE\tRULE\tMETRIC\tOBSERVED\tTHRESHOLD\tREASON")
			for _, p := range ps {
				for _, d := range p.Decisions {
					fmt.Fprintf(tw, "%s\t%d\t%s\t%d -> %d\t%s\t%s\t%.4g\t%.4g\t%s\n", p.Pool, p.Replicas, d.At.Local().Format("15:04:05"), d.From, d.To,
						d.Rule, dash(d.Metric), d.Observed, d.Threshold, d.Reason)
				}
			}
			if len(ps) == 0 {
				fmt.Fprintln(tw, "(no scaling decisions yet: pools come from the autoscaler's policy file, e.g. shizu dev -autoscaler-policy pools.json, or from shizu pools apply -f pool.json; drive them with shizu traffic)")
			}
			return tw.Flush()
		}
	},
}
