package benchkit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"

	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/quota"
	"github.com/shizu-gpu/shizu/shared/service"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Source is the EventMeta source of the events benchmarks publish.
const Source = "shizu-bench"

// Servers are what a benchmark runs on: a nats-server with JetStream and
// the platform's users (topology.Users), and a Redis. The caller starts
// and stops them (shared/benchkit/benchtest in go test, `shizu bench` its
// own), one set per benchmark run, so one run's events never reach
// another's consumers.
type Servers struct {
	NATSURL string
	// Password is the NATS password of a platform user.
	Password func(user string) string
	RedisURL string
	// Dir is a scratch directory a benchmark may write files to (a policy
	// file); the caller removes it.
	Dir string
}

// Env is a benchmark's connection to its Servers: the platform's streams
// provisioned, an admin bus connection and a Redis client. A zero Env
// (no servers) serves a benchmark of pure code, which only reports
// progress.
type Env struct {
	Servers
	Redis *redis.Client
	Admin *bus.Conn
	// Progress, when set, is told what a benchmark is doing and how far it
	// is (0..1).
	Progress func(phase string, frac float64)
}

// Open provisions the platform's streams and heartbeat bucket on s (as
// `shizu provision` does, one replica) and connects to both servers.
func Open(ctx context.Context, s Servers) (*Env, error) {
	e := &Env{Servers: s}
	opts, err := redis.ParseURL(s.RedisURL)
	if err != nil {
		return nil, fmt.Errorf("benchkit: redis url: %w", err)
	}
	opts.PoolSize = 64
	e.Redis = redis.NewClient(opts)
	if e.Admin, err = e.Connect(ctx, topology.Admin); err != nil {
		_ = e.Redis.Close()
		return nil, err
	}
	if err := e.provision(ctx); err != nil {
		e.Close(ctx)
		return nil, err
	}
	return e, nil
}

func (e *Env) provision(ctx context.Context) error {
	if err := e.Redis.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("benchkit: redis: %w", err)
	}
	if err := e.Admin.EnsureStreams(ctx, topology.Streams(1)...); err != nil {
		return fmt.Errorf("benchkit: provision streams: %w", err)
	}
	if _, err := e.Admin.EnsureHeartbeats(ctx, topology.Heartbeats(1, 3*time.Second)); err != nil {
		return fmt.Errorf("benchkit: provision heartbeats: %w", err)
	}
	if _, err := quota.Ensure(ctx, e.Admin.JetStream(), 1); err != nil {
		return fmt.Errorf("benchkit: provision quotas: %w", err)
	}
	return nil
}

// Close closes the env's connections (not the servers).
func (e *Env) Close(ctx context.Context) {
	if e.Admin != nil {
		_ = e.Admin.Close(context.WithoutCancel(ctx))
	}
	if e.Redis != nil {
		_ = e.Redis.Close()
	}
}

// Step reports progress, when someone listens.
func (e *Env) Step(phase string, frac float64) {
	if e.Progress != nil {
		e.Progress(phase, frac)
	}
}

// BusConfig is the bus configuration of a platform user.
func (e *Env) BusConfig(user string) bus.Config {
	return bus.Config{URL: e.NATSURL, Name: "shizu-bench-" + user, User: user, Password: e.Password(user)}
}

// Connect opens a bus connection as a platform user.
func (e *Env) Connect(ctx context.Context, user string) (*bus.Conn, error) {
	return bus.Connect(ctx, e.BusConfig(user), bus.Instruments{})
}

// ServiceConfig is a service's common configuration on the env: its own
// NATS user, the env's Redis, a health endpoint on a free loopback port
// and its logs thrown away.
func (e *Env) ServiceConfig(name string) (service.Config, error) {
	c := service.Defaults(name)
	c.NATS = e.BusConfig(name)
	c.RedisURL = e.RedisURL
	port, err := freePort()
	if err != nil {
		return c, err
	}
	c.HTTPAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	c.LogLevel, c.LogFormat, c.LogWriter = "error", "text", io.Discard
	c.ShutdownTimeout = 10 * time.Second
	return c, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("benchkit: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Service is a service's Run going on in this process.
type Service struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// StartService calls run (a service's Run with its config) in the
// background until Stop.
func StartService(ctx context.Context, run func(context.Context) error) *Service {
	ctx, cancel := context.WithCancel(ctx)
	s := &Service{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		if err := run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			s.err = err
		}
	}()
	return s
}

// Exited is closed when the service's Run returned; Err says why.
func (s *Service) Exited() <-chan struct{} { return s.done }

// Err is what Run returned, once Exited is closed (nil for a clean stop).
func (s *Service) Err() error {
	select {
	case <-s.done:
		if s.err == nil {
			return errors.New("the service stopped")
		}
		return s.err
	default:
		return nil
	}
}

// Stop ends the service (a graceful shutdown) and waits for it.
func (s *Service) Stop() error {
	s.cancel()
	<-s.done
	return s.err
}

// WaitReady waits until the service at addr answers /readyz, it exits, or
// a minute passes.
func (s *Service) WaitReady(ctx context.Context, addr string) error {
	return WaitUntil(ctx, time.Minute, func() (bool, error) {
		if err := s.Err(); err != nil {
			return false, err
		}
		return service.Healthcheck(ctx, addr) == nil, nil
	})
}

// WaitUntil polls cond every 5 ms until it holds, it fails, ctx ends or
// limit passes.
func WaitUntil(ctx context.Context, limit time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not done within %s", limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// PublishAll publishes evs (evs[i] on subjects[i]) as the admin,
// asynchronously, every ack awaited.
func (e *Env) PublishAll(ctx context.Context, subjects []string, evs []proto.Message) error {
	batch := e.Admin.NewBatch()
	for i, ev := range evs {
		if err := batch.Publish(ctx, subjects[i], ev); err != nil {
			return err
		}
		if i%5000 == 4999 {
			if _, err := batch.Wait(ctx); err != nil {
				return err
			}
			batch = e.Admin.NewBatch()
		}
	}
	_, err := batch.Wait(ctx)
	return err
}
