package service

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shizu-gpu/shizu/shared/bus"
)

// Binary describes one service executable for Main.
type Binary struct {
	// Config is the common part of the service's configuration.
	Config *Config
	// Flags registers the service's own flags (may be nil).
	Flags func(fs *flag.FlagSet)
	// Validate checks the whole configuration after parsing.
	Validate func() error
	// Run runs the service until ctx ends.
	Run func(ctx context.Context) error
}

// Main is the body of every cmd/<service>/main.go: parse flags (defaults
// from the environment), then either check the configuration (-validate),
// probe a running instance (-healthcheck), or run until SIGINT/SIGTERM.
// It returns the process exit code: 0 ok, 1 runtime failure, 2 bad config.
func Main(args []string, stderr io.Writer, b Binary) int {
	fs := flag.NewFlagSet(b.Config.Name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	validateOnly := fs.Bool("validate", false, "check the configuration, print every problem, and exit")
	healthcheck := fs.Bool("healthcheck", false, "exit 0 when the instance at -http-addr answers ready, 1 otherwise")
	b.Config.RegisterFlags(fs)
	if b.Flags != nil {
		b.Flags(fs)
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *healthcheck {
		if err := Healthcheck(context.Background(), b.Config.HTTPAddr); err != nil {
			fmt.Fprintf(stderr, "%s unhealthy: %v\n", b.Config.Name, err)
			return 1
		}
		return 0
	}
	if err := b.Validate(); err != nil {
		fmt.Fprintf(stderr, "%s: invalid configuration:\n%v\n", b.Config.Name, err)
		return 2
	}
	if *validateOnly {
		fmt.Fprintf(stderr, "%s: configuration ok\n", b.Config.Name)
		return 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := b.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(stderr, "%s: %v\n", b.Config.Name, err)
		return 1
	}
	return 0
}

// Part is something a service started that must stop at shutdown (a
// subscription, a loop); Stop finishes in-flight work within ctx.
type Part interface {
	Stop(ctx context.Context) error
}

// Subscription adapts a bus subscription to a Part.
type Subscription struct{ *bus.Subscription }

// Stop drains the subscription.
func (s Subscription) Stop(ctx context.Context) error { return s.Drain(ctx) }

// Run hosts a service: Start the runtime, let setup start the service's
// parts, mark it ready, wait for ctx to end, then stop the parts in
// reverse order and close the runtime, all within cfg.ShutdownTimeout.
func Run(ctx context.Context, cfg Config, setup func(ctx context.Context, rt *Runtime) ([]Part, error)) (err error) {
	rt, err := Start(ctx, cfg)
	if err != nil {
		return err
	}
	var parts []Part
	defer func() {
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
		defer cancel()
		rt.SetReady(false)
		rt.Log.Info("service stopping")
		var errs []error
		for i := len(parts) - 1; i >= 0; i-- {
			if perr := parts[i].Stop(shutdownCtx); perr != nil {
				errs = append(errs, perr)
			}
		}
		if cerr := rt.Close(shutdownCtx); cerr != nil {
			errs = append(errs, cerr)
		}
		if len(errs) > 0 && err == nil {
			err = fmt.Errorf("shutdown: %w", errors.Join(errs...))
		}
	}()
	parts, err = setup(ctx, rt)
	if err != nil {
		return err
	}
	rt.SetReady(true)
	rt.Log.Info("service ready")
	<-ctx.Done()
	return nil
}

// EnsureConsumers creates the service's durable consumers, waiting (with
// backoff, until ctx ends) while their streams do not exist yet: streams
// are provisioned by the admin (`shizu dev` or `shizu provision`), which
// may start after the service.
func EnsureConsumers(ctx context.Context, rt *Runtime, specs ...bus.Consumer) error {
	for _, spec := range specs {
		eb := backoff.NewExponentialBackOff(backoff.WithInitialInterval(200*time.Millisecond),
			backoff.WithMaxInterval(5*time.Second), backoff.WithMaxElapsedTime(0))
		err := backoff.RetryNotify(func() error {
			_, err := rt.Bus.EnsureConsumer(ctx, spec)
			if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
				return backoff.Permanent(err)
			}
			return err
		}, backoff.WithContext(eb, ctx), func(err error, next time.Duration) {
			rt.Log.Warn("stream not provisioned yet; run `shizu provision` as admin", "stream", spec.Stream,
				"consumer", spec.Durable, "retry_in", next)
		})
		if err != nil {
			return err
		}
	}
	return nil
}
