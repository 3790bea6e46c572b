package testkit

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisProcess is a redis-server child process that can be SIGKILLed and
// started again on the same port and directory. With persistence it keeps
// an append-only file fsynced on every write (appendonly yes, appendfsync
// always), so a restart finds every acknowledged write; without it a
// restart starts empty, as StartRedis's Restart does.
type RedisProcess struct {
	// Addr is host:port, the same across Kill and Start.
	Addr string
	// Dir is the server's working directory (the AOF, the log).
	Dir string
	// Persistent says whether the server keeps an AOF.
	Persistent bool

	bin  string
	port int
	proc serverProcess
}

// StartRedisProcess starts redis-server on a free loopback port with its
// files in dir; it is killed at cleanup. A missing redis-server fails the
// test with the install command.
func StartRedisProcess(t testing.TB, dir string, persistent bool) *RedisProcess {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("testkit: redis-server not found on PATH: %s", RedisInstallHint)
	}
	r := &RedisProcess{Dir: dir, Persistent: persistent, bin: bin, port: freePort(t)}
	r.Addr = "127.0.0.1:" + strconv.Itoa(r.port)
	r.Start(t)
	t.Cleanup(func() { r.Kill(t) })
	return r
}

// URL is the server as a service's -redis-url.
func (r *RedisProcess) URL() string { return "redis://" + r.Addr + "/0" }

// Start starts the server (again) and waits until it answers PING; with
// persistence it has loaded its AOF by then.
func (r *RedisProcess) Start(t testing.TB) {
	t.Helper()
	if r.Running() {
		t.Fatalf("testkit: redis-server on %s is running already", r.Addr)
	}
	if !r.Persistent {
		// A restart without persistence starts empty: nothing may be
		// loaded from an earlier run's files.
		_ = os.Remove(filepath.Join(r.Dir, "dump.rdb"))
	}
	aof := "no"
	if r.Persistent {
		aof = "yes"
	}
	err := r.proc.start(func() *exec.Cmd {
		return exec.Command(r.bin, "--bind", "127.0.0.1", "--port", strconv.Itoa(r.port),
			"--save", "", "--appendonly", aof, "--appendfsync", "always", "--dir", r.Dir,
			"--daemonize", "no", "--loglevel", "warning", "--logfile", filepath.Join(r.Dir, "redis-server.log"))
	}, func(exited <-chan struct{}) error { return r.waitPing(t, exited) })
	if err != nil {
		t.Fatalf("testkit: redis-server on %s (log in %s): %v", r.Addr, r.Dir, err)
	}
}

func (r *RedisProcess) waitPing(t testing.TB, exited <-chan struct{}) error {
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1})
	defer rdb.Close()
	return serving(exited, func() error {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 500*time.Millisecond)
		defer cancel()
		return rdb.Ping(ctx).Err()
	})
}

// Running reports whether the process is alive.
func (r *RedisProcess) Running() bool { return r.proc.running() }

// Kill SIGKILLs the server and reaps it.
func (r *RedisProcess) Kill(t testing.TB) {
	t.Helper()
	r.proc.kill()
}
