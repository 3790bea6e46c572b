package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/redis/go-redis/v9"

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
			word := enumText(m.GetHealth())
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
			h.last[m.GetNodeId()] = fmt.Sprintf("lost: %s (epoch %d fenced)", enumText(m.GetReason()), m.GetFencedEpoch())
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
			if free.Health != "" {
				gh = string(free.Health) // the store's mark is what placement obeys
			}
			// Free is what a rental could get: nothing on a GPU that is not
			// healthy or on a node that takes no new work (draining, dead).
			takes := free.Healthy() && n.Status == capacity.StatusReady
			freeMilli, freeVRAM := free.Milli, free.VRAMMiB
			if !takes {
				freeMilli, freeVRAM = 0, 0
			}
			gv := gpuView{Index: g.Index, Model: g.Model, UsedMilli: capacity.MilliPerGPU - free.Milli, VRAMMiB: g.VRAMMiB,
				FreeVRAM: freeVRAM, Sharers: free.Sharers, Health: gh, Rentals: users[g.Index], Utilization: -1, VRAMUsed: -1}
			if tel := telemetry[n.ID]; tel != nil && uint64(tel.GetEpoch()) == n.Epoch {
				for _, s := range tel.GetGpus() {
					if int(s.GetGpuIndex()) == g.Index {
						gv.Utilization, gv.VRAMUsed = s.GetUtilizationPercent(), s.GetVramUsedMib()
					}
				}
			}
			v.GPUs = append(v.GPUs, gv)
			v.FreeMilli += freeMilli
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
				return usagef("-redis-url: %w", err)
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
