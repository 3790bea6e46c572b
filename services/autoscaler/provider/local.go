package provider

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// LocalConfig configures the local provider.
type LocalConfig struct {
	// Binary is the node-agent executable.
	Binary string
	// Profiles maps an instance type to the simulated GPU profile passed
	// as -simulate (e.g. "p5.48xlarge" -> "h100x8").
	Profiles map[string]string
	// Env is added to each agent's environment (SHIZU_NATS_URL,
	// SHIZU_NATS_USER, SHIZU_NATS_PASSWORD, SHIZU_REDIS_URL, ...).
	Env map[string]string
	// NodePrefix starts every node id (default "sim").
	NodePrefix string
	// SpotCapacity bounds the spot nodes running at once, to simulate a
	// spot shortage; negative means unlimited.
	SpotCapacity int
	// Output receives the agents' stdout and stderr (default discarded).
	Output io.Writer
	// StopGrace is how long an agent gets between SIGTERM and SIGKILL
	// (default 10 s).
	StopGrace time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Local runs each node as a simulated node-agent child process:
// `<binary> -simulate <profile> -node-id <id>`.
type Local struct {
	cfg   LocalConfig
	mu    sync.Mutex
	seq   int
	nodes map[string]*child
}

type child struct {
	node Node
	cmd  *exec.Cmd
	done chan struct{}
}

// NewLocal checks cfg and returns a local provider.
func NewLocal(cfg LocalConfig) (*Local, error) {
	var errs []error
	if cfg.Binary == "" {
		errs = append(errs, errors.New("local provider: binary: required (path of the node-agent executable)"))
	} else if _, err := exec.LookPath(cfg.Binary); err != nil {
		errs = append(errs, fmt.Errorf("local provider: binary: %w", err))
	}
	if len(cfg.Profiles) == 0 {
		errs = append(errs, errors.New("local provider: profiles: at least one instance type"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.NodePrefix == "" {
		cfg.NodePrefix = "sim"
	}
	if cfg.StopGrace <= 0 {
		cfg.StopGrace = 10 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Output == nil {
		cfg.Output = io.Discard
	}
	return &Local{cfg: cfg, nodes: map[string]*child{}}, nil
}

// Provision starts n agents; if one fails to start, those started are
// stopped again and the error returned.
func (l *Local) Provision(ctx context.Context, instanceType string, market Market, zone string, n int) ([]string, error) {
	if err := CheckCount(n); err != nil {
		return nil, err
	}
	profile, ok := l.cfg.Profiles[instanceType]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownInstanceType, instanceType)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l.mu.Lock()
	if market == Spot && l.cfg.SpotCapacity >= 0 {
		spot := 0
		for _, c := range l.nodes {
			if c.node.Market == Spot {
				spot++
			}
		}
		if spot+n > l.cfg.SpotCapacity {
			l.mu.Unlock()
			return nil, fmt.Errorf("%w: %d spot nodes asked, %d of %d in use", ErrInsufficientCapacity, n, spot, l.cfg.SpotCapacity)
		}
	}
	var started []*child
	var err error
	for range n {
		l.seq++
		id := fmt.Sprintf("%s-%s-%d", l.cfg.NodePrefix, sanitize(instanceType), l.seq)
		var c *child
		c, err = l.start(id, profile, Node{ID: id, InstanceType: instanceType, Market: market, Zone: zone, CreatedAt: l.cfg.Now()})
		if err != nil {
			break
		}
		l.nodes[id] = c
		started = append(started, c)
	}
	l.mu.Unlock()
	if err != nil {
		for _, c := range started {
			_ = l.Release(context.WithoutCancel(ctx), c.node.ID)
		}
		return nil, err
	}
	ids := make([]string, len(started))
	for i, c := range started {
		ids[i] = c.node.ID
	}
	return ids, nil
}

func (l *Local) start(id, profile string, node Node) (*child, error) {
	cmd := exec.Command(l.cfg.Binary, "-simulate", profile, "-node-id", id)
	env := os.Environ()
	keys := make([]string, 0, len(l.cfg.Env))
	for k := range l.cfg.Env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		env = append(env, k+"="+l.cfg.Env[k])
	}
	env = append(env, "SHIZU_NODE_ZONE="+node.Zone, "SHIZU_NODE_MARKET="+string(node.Market),
		"SHIZU_NODE_INSTANCE_TYPE="+node.InstanceType)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = l.cfg.Output, l.cfg.Output
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start node-agent %s: %w", id, err)
	}
	c := &child{node: node, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

// Release sends SIGTERM, waits up to StopGrace (or ctx), then kills.
func (l *Local) Release(ctx context.Context, node string) error {
	l.mu.Lock()
	c, ok := l.nodes[node]
	delete(l.nodes, node)
	l.mu.Unlock()
	if !ok {
		return nil
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	timer := time.NewTimer(l.cfg.StopGrace)
	defer timer.Stop()
	select {
	case <-c.done:
		return nil
	case <-timer.C:
	case <-ctx.Done():
	}
	_ = c.cmd.Process.Kill()
	<-c.done
	return nil
}

// List returns the nodes whose agents were started and not released. An
// agent that exited by itself is still listed until released, so the
// fleet notices it never registered (or was lost) and releases it.
func (l *Local) List(context.Context) ([]Node, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Node, 0, len(l.nodes))
	for _, c := range l.nodes {
		out = append(out, c.node)
	}
	slices.SortFunc(out, func(a, b Node) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// Close releases every node.
func (l *Local) Close(ctx context.Context) error {
	nodes, _ := l.List(ctx)
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Go(func() { _ = l.Release(ctx, n.ID) })
	}
	wg.Wait()
	return nil
}

// sanitize keeps a node id a subject token: letters, digits and '-'.
func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '-'
	}, s)
}
