package testkit

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisInstallHint is the fix printed when redis-server is not on PATH.
const RedisInstallHint = "install it with: apt-get install -y redis-server (Debian/Ubuntu)"

// Redis is a redis-server child process owned by one test.
type Redis struct {
	Addr string
	cmd  *exec.Cmd
}

// StartRedis starts a real redis-server on a random loopback port with no
// persistence (no RDB snapshots, no AOF) and a temporary working directory.
// It fails the test, with the install command, when redis-server is missing.
func StartRedis(t testing.TB) *Redis {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("testkit: redis-server not found on PATH: %s", RedisInstallHint)
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port := freePort(t)
		r, err := startRedisOn(t, bin, port)
		if err == nil {
			return r
		}
		lastErr = err // most likely the port was taken between probe and bind
	}
	t.Fatalf("testkit: start redis-server: %v", lastErr)
	return nil
}

func startRedisOn(t testing.TB, bin string, port int) (*Redis, error) {
	cmd := exec.Command(bin,
		"--bind", "127.0.0.1", "--port", strconv.Itoa(port),
		"--save", "", "--appendonly", "no",
		"--dir", t.TempDir(), "--daemonize", "no", "--loglevel", "warning")
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	// waitErr is read only after exited is closed.
	var waitErr error
	exited := make(chan struct{})
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	r := &Redis{Addr: fmt.Sprintf("127.0.0.1:%d", port), cmd: cmd}
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			break
		}
		select {
		case <-exited:
			return nil, fmt.Errorf("redis-server on port %d exited: %w", port, waitErr)
		default:
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			return nil, fmt.Errorf("redis-server on port %d did not answer PING within 10s: %w", port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	return r, nil
}

// Client returns a go-redis client for this server, closed by t.Cleanup.
func (r *Redis) Client(t testing.TB) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// Restart kills the server and starts a fresh, empty one on the same port,
// simulating the loss of Redis (no persistence).
func (r *Redis) Restart(t testing.TB) {
	t.Helper()
	_ = r.cmd.Process.Kill()
	port, _ := strconv.Atoi(r.Addr[len("127.0.0.1:"):])
	bin, _ := exec.LookPath("redis-server")
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		var nr *Redis
		if nr, err = startRedisOn(t, bin, port); err == nil {
			r.cmd = nr.cmd
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("testkit: restart redis-server on %s: %v", r.Addr, err)
}
