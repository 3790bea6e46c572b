package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/redis/go-redis/v9"

	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/telemetry"
)

// Runtime holds the parts a running service uses. Start builds them in
// order; Close tears them down in reverse.
type Runtime struct {
	Config    Config
	Telemetry *telemetry.Telemetry
	Log       *slog.Logger
	Bus       *bus.Conn
	// Redis is nil when the service has no Redis URL.
	Redis *redis.Client

	ready   atomic.Bool
	httpSrv *http.Server
	httpLn  net.Listener
}

// Start validates cfg and brings up telemetry, the HTTP endpoint (not
// ready yet), the bus and Redis. Failing to reach NATS or Redis within
// ctx is an error that says which and where.
func Start(ctx context.Context, cfg Config) (rt *Runtime, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%s config:\n%w", cfg.Name, err)
	}
	tel, err := telemetry.Setup(ctx, cfg.telemetry())
	if err != nil {
		return nil, err
	}
	rt = &Runtime{Config: cfg, Telemetry: tel, Log: tel.Logger()}
	defer func() {
		if err != nil {
			closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = rt.Close(closeCtx)
		}
	}()
	if cfg.HTTPAddr != "" {
		if err := rt.serveHTTP(); err != nil {
			return rt, err
		}
	}
	natsCfg := cfg.NATS
	if natsCfg.Name == "" {
		natsCfg.Name = cfg.Name
	}
	rt.Bus, err = bus.Connect(ctx, natsCfg, bus.Instruments{
		Tracer: tel.TracerProvider(), Meter: tel.MeterProvider(), Propagator: tel.Propagator(), Logger: rt.Log})
	if err != nil {
		return rt, err
	}
	if cfg.RedisURL != "" {
		if rt.Redis, err = connectRedis(ctx, cfg.RedisURL, rt.Log); err != nil {
			return rt, err
		}
		if err := telemetry.InstrumentRedis(rt.Redis, tel.TracerProvider(), tel.MeterProvider()); err != nil {
			return rt, err
		}
	}
	rt.Log.Info("service started", "nats", natsCfg.URL, "nats_user", natsCfg.User, "http", rt.HTTPAddr())
	return rt, nil
}

// connectRedis pings until Redis answers, with backoff, bounded by ctx
// (and by 30 s when ctx has no deadline).
func connectRedis(ctx context.Context, url string, log *slog.Logger) (*redis.Client, error) {
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redis.url: %w", err)
	}
	rdb := redis.NewClient(opts)
	eb := backoff.NewExponentialBackOff(backoff.WithInitialInterval(100*time.Millisecond),
		backoff.WithMaxInterval(2*time.Second), backoff.WithMaxElapsedTime(30*time.Second))
	err = backoff.RetryNotify(func() error { return rdb.Ping(ctx).Err() }, backoff.WithContext(eb, ctx),
		func(err error, next time.Duration) {
			log.Warn("redis not reachable yet", "addr", opts.Addr, "err", err, "retry_in", next)
		})
	if err != nil {
		_ = rdb.Close()
		return nil, fmt.Errorf("redis at %s: %w", opts.Addr, err)
	}
	return rdb, nil
}

// SetReady flips /readyz: a service is ready once its consumers run.
func (rt *Runtime) SetReady(ready bool) { rt.ready.Store(ready) }

// HTTPAddr is the address the health endpoint listens on ("" when off).
func (rt *Runtime) HTTPAddr() string {
	if rt.httpLn == nil {
		return ""
	}
	return rt.httpLn.Addr().String()
}

func (rt *Runtime) serveHTTP() error {
	ln, err := net.Listen("tcp", rt.Config.HTTPAddr)
	if err != nil {
		return fmt.Errorf("http.addr %s: %w", rt.Config.HTTPAddr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !rt.ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.Handle("GET /metrics", rt.Telemetry.MetricsHandler())
	rt.httpLn = ln
	rt.httpSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := rt.httpSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			rt.Log.Error("http server stopped", "err", err)
		}
	}()
	return nil
}

// Close marks the service not ready, drains the bus, closes Redis, stops
// the HTTP endpoint and flushes telemetry, in that order, within ctx.
func (rt *Runtime) Close(ctx context.Context) error {
	rt.SetReady(false)
	var errs []error
	if rt.Bus != nil {
		if err := rt.Bus.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("bus: %w", err))
		}
	}
	if rt.Redis != nil {
		if err := rt.Redis.Close(); err != nil {
			errs = append(errs, fmt.Errorf("redis: %w", err))
		}
	}
	if rt.httpSrv != nil {
		if err := rt.httpSrv.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("http: %w", err))
		}
	}
	if err := rt.Telemetry.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("telemetry: %w", err))
	}
	return errors.Join(errs...)
}

// Healthcheck GETs /readyz on addr (as given to -http-addr) and returns
// nil when the service answers ready; container health checks use it.
func Healthcheck(ctx context.Context, addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("http.addr: %w", err)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(host, port)+"/readyz", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("readyz: %s", resp.Status)
	}
	return nil
}
