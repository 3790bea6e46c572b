package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/shizu-gpu/shizu/shared/service"
)

// Run runs the gateway until ctx ends: it connects with its own NATS
// user, opens the replica (buckets, the keys' watched cache, the read
// model's projector), serves the API on cfg.Listen and reports ready on
// /readyz; at the end it stops taking calls, lets calls in flight finish
// within the shutdown timeout, and closes the bus.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	rt, err := service.Start(ctx, cfg.Service)
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer func() {
		closeCtx, done := context.WithTimeout(context.WithoutCancel(ctx), cfg.Service.ShutdownTimeout)
		defer done()
		_ = rt.Close(closeCtx)
	}()
	g, err := Open(runCtx, rt.Bus, cfg.Options, rt.Log, rt.Telemetry.MeterProvider())
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("gateway.listen %s: %w", cfg.Listen, err)
	}
	// Calls run in their own context, ended at shutdown so event streams
	// end at once while other calls finish.
	callCtx, endCalls := context.WithCancel(runCtx)
	defer endCalls()
	srv := &http.Server{Handler: g, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		BaseContext: func(net.Listener) context.Context { return callCtx }}
	srv.RegisterOnShutdown(endCalls)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	rt.SetReady(true)
	rt.Log.Info("gateway serving", "listen", ln.Addr().String())
	if cfg.OnListen != nil {
		cfg.OnListen(ln.Addr().String())
	}
	select {
	case <-ctx.Done():
	case err := <-served:
		if !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("gateway: serve: %w", err)
		}
	}
	rt.SetReady(false)
	shutCtx, done := context.WithTimeout(context.WithoutCancel(ctx), cfg.Service.ShutdownTimeout)
	defer done()
	err = srv.Shutdown(shutCtx)
	cancel()
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("gateway: shutdown: %w", err)
	}
	return nil
}
