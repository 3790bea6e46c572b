package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shizu-gpu/shizu/shared/subject"
)

// chaosRequest is what `shizu chaos` sends on shizu.dev.chaos.<node>.
type chaosRequest struct {
	Action string `json:"action"` // kill, restart, partition, xid, ecc, offbus, interrupt, list
	GPU    int    `json:"gpu,omitempty"`
	XID    int    `json:"xid,omitempty"`
	// In is how long until a spot interruption takes the node.
	In time.Duration `json:"in,omitempty"`
	// For is how long a partition lasts.
	For time.Duration `json:"for,omitempty"`
}

type chaosNode struct {
	ID      string `json:"node_id"`
	Profile string `json:"profile"`
	Market  string `json:"market"`
	Running bool   `json:"running"`
	// Partitioned: cut off NATS and Redis by chaos partition.
	Partitioned bool   `json:"partitioned,omitempty"`
	HTTP        string `json:"http"`
}

type chaosReply struct {
	OK      bool        `json:"ok"`
	Message string      `json:"message,omitempty"`
	Error   string      `json:"error,omitempty"`
	Nodes   []chaosNode `json:"nodes,omitempty"`
}

// chaosSubject is the request subject `shizu dev` answers for a node;
// only the admin user may publish on it (every service user's permissions
// are limited to its own subjects).
const (
	chaosSubject    = "shizu.dev.chaos.%s"
	chaosSubjectAll = "shizu.dev.chaos.*"
)

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
			node, err := chaosTarget(args)
			if err != nil {
				return err
			}
			if *gpu < 0 || *xid <= 0 {
				return usagef("-gpu %d and -xid %d must be non-negative and positive", *gpu, *xid)
			}
			if *forDur < time.Second || *forDur > time.Hour {
				return usagef("-for %s: a partition lasts from 1s to 1h", *forDur)
			}
			req := chaosRequest{Action: args[0], GPU: *gpu, XID: *xid, In: *in, For: *forDur}
			reply, err := sendChaos(ctx, &cf, node, req)
			if err != nil {
				return err
			}
			if cf.output == "json" {
				return printJSON(stdout, reply)
			}
			if req.Action == "list" {
				return printChaosNodes(stdout, reply.Nodes)
			}
			fmt.Fprintln(stdout, reply.Message)
			return nil
		}
	},
}

// chaosTarget checks a chaos command line (action, then a node id unless
// the action is list) and returns the node the request is for: "all" for
// list.
func chaosTarget(args []string) (string, error) {
	if len(args) == 0 {
		return "", usagef("want an action: list, kill, restart, partition, xid, ecc, offbus or interrupt")
	}
	switch action := args[0]; action {
	case "list":
		if len(args) != 1 {
			return "", usagef("list takes no node")
		}
		return "all", nil
	case "kill", "restart", "partition", "xid", "ecc", "offbus", "interrupt":
		if len(args) != 2 {
			return "", usagef("%s needs one node id (see shizu chaos list)", action)
		}
		if err := subject.Token(args[1]); err != nil {
			return "", usagef("node id: %w", err)
		}
		return args[1], nil
	default:
		return "", usagef("unknown action %q: want list, kill, restart, partition, xid, ecc, offbus or interrupt", action)
	}
}

// sendChaos asks the running `shizu dev` to perform req on node.
func sendChaos(ctx context.Context, cf *clientFlags, node string, req chaosRequest) (chaosReply, error) {
	conn, _, err := cf.connect(ctx)
	if err != nil {
		return chaosReply{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	data, _ := json.Marshal(req)
	rctx, cancel := context.WithTimeout(ctx, cf.timeout+30*time.Second) // a kill waits for the agent to stop
	defer cancel()
	msg, err := conn.NATS().RequestWithContext(rctx, fmt.Sprintf(chaosSubject, node), data)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return chaosReply{}, errors.New("no `shizu dev` answers chaos requests on this server: chaos works only on shizu dev's simulated fleet")
		}
		return chaosReply{}, fmt.Errorf("chaos request: %w", err)
	}
	var reply chaosReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return chaosReply{}, fmt.Errorf("chaos reply: %w", err)
	}
	if !reply.OK {
		return chaosReply{}, errors.New(reply.Error)
	}
	return reply, nil
}

// printChaosNodes prints the simulated nodes and whether each agent runs.
func printChaosNodes(w io.Writer, nodes []chaosNode) error {
	tw := table(w)
	fmt.Fprintln(tw, "NODE\tPROFILE\tMARKET\tAGENT")
	for _, n := range nodes {
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
