package testkit

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shizu-gpu/shizu/shared/topology"
)

// natsServerPkg is the pinned nats-server module's main package (v2.15.2,
// in shared/go.mod and cmd/shizu/go.mod); Debian's nats-server is 2.9,
// too old for the per-key TTLs the heartbeat bucket uses.
const natsServerPkg = "github.com/nats-io/nats-server/v2"

// NATSProcess is a nats-server child process configured as deploy/nats
// configures it: JetStream on a file store fsynced before every ack
// (sync_interval: always), the topology's users (topology.UsersConf, with
// Password as every password) and the system account with the failover
// advisory user. Unlike StartNATS's in-process server it can be SIGKILLed:
// the fault harness (cmd/shizu/faults) is the one place that needs it.
type NATSProcess struct {
	// URL is the client URL, the same across Kill and Start.
	URL string
	// Dir holds the configuration, the store (Dir/store) and the log
	// (Dir/nats-server.log).
	Dir string

	bin, conf string
	port      int
	proc      serverProcess
	log       *os.File
}

// StartNATSProcess builds the pinned nats-server (once per test binary),
// writes its configuration into dir and starts it on a free loopback port.
// The process is killed at cleanup.
func StartNATSProcess(t testing.TB, dir string) *NATSProcess {
	t.Helper()
	n := &NATSProcess{Dir: dir, bin: GoBuild(t, natsServerPkg), port: freePort(t)}
	n.URL = fmt.Sprintf("nats://127.0.0.1:%d", n.port)
	n.conf = filepath.Join(dir, "nats.conf")
	store := filepath.Join(dir, "store")
	conf := fmt.Sprintf("server_name: shizu-faults\nlisten: 127.0.0.1:%d\n"+
		"jetstream {\n  store_dir: %q\n  sync_interval: always\n}\ninclude \"users.conf\"\n", n.port, store)
	if err := os.WriteFile(n.conf, []byte(conf), 0o600); err != nil {
		t.Fatalf("testkit: nats config: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "users.conf"), []byte(topology.UsersConf()), 0o600); err != nil {
		t.Fatalf("testkit: nats users: %v", err)
	}
	var err error
	if n.log, err = os.OpenFile(filepath.Join(dir, "nats-server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
		t.Fatalf("testkit: nats log: %v", err)
	}
	n.Start(t)
	t.Cleanup(func() {
		n.Kill(t)
		_ = n.log.Close()
	})
	return n
}

// Start starts the server (again) on its port and store and waits until
// it accepts clients. After a Kill the old listener may take a moment to
// free the port, so a failed start is retried for a while.
func (n *NATSProcess) Start(t testing.TB) {
	t.Helper()
	if n.Running() {
		t.Fatalf("testkit: nats-server on %s is running already", n.URL)
	}
	env := os.Environ()
	for _, u := range append(topology.Users(), topology.SystemUsers()...) {
		env = append(env, topology.PasswordVar(u.Name)+"="+Password(u.Name))
	}
	err := n.proc.start(func() *exec.Cmd {
		cmd := exec.Command(n.bin, "-c", n.conf)
		cmd.Env, cmd.Stdout, cmd.Stderr = env, n.log, n.log
		return cmd
	}, n.waitReady)
	if err != nil {
		t.Fatalf("testkit: nats-server on %s (log %s): %v", n.URL, n.log.Name(), err)
	}
}

// waitReady waits until a client can connect as the admin user.
func (n *NATSProcess) waitReady(exited <-chan struct{}) error {
	return serving(exited, func() error {
		nc, err := nats.Connect(n.URL, nats.UserInfo(topology.Admin, Password(topology.Admin)), nats.Timeout(time.Second))
		if err == nil {
			nc.Close()
		}
		return err
	})
}

// Running reports whether the process is alive.
func (n *NATSProcess) Running() bool { return n.proc.running() }

// Kill SIGKILLs the server (no shutdown, no final fsync: what a crash
// does) and reaps it. Its store stays for Start.
func (n *NATSProcess) Kill(t testing.TB) {
	t.Helper()
	if !n.Running() {
		return
	}
	n.proc.kill()
	// Nothing may answer on the port until Start: the clients' reconnects
	// must fail, as they would against a dead host.
	for range 100 {
		c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(n.port)), 100*time.Millisecond)
		if err != nil {
			return
		}
		_ = c.Close()
		time.Sleep(10 * time.Millisecond)
	}
}
