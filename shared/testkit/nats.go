// Package testkit starts the real servers Shizu's tests talk to: an in-process
// nats-server with JetStream (single node or a 3-node cluster) and a
// redis-server child process. Every server listens on a random loopback port,
// keeps its state in a temporary directory and is stopped by t.Cleanup, so
// package tests are hermetic and run in parallel.
package testkit

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shizu-gpu/shizu/shared/embednats"
)

// NATS is a running in-process nats-server with JetStream enabled.
type NATS struct {
	Server *server.Server
	URL    string
	// opts are the options it started with, and port the port it listens
	// on, for Restart.
	opts *server.Options
	port int
}

// StartNATS starts a JetStream-enabled nats-server on a random loopback port
// with a temporary store directory. mutate, when given, may change the
// options (TLS, users, monitoring) before the server starts.
func StartNATS(t testing.TB, mutate ...func(*server.Options)) *NATS {
	t.Helper()
	opts := &server.Options{
		ServerName: "shizu-test",
		Host:       "127.0.0.1",
		Port:       server.RANDOM_PORT,
		JetStream:  true,
		StoreDir:   t.TempDir(),
		NoLog:      true,
		NoSigs:     true,
	}
	for _, m := range mutate {
		m(opts)
	}
	ns, err := embednats.Start(opts, 10*time.Second)
	if err != nil {
		t.Fatalf("testkit: %v", err)
	}
	n := &NATS{Server: ns, URL: ns.ClientURL(), opts: opts.Clone(), port: ns.Addr().(*net.TCPAddr).Port}
	// The server running at cleanup (Restart may have replaced it) stops
	// where the first one would have, after everything started later.
	t.Cleanup(func() {
		n.Server.Shutdown()
		n.Server.WaitForShutdown()
	})
	return n
}

// Connect opens a client connection to the server, closed by t.Cleanup.
func (n *NATS) Connect(t testing.TB, opts ...nats.Option) *nats.Conn {
	t.Helper()
	return connect(t, n.URL, opts...)
}

// JetStream opens a connection and returns its JetStream context.
func (n *NATS) JetStream(t testing.TB, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc := n.Connect(t, opts...)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("testkit: jetstream: %v", err)
	}
	return nc, js
}

func connect(t testing.TB, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("testkit: connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Cluster is a set of in-process nats-servers joined by routes on loopback.
type Cluster struct {
	Servers []*server.Server
	// URLs holds every member's client URL, for nats.Connect's server list.
	URLs []string
}

// URL returns a comma-separated list of every member, for nats.Connect.
func (c *Cluster) URL() string {
	s := ""
	for i, u := range c.URLs {
		if i > 0 {
			s += ","
		}
		s += u
	}
	return s
}

// Connect opens a client connection that knows every member of the cluster.
func (c *Cluster) Connect(t testing.TB, opts ...nats.Option) *nats.Conn {
	t.Helper()
	return connect(t, c.URL(), opts...)
}

// StartCluster starts size JetStream-enabled servers forming one cluster
// (routes on loopback, random ports) and waits until JetStream has a meta
// leader, so R3 streams can be created at once.
func StartCluster(t testing.TB, size int) *Cluster {
	t.Helper()
	if size < 2 {
		t.Fatalf("testkit: a cluster needs at least 2 servers, got %d", size)
	}
	routePorts := make([]int, size)
	for i := range routePorts {
		routePorts[i] = freePort(t)
	}
	routes := make([]string, size)
	for i, p := range routePorts {
		routes[i] = fmt.Sprintf("nats://127.0.0.1:%d", p)
	}
	c := &Cluster{}
	for i := range size {
		opts := &server.Options{
			ServerName: fmt.Sprintf("shizu-test-%d", i+1),
			Host:       "127.0.0.1",
			Port:       server.RANDOM_PORT,
			JetStream:  true,
			StoreDir:   t.TempDir(),
			NoLog:      true,
			NoSigs:     true,
			Cluster: server.ClusterOpts{
				Name: "shizu-test",
				Host: "127.0.0.1",
				Port: routePorts[i],
			},
			Routes: server.RoutesFromStr(joinOthers(routes, i)),
		}
		ns, err := server.NewServer(opts)
		if err != nil {
			t.Fatalf("testkit: configure cluster member %d: %v", i+1, err)
		}
		ns.Start()
		t.Cleanup(func() {
			ns.Shutdown()
			ns.WaitForShutdown()
		})
		c.Servers = append(c.Servers, ns)
	}
	for _, ns := range c.Servers {
		if !ns.ReadyForConnections(15 * time.Second) {
			t.Fatalf("testkit: cluster member %s not ready", ns.Name())
		}
		c.URLs = append(c.URLs, ns.ClientURL())
	}
	Eventually(t, 20*time.Second, func() error {
		for _, ns := range c.Servers {
			if ns.NumRoutes() < size-1 {
				return fmt.Errorf("%s has %d routes, want %d", ns.Name(), ns.NumRoutes(), size-1)
			}
			if !ns.JetStreamIsClustered() {
				return fmt.Errorf("%s: jetstream not clustered yet", ns.Name())
			}
		}
		for _, ns := range c.Servers {
			if ns.JetStreamIsLeader() {
				return nil
			}
		}
		return fmt.Errorf("no jetstream meta leader yet")
	})
	return c
}

func joinOthers(routes []string, skip int) string {
	s := ""
	for i, r := range routes {
		if i == skip {
			continue
		}
		if s != "" {
			s += ","
		}
		s += r
	}
	return s
}

// freePort asks the kernel for a free loopback port. The port is released
// before it is returned, so a race with another process is possible but
// rare; the servers started here fail loudly when it happens.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testkit: find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
