package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/types/known/durationpb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// gpuView is one GPU of a node as `shizu nodes` shows it.
type gpuView struct {
	Index     int    `json:"index"`
	Model     string `json:"model"`
	UsedMilli int64  `json:"used_milli"`
	VRAMMiB   int64  `json:"vram_mib"`
	FreeVRAM  int64  `json:"free_vram_mib"`
	Sharers   int    `json:"sharers"`
	// Utilization and VRAMUsed come from the node's last telemetry; -1
	// when none was seen.
	Utilization int32    `json:"utilization_percent"`
	VRAMUsed    int64    `json:"vram_used_mib"`
	Health      string   `json:"health"`
	Rentals     []string `json:"rentals,omitempty"`
}

// nodeView is one node: the capacity store's record and the health its
// events reported.
type nodeView struct {
	ID         string    `json:"node_id"`
	Status     string    `json:"status"`
	Health     string    `json:"health"`
	Epoch      uint64    `json:"epoch"`
	Zone       string    `json:"zone"`
	Market     string    `json:"market"`
	Model      string    `json:"model"`
	GPUs       []gpuView `json:"gpus"`
	FreeMilli  int64     `json:"free_milli_gpu"`
	TotalMilli int64     `json:"total_milli_gpu"`
	Rentals    int       `json:"rentals"`
	LastEvent  string    `json:"last_event,omitempty"`
}

// nodeHealth folds node events: health per node and GPU for the current
// epoch, and the last thing that happened to each node.
type nodeHealth struct {
	gpu  map[string]map[int32]string // node -> gpu index (-1 node) -> health
	last map[string]string
}

func foldNodeEvents(events []event) nodeHealth {
	h := nodeHealth{gpu: map[string]map[int32]string{}, last: map[string]string{}}
	epoch := map[string]int64{}
	for _, e := range events {
		switch m := e.Msg.(type) {
		case *shizuv1.NodeRegistered:
			epoch[m.GetNodeId()] = m.GetEpoch()
			h.gpu[m.GetNodeId()] = map[int32]string{} // a new epoch starts healthy
			h.last[m.GetNodeId()] = fmt.Sprintf("registered (epoch %d)", m.GetEpoch())
		case *shizuv1.NodeHealthChanged:
			if m.GetEpoch() < epoch[m.GetNodeId()] {
				continue
			}
			if h.gpu[m.GetNodeId()] == nil {
				h.gpu[m.GetNodeId()] = map[int32]string{}
			}
			word := enumWord(m.GetHealth().String(), "HEALTH_")
			h.gpu[m.GetNodeId()][m.GetGpuIndex()] = word
			what := "node"
			if m.GetGpuIndex() >= 0 {
				what = fmt.Sprintf("GPU %d", m.GetGpuIndex())
			}
			detail := what + " " + word
			if m.GetXid() != 0 {
				detail += fmt.Sprintf(" (Xid %d)", m.GetXid())
			}
			h.last[m.GetNodeId()] = detail
		case *shizuv1.NodeInterruptionNoticed:
			h.last[m.GetNodeId()] = "spot interruption by " + ts(m.GetDeadline()).Local().Format("15:04:05")
		case *shizuv1.NodeLost:
			h.last[m.GetNodeId()] = fmt.Sprintf("lost: %s (epoch %d fenced)", enumWord(m.GetReason().String(), "NODE_LOST_REASON_"), m.GetFencedEpoch())
		case *shizuv1.NodeDrained:
			h.last[m.GetNodeId()] = "drained"
		}
	}
	return h
}

// nodesFrom joins the capacity snapshot with the node events and the last
// telemetry of each node (by node id; may be missing).
func nodesFrom(snap capacity.Snapshot, h nodeHealth, telemetry map[string]*shizuv1.NodeTelemetry) []nodeView {
	out := []nodeView{}
	for _, n := range snap.Nodes {
		v := nodeView{ID: n.ID, Status: string(n.Status), Epoch: n.Epoch, Zone: n.Zone, Market: string(n.Market), Rentals: len(n.Allocations),
			LastEvent: h.last[n.ID], Health: "healthy", GPUs: []gpuView{}}
		healths := h.gpu[n.ID]
		if w := healths[-1]; w != "" {
			v.Health = w
		}
		users := map[int][]string{}
		for _, a := range n.Allocations {
			for _, g := range a.GPUs {
				users[g.Index] = append(users[g.Index], a.RentalID)
			}
		}
		for i, g := range n.GPUs {
			free := capacity.FreeGPU{Milli: capacity.MilliPerGPU, VRAMMiB: g.VRAMMiB}
			if i < len(n.FreeGPUs) {
				free = n.FreeGPUs[i]
			}
			gh := "healthy"
			if w := healths[int32(g.Index)]; w != "" {
				gh = w
			}
			gv := gpuView{Index: g.Index, Model: g.Model, UsedMilli: capacity.MilliPerGPU - free.Milli, VRAMMiB: g.VRAMMiB,
				FreeVRAM: free.VRAMMiB, Sharers: free.Sharers, Health: gh, Rentals: users[g.Index], Utilization: -1, VRAMUsed: -1}
			if tel := telemetry[n.ID]; tel != nil && uint64(tel.GetEpoch()) == n.Epoch {
				for _, s := range tel.GetGpus() {
					if int(s.GetGpuIndex()) == g.Index {
						gv.Utilization, gv.VRAMUsed = s.GetUtilizationPercent(), s.GetVramUsedMib()
					}
				}
			}
			v.GPUs = append(v.GPUs, gv)
			v.FreeMilli += free.Milli
			v.TotalMilli += capacity.MilliPerGPU
			if v.Model == "" {
				v.Model = g.Model
			}
		}
		out = append(out, v)
	}
	return out
}

var nodesVerb = verb{
	name:    "nodes",
	summary: "Show the fleet: each node's status, health and free capacity (from the capacity store), GPU by GPU with -gpus.",
	usage:   "[flags]",
	examples: `  shizu nodes
  shizu nodes -gpus
  shizu nodes -o json
`,
	setup: func(fs *flag.FlagSet) func(context.Context, []string, io.Writer) error {
		var cf clientFlags
		cf.register(fs)
		perGPU := fs.Bool("gpus", false, "one line per GPU: allocation, VRAM, sharers, health, rentals")
		return func(ctx context.Context, args []string, stdout io.Writer) error {
			if len(args) > 0 {
				return usagef("unexpected argument %q", args[0])
			}
			conn, r, err := cf.connect(ctx)
			if err != nil {
				return err
			}
			defer conn.Close(context.WithoutCancel(ctx))
			if r.redisURL == "" {
				return usagef("no Redis to read the capacity store from: pass -redis-url or set SHIZU_REDIS_URL")
			}
			opts, err := redis.ParseURL(r.redisURL)
			if err != nil {
				return usagef("-redis-url: %v", err)
			}
			rdb := redis.NewClient(opts)
			defer rdb.Close()
			store, err := capacity.New(rdb)
			if err != nil {
				return err
			}
			snap, err := store.Snapshot(ctx)
			if err != nil {
				return fmt.Errorf("read the capacity store at %s: %s", opts.Addr, oneLine(err))
			}
			evs, err := readStream(ctx, conn, topology.StreamNodes, subject.NodeRegisteredAll, subject.NodeHealthAll,
				subject.NodeInterruptionAll, subject.NodeLostAll, subject.NodeDrainedAll)
			if err != nil {
				return err
			}
			telemetry := map[string]*shizuv1.NodeTelemetry{}
			if stream, err := conn.JetStream().Stream(ctx, topology.StreamTelemetry); err == nil {
				for _, n := range snap.Nodes {
					subj, err := subject.Format(subject.NodeTelemetry, n.ID)
					if err != nil {
						continue
					}
					if m, err := stream.GetLastMsgForSubject(ctx, subj); err == nil {
						if tel, ok := decode(m.Header.Get(bus.HeaderEvent), m.Data).(*shizuv1.NodeTelemetry); ok {
							telemetry[n.ID] = tel
						}
					}
				}
			}
			nodes := nodesFrom(snap, foldNodeEvents(evs), telemetry)
			if cf.output == "json" {
				return printJSON(stdout, nodes)
			}
			tw := table(stdout)
			if *perGPU {
				fmt.Fprintln(tw, "NODE\tGPU\tMODEL\tALLOCATED\tFREE VRAM\tSHARERS\tUTIL\tVRAM USED\tHEALTH\tRENTALS")
				for _, n := range nodes {
					for _, g := range n.GPUs {
						util, used := "-", "-"
						if g.Utilization >= 0 {
							util, used = fmt.Sprintf("%d%%", g.Utilization), fmt.Sprintf("%d MiB", g.VRAMUsed)
						}
						fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d/%d MiB\t%d\t%s\t%s\t%s\t%s\n", n.ID, g.Index, g.Model, milliString(int32(g.UsedMilli)),
							g.FreeVRAM, g.VRAMMiB, g.Sharers, util, used, g.Health, dash(strings.Join(g.Rentals, ",")))
					}
				}
			} else {
				fmt.Fprintln(tw, "NODE\tSTATUS\tHEALTH\tEPOCH\tMODEL\tGPUS FREE\tRENTALS\tMARKET\tLAST EVENT")
				for _, n := range nodes {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s/%d\t%d\t%s\t%s\n", n.ID, n.Status, n.Health, n.Epoch, n.Model,
						milliString(int32(n.FreeMilli)), len(n.GPUs), n.Rentals, n.Market, n.LastEvent)
				}
			}
			if len(nodes) == 0 {
				fmt.Fprintln(tw, "(no nodes registered)")
			}
			return tw.Flush()
		}
	},
}

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
					return usagef("pool id: %v", err)
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

var trafficVerb = verb{
	name:    "traffic",
	summary: "Publish traffic samples of a serving pool (TrafficSampled), as a load balancer would, to drive the autoscaler.",
	usage:   "<pool> [flags]",
	examples: `  shizu traffic chat-api -rps 2400 -concurrent 600 -p99 85ms
  shizu traffic chat-api -rps 2400 -count 12 -every 5s     # a minute of samples
  shizu traffic chat-api -rps 0 -count 3                   # idle: scale in / to zero
`,
	setup: func(fs *flag.FlagSet) func(context.Context, []string, io.Writer) error {
		var cf clientFlags
		cf.register(fs)
		rps := fs.Float64("rps", 0, "requests per second over the window")
		conc := fs.Int64("concurrent", 0, "concurrent requests")
		p99 := fs.Duration("p99", 0, "p99 latency over the window (0: not measured)")
		window := fs.Duration("window", 10*time.Second, "window each sample covers")
		count := fs.Int("count", 1, "samples to publish")
		every := fs.Duration("every", 5*time.Second, "time between samples")
		return func(ctx context.Context, args []string, stdout io.Writer) error {
			if len(args) != 1 {
				return usagef("want one pool id")
			}
			pool := args[0]
			subj, err := subject.Format(subject.TrafficSample, pool)
			if err != nil {
				return usagef("pool id: %v", err)
			}
			if *count < 1 || *every < 0 {
				return usagef("-count %d must be >= 1 and -every %s not negative", *count, *every)
			}
			mk := func(now time.Time) *shizuv1.TrafficSampled {
				ev := &shizuv1.TrafficSampled{Meta: newMeta(fmt.Sprintf("traffic:%s:%d", pool, now.UnixNano()), pool, now), PoolId: pool,
					ConcurrentRequests: *conc, RequestsPerSecond: *rps, Window: durationpb.New(*window)}
				if *p99 > 0 {
					ev.P99Latency = durationpb.New(*p99)
				}
				return ev
			}
			if err := mk(time.Now()).Validate(); err != nil {
				return usagef("%s", strings.ReplaceAll(err.Error(), "\n", "; "))
			}
			conn, _, err := cf.connect(ctx)
			if err != nil {
				return err
			}
			defer conn.Close(context.WithoutCancel(ctx))
			p99Text := "not measured"
			if *p99 > 0 {
				p99Text = p99.String()
			}
			for i := range *count {
				if i > 0 {
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-time.After(*every):
					}
				}
				if _, err := conn.Publish(ctx, subj, mk(time.Now())); err != nil {
					return fmt.Errorf("publish sample: %w", err)
				}
				if cf.output == "table" {
					fmt.Fprintf(stdout, "[%d/%d] %s: %g req/s, %d concurrent, p99 %s\n", i+1, *count, pool, *rps, *conc, p99Text)
				}
			}
			if cf.output == "json" {
				return printJSON(stdout, map[string]any{"pool_id": pool, "samples": *count})
			}
			fmt.Fprintf(stdout, "watch the decisions with: shizu pools %s\n", pool)
			return nil
		}
	},
}

var chaosVerb = verb{
	name:    "chaos",
	summary: "Break a simulated node of a running `shizu dev` (its in-process node agents), to watch failover.",
	usage:   "<list|kill|restart|partition|xid|ecc|offbus|interrupt> [node] [flags]",
	examples: `  shizu chaos list                          # the simulated nodes and whether their agent runs
  shizu chaos kill h100x8-1                 # stop its agent: heartbeat expires, rentals migrate
  shizu chaos restart h100x8-1              # bring it back with healthy GPUs
  shizu chaos partition h100x8-1 -for 30s   # cut it off NATS and Redis: fenced, rentals move, back after 30s
  shizu chaos xid h100x8-1 -gpu 3 -xid 79   # an Xid on one GPU (79: fallen off the bus)
  shizu chaos ecc a100x8-1 -gpu 0           # an uncorrected ECC error
  shizu chaos interrupt h100x8-1 -in 30s    # a spot interruption notice
`,
	setup: func(fs *flag.FlagSet) func(context.Context, []string, io.Writer) error {
		var cf clientFlags
		cf.register(fs)
		gpu := fs.Int("gpu", 0, "GPU index for xid, ecc and offbus")
		xid := fs.Int("xid", 79, "Xid code for xid (48 double-bit ECC, 79 fallen off the bus, 13 graphics error...)")
		in := fs.Duration("in", 30*time.Second, "interrupt: time until the node is reclaimed")
		forDur := fs.Duration("for", 30*time.Second, "partition: how long the node stays cut off")
		return func(ctx context.Context, args []string, stdout io.Writer) error {
			if len(args) == 0 {
				return usagef("want an action: list, kill, restart, partition, xid, ecc, offbus or interrupt")
			}
			action := args[0]
			req := chaosRequest{Action: action, GPU: *gpu, XID: *xid, In: *in, For: *forDur}
			node := "all"
			switch action {
			case "list":
				if len(args) != 1 {
					return usagef("list takes no node")
				}
			case "kill", "restart", "partition", "xid", "ecc", "offbus", "interrupt":
				if len(args) != 2 {
					return usagef("%s needs one node id (see shizu chaos list)", action)
				}
				node = args[1]
				if err := subject.Token(node); err != nil {
					return usagef("node id: %v", err)
				}
			default:
				return usagef("unknown action %q: want list, kill, restart, partition, xid, ecc, offbus or interrupt", action)
			}
			if *gpu < 0 || *xid <= 0 {
				return usagef("-gpu %d and -xid %d must be non-negative and positive", *gpu, *xid)
			}
			if *forDur < time.Second || *forDur > time.Hour {
				return usagef("-for %s: a partition lasts from 1s to 1h", *forDur)
			}
			conn, _, err := cf.connect(ctx)
			if err != nil {
				return err
			}
			defer conn.Close(context.WithoutCancel(ctx))
			data, _ := json.Marshal(req)
			rctx, cancel := context.WithTimeout(ctx, cf.timeout+30*time.Second) // a kill waits for the agent to stop
			defer cancel()
			msg, err := conn.NATS().RequestWithContext(rctx, fmt.Sprintf(chaosSubject, node), data)
			if err != nil {
				if errors.Is(err, nats.ErrNoResponders) {
					return errors.New("no `shizu dev` answers chaos requests on this server: chaos works only on shizu dev's simulated fleet")
				}
				return fmt.Errorf("chaos request: %w", err)
			}
			var reply chaosReply
			if err := json.Unmarshal(msg.Data, &reply); err != nil {
				return fmt.Errorf("chaos reply: %w", err)
			}
			if !reply.OK {
				return errors.New(reply.Error)
			}
			if cf.output == "json" {
				return printJSON(stdout, reply)
			}
			if action == "list" {
				tw := table(stdout)
				fmt.Fprintln(tw, "NODE\tPROFILE\tMARKET\tAGENT")
				for _, n := range reply.Nodes {
					state := "running"
					if !n.Running {
						state = "stopped"
					} else if n.Partitioned {
						state = "running, partitioned"
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", n.ID, n.Profile, n.Market, state)
				}
				return tw.Flush()
			}
			fmt.Fprintln(stdout, reply.Message)
			return nil
		}
	},
}
