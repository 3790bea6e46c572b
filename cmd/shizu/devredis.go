package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/shizu-gpu/shizu/shared/service"
)

// pickPort returns preferred when it is free on loopback, else a free port
// and a note saying so. preferred 0 asks for any free port.
func pickPort(preferred int, what string) (int, string) {
	if preferred > 0 {
		if l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(preferred))); err == nil {
			_ = l.Close()
			return preferred, ""
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return preferred, ""
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	if preferred == 0 {
		return port, ""
	}
	return port, fmt.Sprintf("port %d is taken (another %s?); %s uses %d", preferred, what, what, port)
}

// devRedis is the Redis `shizu dev` started: a redis-server child, or
// miniredis in process where none is installed.
type devRedis struct {
	url   string
	notes []string
	stop  func()
}

// startDevRedis starts Redis on port (a free one when taken) with its
// files in dir; persist keeps an append-only file there. The child's
// output goes to log (nil: discarded).
func startDevRedis(port int, dir string, persist bool, log io.Writer) (devRedis, error) {
	port, note := pickPort(port, "Redis")
	r := devRedis{notes: []string{note}}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		// A fresh machine may lack redis-server: serve the same protocol
		// in process, and say what that costs.
		mini := miniredis.NewMiniRedis()
		if err := mini.StartAddr(net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err != nil {
			return r, fmt.Errorf("embedded redis: %w", err)
		}
		r.url, r.stop = fmt.Sprintf("redis://%s/0", mini.Addr()), mini.Close
		r.notes = append(r.notes, "WARNING: redis-server is not installed, so Redis is embedded (miniredis): "+
			"in memory only, slower, key TTLs do not expire; install it with apt-get install -y redis-server")
		return r, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return r, err
	}
	// Append-only file in the data folder: node agents re-register their
	// nodes on restart, but the allocations of running rentals (which the
	// agents renew, and stop as zombies when missing) live only in Redis,
	// so a restarted `shizu dev` needs them back to keep its rentals.
	appendonly := "yes"
	if !persist {
		appendonly = "no"
	}
	cmd := exec.Command(bin, "--bind", "127.0.0.1", "--port", strconv.Itoa(port),
		"--save", "", "--appendonly", appendonly, "--appendfsync", "everysec", "--dir", dir, "--daemonize", "no", "--loglevel", "warning")
	if log == nil {
		log = io.Discard
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return r, fmt.Errorf("start redis-server: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	r.url = fmt.Sprintf("redis://127.0.0.1:%d/0", port)
	r.stop = func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	return r, nil
}

// pingRedis waits up to 10 s for the Redis at url to answer.
func pingRedis(ctx context.Context, url string) error {
	opts, err := redis.ParseURL(url)
	if err != nil {
		return fmt.Errorf("redis url: %w", err)
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := rdb.Ping(ctx).Err()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("redis at %s does not answer: %w", opts.Addr, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitReady waits up to 60 s for the health endpoint at addr to report
// ready; a failure on failed ends the wait.
func waitReady(ctx context.Context, addr string, failed <-chan error) error {
	deadline := time.NewTimer(60 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if service.Healthcheck(ctx, addr) == nil {
			return nil
		}
		select {
		case err := <-failed:
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return errors.New("not ready after 60s")
		case <-tick.C:
		}
	}
}

func randomPassword() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
