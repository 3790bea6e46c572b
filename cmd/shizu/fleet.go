package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	nodeagent "github.com/shizu-gpu/shizu/services/node-agent/app"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// defaultFleet covers every kind of rental: NVLink (h100x8, a100x8), MIG
// slices (h100x8-mig), PCIe-only consumer cards (rtx4090x8) and TEE
// (h200x8).
const defaultFleet = "h100x8:1,h100x8-mig:1,a100x8:1,rtx4090x8:1,h200x8:1"

// fleetNode is one simulated GPU host of `shizu dev`.
type fleetNode struct {
	ID      string
	Profile string
	Market  string // on-demand or spot
}

// parseFleet reads "h100x8:2,a100x8:1,rtx4090x8:2:spot": profile, count,
// optional market. Nodes are named <profile>-<n> (with -spot for spot
// nodes), numbered per profile and market from 1.
func parseFleet(spec string) ([]fleetNode, error) {
	var out []fleetNode
	seen := map[string]int{}
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		fields := strings.Split(part, ":")
		if len(fields) > 3 {
			return nil, fmt.Errorf("fleet %q: want profile[:count[:market]], e.g. h100x8:2 or rtx4090x8:1:spot", part)
		}
		profile := fields[0]
		if !slices.Contains(nodeagent.SimulatedProfiles(), profile) {
			return nil, fmt.Errorf("fleet %q: unknown profile %q; profiles: %s", part, profile, strings.Join(nodeagent.SimulatedProfiles(), ", "))
		}
		count := 1
		if len(fields) > 1 {
			n, err := strconv.Atoi(fields[1])
			if err != nil || n < 0 || n > 64 {
				return nil, fmt.Errorf("fleet %q: count %q is not a number of nodes 0..64", part, fields[1])
			}
			count = n
		}
		market := "on-demand"
		if len(fields) > 2 {
			if fields[2] != "on-demand" && fields[2] != "spot" {
				return nil, fmt.Errorf("fleet %q: market %q, want on-demand or spot", part, fields[2])
			}
			market = fields[2]
		}
		prefix := profile
		if market == "spot" {
			prefix += "-spot"
		}
		for range count {
			seen[prefix]++
			out = append(out, fleetNode{ID: fmt.Sprintf("%s-%d", prefix, seen[prefix]), Profile: profile, Market: market})
		}
	}
	if len(out) > 64 {
		return nil, fmt.Errorf("fleet of %d nodes: at most 64 run in one process", len(out))
	}
	return out, nil
}

// fleetRunner runs the simulated node agents of `shizu dev`, each with its
// own node id, state folder and simulated GPUs, and lets chaos stop,
// restart and break them.
type fleetRunner struct {
	log *slog.Logger

	mu     sync.Mutex
	agents map[string]*runningAgent
	order  []string
}

type runningAgent struct {
	node   fleetNode
	cfg    nodeagent.Config
	host   *nodeagent.SimulatedHost // its GPUs, while the agent runs: chaos breaks them
	cancel context.CancelFunc
	done   chan struct{}
	err    error
	// links are the node's network paths to NATS and Redis, which chaos
	// partition cuts; heal ends the partition in progress.
	links             *nodeLinks
	natsURL, redisURL string // through the links
	heal              *time.Timer
}

func newFleetRunner(nodes []fleetNode, base func(fleetNode) nodeagent.Config, log *slog.Logger) (*fleetRunner, error) {
	r := &fleetRunner{agents: map[string]*runningAgent{}, log: log}
	for _, n := range nodes {
		if err := r.add(n, base(n)); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// add adds a node (not started) to the fleet.
func (r *fleetRunner) add(n fleetNode, cfg nodeagent.Config) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("node %s: %w", n.ID, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.agents[n.ID] != nil {
		return fmt.Errorf("node %s exists", n.ID)
	}
	r.agents[n.ID] = &runningAgent{node: n, cfg: cfg}
	r.order = append(r.order, n.ID)
	return nil
}

// remove stops a node's agent, if it runs, and forgets the node.
func (r *fleetRunner) remove(id string) {
	_ = r.stop(id)
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.agents, id)
	r.order = slices.DeleteFunc(r.order, func(s string) bool { return s == id })
}

// ids lists every node of the fleet, in order.
func (r *fleetRunner) ids() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.order)
}

// start starts a node's agent (with fresh, healthy GPUs) unless it runs.
func (r *fleetRunner) start(ctx context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	a := r.agents[id]
	if a == nil {
		return fmt.Errorf("no simulated node %q", id)
	}
	if a.cancel != nil {
		return fmt.Errorf("node %s is already running", id)
	}
	// Seeded by the node id, a restarted node shows the same GPUs.
	host, err := nodeagent.NewSimulatedHost(a.node.Profile, a.node.ID)
	if err != nil {
		return err
	}
	cfg := a.cfg
	cfg.Simulated = host
	// The agent reaches NATS and Redis through the node's links, so that
	// chaos can cut it off the network without stopping it.
	if a.links == nil {
		links, natsURL, redisURL, err := newNodeLinks(a.cfg.Service.NATS.URL, a.cfg.Service.RedisURL)
		if err != nil {
			return fmt.Errorf("node %s: %w", id, err)
		}
		a.links, a.natsURL, a.redisURL = links, natsURL, redisURL
	}
	cfg.Service.NATS.URL, cfg.Service.RedisURL = a.natsURL, a.redisURL
	actx, cancel := context.WithCancel(ctx)
	a.host, a.cancel, a.done, a.err = host, cancel, make(chan struct{}), nil
	done := a.done
	go func() {
		defer close(done)
		err := nodeagent.Run(actx, cfg)
		r.mu.Lock()
		defer r.mu.Unlock()
		if err != nil && !errors.Is(err, context.Canceled) {
			r.log.Error("node agent stopped", "node", id, "err", err)
			a.err = err
		}
		if a.done == done { // ended by itself: it may be started again
			a.cancel, a.host = nil, nil
			cancel()
		}
	}()
	return nil
}

// stop stops a node's agent and waits for it; its heartbeat then expires
// and its workloads keep running, as on a host whose agent died.
func (r *fleetRunner) stop(id string) error {
	r.mu.Lock()
	a := r.agents[id]
	if a == nil {
		r.mu.Unlock()
		return fmt.Errorf("no simulated node %q", id)
	}
	if a.cancel == nil {
		r.mu.Unlock()
		return fmt.Errorf("node %s is not running", id)
	}
	cancel, done := a.cancel, a.done
	a.cancel, a.host = nil, nil
	r.mu.Unlock()
	cancel()
	<-done
	return nil
}

func (r *fleetRunner) stopAll() {
	for _, id := range r.ids() {
		_ = r.stop(id)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range r.agents {
		if a.heal != nil {
			a.heal.Stop()
		}
		if a.links != nil {
			a.links.close()
			a.links = nil
		}
	}
}

// partition cuts a running node off NATS and Redis for d: its connections
// drop, its heartbeats stop and its workloads keep running, so failover
// fences it and moves its rentals; then the links heal, the agent
// reconnects, finds itself fenced and stops what it must not run.
func (r *fleetRunner) partition(node string, d time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	a := r.agents[node]
	switch {
	case a == nil:
		return fmt.Errorf("no simulated node %q", node)
	case a.cancel == nil || a.links == nil:
		return fmt.Errorf("node %s is not running (shizu chaos restart %s)", node, node)
	case a.links.isCut():
		return fmt.Errorf("node %s is already partitioned", node)
	}
	links := a.links
	links.setCut(true)
	r.log.Warn("chaos: node partitioned", "node", node, "for", d)
	a.heal = time.AfterFunc(d, func() {
		links.setCut(false)
		r.log.Warn("chaos: node partition healed", "node", node)
	})
	return nil
}

// nodes lists the fleet in order with whether each agent runs.
func (r *fleetRunner) nodes() []chaosNode {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]chaosNode, 0, len(r.order))
	for _, id := range r.order {
		a := r.agents[id]
		out = append(out, chaosNode{ID: id, Profile: a.node.Profile, Market: a.node.Market, Running: a.cancel != nil, HTTP: a.cfg.Service.HTTPAddr,
			Partitioned: a.links != nil && a.links.isCut()})
	}
	return out
}

func (r *fleetRunner) failed(id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if a := r.agents[id]; a != nil {
		return a.err
	}
	return nil
}

// apply performs one chaos action.
func (r *fleetRunner) apply(ctx context.Context, node string, req chaosRequest) chaosReply {
	if req.Action == "list" {
		return chaosReply{OK: true, Nodes: r.nodes()}
	}
	fail := func(err error) chaosReply { return chaosReply{Error: err.Error()} }
	switch req.Action {
	case "kill", "restart", "partition", "xid", "ecc", "offbus", "interrupt":
	default:
		return fail(fmt.Errorf("unknown action %q: want list, kill, restart, partition, xid, ecc, offbus or interrupt", req.Action))
	}
	switch req.Action {
	case "kill":
		if err := r.stop(node); err != nil {
			return fail(err)
		}
		return chaosReply{OK: true, Message: fmt.Sprintf("node agent %s stopped: its heartbeat expires and failover moves its rentals", node)}
	case "partition":
		d := req.For
		if d <= 0 {
			d = 30 * time.Second
		}
		if err := r.partition(node, d); err != nil {
			return fail(err)
		}
		return chaosReply{OK: true, Message: fmt.Sprintf("node %s cut off NATS and Redis for %s: its heartbeats stop and its workloads keep running; "+
			"failover fences it and moves its rentals, and when it returns its agent stops what was fenced", node, d)}
	case "restart":
		if err := r.start(ctx, node); err != nil {
			return fail(err)
		}
		return chaosReply{OK: true, Message: fmt.Sprintf("node agent %s started with healthy GPUs: it registers again and stops workloads whose allocation was fenced", node)}
	}
	r.mu.Lock()
	a := r.agents[node]
	var f *nodeagent.SimulatedHost
	if a != nil {
		f = a.host
	}
	r.mu.Unlock()
	if a == nil {
		return fail(fmt.Errorf("no simulated node %q", node))
	}
	if f == nil {
		return fail(fmt.Errorf("node %s is not running (shizu chaos restart %s)", node, node))
	}
	var err error
	var msg string
	switch req.Action {
	case "xid":
		err = f.RaiseXID(req.GPU, req.XID)
		msg = fmt.Sprintf("Xid %d raised on %s GPU %d", req.XID, node, req.GPU)
	case "ecc":
		err = f.InjectECC(req.GPU, 0, 1)
		msg = fmt.Sprintf("uncorrected ECC error on %s GPU %d", node, req.GPU)
	case "offbus":
		err = f.FallOffBus(req.GPU)
		msg = fmt.Sprintf("%s GPU %d fell off the bus (Xid 79)", node, req.GPU)
	case "interrupt":
		in := req.In
		if in <= 0 {
			in = 30 * time.Second
		}
		err = f.NoticeInterruption(ctx, time.Now().Add(in), "shizu chaos interrupt")
		msg = fmt.Sprintf("spot interruption notice on %s, reclaimed in %s", node, in)
	default:
		err = fmt.Errorf("unknown action %q", req.Action)
	}
	if err != nil {
		return fail(err)
	}
	return chaosReply{OK: true, Message: msg}
}

// serveChaos answers chaos requests on nc until ctx ends.
func (r *fleetRunner) serveChaos(ctx context.Context, nc *nats.Conn) (*nats.Subscription, error) {
	return nc.Subscribe(chaosSubjectAll, func(m *nats.Msg) {
		node := strings.TrimPrefix(m.Subject, strings.TrimSuffix(chaosSubjectAll, "*"))
		var req chaosRequest
		reply := chaosReply{}
		if err := json.Unmarshal(m.Data, &req); err != nil {
			reply.Error = "bad request: " + err.Error()
		} else if err := subject.Token(node); err != nil && req.Action != "list" {
			reply.Error = err.Error()
		} else {
			reply = r.apply(ctx, node, req)
		}
		data, _ := json.Marshal(reply)
		_ = m.Respond(data)
	})
}

// leftWorkloads counts the workloads a node agent left running under
// stateDir (its records in rentals/*.json name each process group and its
// start time, against pid reuse), and with kill ends them: an ephemeral
// `shizu dev` does at exit, as nothing will adopt them.
func leftWorkloads(stateDir string, kill bool) int {
	entries, err := os.ReadDir(filepath.Join(stateDir, "rentals"))
	if err != nil {
		return 0
	}
	killed := 0
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(stateDir, "rentals", e.Name()))
		if err != nil {
			continue
		}
		var rec struct {
			PID      int             `json:"pid"`
			PIDStart uint64          `json:"pid_start"`
			Exit     json.RawMessage `json:"exit"`
		}
		if json.Unmarshal(data, &rec) != nil || rec.PID <= 1 || (len(rec.Exit) > 0 && string(rec.Exit) != "null") {
			continue
		}
		if start, ok := procStart(rec.PID); !ok || start != rec.PIDStart {
			continue
		}
		if !kill || syscall.Kill(-rec.PID, syscall.SIGKILL) == nil {
			killed++
		}
	}
	return killed
}

// procStart reads a process's start time (field 22 of /proc/<pid>/stat).
func procStart(pid int) (uint64, bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	fields := strings.Fields(s[i+1:])
	if len(fields) < 20 {
		return 0, false
	}
	v, err := strconv.ParseUint(fields[19], 10, 64)
	return v, err == nil
}
