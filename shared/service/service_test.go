package service_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/service"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

func password(user string) string { return "pw-" + user }

func TestServiceWaitsForProvisioningThenServesReadyAndStopsCleanly(t *testing.T) {
	t.Parallel()
	n := testkit.StartNATS(t, testkit.WithUsers(topology.Users(), password))
	r := testkit.StartRedis(t)

	cfg := service.Defaults(topology.Scheduler)
	cfg.NATS.URL, cfg.NATS.Password = n.URL, password(topology.Scheduler)
	cfg.RedisURL = "redis://" + r.Addr + "/0"
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.LogFormat = "text"
	cfg.LogWriter = t.Output()
	cfg.ShutdownTimeout = 5 * time.Second
	sched, _ := topology.ServiceNamed(topology.Scheduler)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- service.Run(ctx, cfg, func(ctx context.Context, rt *service.Runtime) ([]service.Part, error) {
			addr <- rt.HTTPAddr()
			return nil, service.EnsureConsumers(ctx, rt, sched.Consumers...)
		})
	}()
	httpAddr := <-addr
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + httpAddr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Fatalf("healthz = %d while starting; liveness must not wait for readiness", code)
	}
	if code, _ := get("/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("readyz = %d before streams exist; want 503", code)
	}

	// The admin provisions the streams after the service started.
	admin, err := bus.Connect(t.Context(), bus.Config{URL: n.URL, User: topology.Admin, Password: password(topology.Admin)}, bus.Instruments{})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.WithoutCancel(t.Context()))
	if err := admin.EnsureStreams(t.Context(), topology.Streams(1)...); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, func() error {
		if code, body := get("/readyz"); code != http.StatusOK {
			return fmt.Errorf("readyz = %d %s", code, body)
		}
		return nil
	})
	if _, err := admin.JetStream().Consumer(t.Context(), topology.StreamRentals, "scheduler"); err != nil {
		t.Fatalf("scheduler consumer not created: %v", err)
	}
	if code, body := get("/metrics"); code != http.StatusOK || !strings.Contains(body, "target_info") {
		t.Fatalf("metrics = %d, body without target_info", code)
	}
	if healthErr := service.Healthcheck(t.Context(), httpAddr); healthErr != nil {
		t.Fatalf("healthcheck of a ready service: %v", healthErr)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("shutdown: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("service did not stop")
	}
	if err := service.Healthcheck(t.Context(), httpAddr); err == nil {
		t.Fatal("healthcheck passes after shutdown")
	}
}

func TestStartSaysWhichDependencyIsUnreachable(t *testing.T) {
	t.Parallel()
	n := testkit.StartNATS(t)
	cfg := service.Defaults("probe")
	cfg.NATS.URL, cfg.NATS.User = n.URL, ""
	cfg.HTTPAddr = ""
	cfg.RedisURL = "redis://127.0.0.1:1/0" // nothing listens on port 1
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	_, err := service.Start(ctx, cfg)
	if err == nil || !strings.Contains(err.Error(), "redis at 127.0.0.1:1") {
		t.Fatalf("got %v, want an error naming the Redis address", err)
	}
}

func TestMainReportsEveryConfigurationProblem(t *testing.T) {
	t.Setenv("SHIZU_SHUTDOWN_TIMEOUT", "soon")
	t.Setenv("SHIZU_LOG_LEVEL", "loud")
	cfg := service.Defaults("scheduler")
	var stderr bytes.Buffer
	code := service.Main([]string{"-validate", "-redis-url", "mysql://x", "-nats-cert", "/nonexistent/cert.pem"}, &stderr, service.Binary{
		Config:   &cfg,
		Validate: func() error { return cfg.Validate() },
		Run:      func(context.Context) error { return errors.New("must not run") },
	})
	if code != 2 {
		t.Fatalf("exit code %d, want 2", code)
	}
	for _, want := range []string{"SHIZU_SHUTDOWN_TIMEOUT", "log.level", "redis.url", "nats.cert/nats.key: set both", "nats.cert: stat /nonexistent/cert.pem"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr does not mention %q:\n%s", want, stderr.String())
		}
	}
}

func TestMainValidateAcceptsTheDefaults(t *testing.T) {
	cfg := service.Defaults("scheduler")
	var stderr bytes.Buffer
	code := service.Main([]string{"-validate"}, &stderr, service.Binary{
		Config: &cfg, Validate: func() error { return cfg.Validate() },
		Run: func(context.Context) error { return errors.New("must not run") },
	})
	if code != 0 || !strings.Contains(stderr.String(), "configuration ok") {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
}
