package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

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
	// Closed once redis-server has been reaped; its exit status after
	// our own signal says nothing the caller needs.
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
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
