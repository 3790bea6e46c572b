package app_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Real node agents for the scheduler's tests: the node-agent binary of
// this workspace, built once per test binary (it links go-nvml: cgo and
// a C compiler), run as a child process on a simulated host. The
// scheduler's module does not import the agent; it only runs it.

// buildAgent is the workspace's node-agent binary, built once per test
// binary run.
func buildAgent(t testing.TB) string {
	return testkit.GoBuild(t, "github.com/shizu-gpu/shizu/services/node-agent/cmd/node-agent")
}

// startAgent runs a node agent for node on the simulated host profile
// (see node-agent -simulate); its workloads run until they are stopped.
// It waits until the node is registered and ready, and stops the agent at
// cleanup.
func (e *env) startAgent(node, profile string) {
	t := e.t
	t.Helper()
	dir := t.TempDir()
	script := filepath.Join(dir, "workload.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nwhile kill -0 $PPID 2>/dev/null; do sleep 0.2; done\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	logs, err := os.Create(filepath.Join(dir, "agent.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(buildAgent(t), "-simulate", profile, "-node-id", node, "-state-dir", filepath.Join(dir, "state"),
		"-default-command", script, "-telemetry-interval", "30s", "-http-addr=", "-stop-grace", "1s")
	cmd.Env = append(os.Environ(), "SHIZU_NATS_URL="+e.NATS.URL, "SHIZU_NATS_USER="+topology.NodeAgent,
		"SHIZU_NATS_PASSWORD="+testkit.Password(topology.NodeAgent), "SHIZU_REDIS_URL="+e.RedisURL(),
		"SHIZU_LOG_LEVEL=info", "SHIZU_LOG_FORMAT=text")
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		_ = logs.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logs.Name()); err == nil {
				t.Logf("agent %s log:\n%s", node, b)
			}
		}
	})
	testkit.Eventually(t, 60*time.Second, func() error {
		n, err := e.store.Node(t.Context(), node)
		if err != nil {
			return err
		}
		if n.Status != capacity.StatusReady {
			return fmt.Errorf("node %s is %s", node, n.Status)
		}
		return nil
	})
}

// stops collects the RentalStopped events of the RENTALS stream by rental
// (the agents publish them).
type stops struct {
	mu sync.Mutex
	by map[string][]*shizuv1.RentalStopped
}

func (e *env) watchStops() *stops {
	s := &stops{by: map[string][]*shizuv1.RentalStopped{}}
	cons, err := e.Admin.JetStream().OrderedConsumer(e.t.Context(), topology.StreamRentals,
		jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject.RentalStoppedAll}})
	if err != nil {
		e.t.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		ev := &shizuv1.RentalStopped{}
		if err := proto.Unmarshal(m.Data(), ev); err != nil {
			e.t.Errorf("decode %s: %v", m.Subject(), err)
			return
		}
		s.mu.Lock()
		s.by[ev.GetRentalId()] = append(s.by[ev.GetRentalId()], ev)
		s.mu.Unlock()
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(cc.Stop)
	return s
}

func (s *stops) of(id string) []*shizuv1.RentalStopped {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*shizuv1.RentalStopped(nil), s.by[id]...)
}
