package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	autoscalerbench "github.com/shizu-gpu/shizu/services/autoscaler/benchmark"
	meteringbench "github.com/shizu-gpu/shizu/services/metering/benchmark"
	schedulerbench "github.com/shizu-gpu/shizu/services/scheduler/benchmark"
	"github.com/shizu-gpu/shizu/services/scheduler/benchmark/placerate"
	"github.com/shizu-gpu/shizu/shared/benchkit"
	"github.com/shizu-gpu/shizu/shared/embednats"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// benchCheck is one check of `shizu bench`: a service benchmark's Run (the
// same one its `go test -bench` calls) at size n.
type benchCheck struct {
	name        string
	summary     string
	defaultSize int
	// servers: the check runs on a fresh nats-server and Redis (the pure
	// placement check runs on none).
	servers bool
	run     func(ctx context.Context, env *benchkit.Env, n int) (benchkit.Result, error)
}

func benchChecks() []benchCheck {
	return []benchCheck{
		{"placement", "placement decisions/s of the pure package, 1,000 nodes x 8 GPUs, ~60% full", 20000, false, placerate.Run},
		{"scheduler", "rental requests placed end to end (NATS in, Redis reserve, RentalScheduled out)", 5000, true, schedulerbench.Run},
		{"metering", "rental events metered exactly once (usage records published)", 5000, true, meteringbench.Run},
		{"autoscaler", "traffic sample -> ScalingDecided latency", 200, true, autoscalerbench.Run},
	}
}

const benchNotHere = "failover re-placement after a node loss is a chaos scenario with node-agent processes: " +
	"cd cmd/shizu && go test -run '^$' -bench ChaosSIGKILL -benchtime=1x ./e2e/"

// startBenchEnv starts what `shizu dev` runs, without the services: an
// embedded nats-server with JetStream and the platform's users, and a
// redis-server child (miniredis without one), with the platform's
// streams; one per check, so one check's events never reach another's
// consumers. close stops them and removes their folder.
func startBenchEnv(ctx context.Context) (env *benchkit.Env, close func(), err error) {
	dir, err := os.MkdirTemp("", "shizu-bench-")
	if err != nil {
		return nil, nil, err
	}
	stops := []func(){func() { _ = os.RemoveAll(dir) }}
	stopAll := func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	defer func() {
		if err != nil {
			stopAll()
		}
	}()
	passwords := map[string]string{}
	for _, u := range topology.Users() {
		passwords[u.Name] = randomPassword()
	}
	password := func(name string) string { return passwords[name] }
	port, _ := pickPort(0, "")
	ns, err := embednats.Start(&server.Options{
		ServerName: "shizu-bench", Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: filepath.Join(dir, "nats"),
		NoSigs: true, NoLog: true, Users: embednats.Users(topology.Users(), password),
	}, 10*time.Second)
	if err != nil {
		return nil, nil, err
	}
	stops = append(stops, func() { ns.Shutdown(); ns.WaitForShutdown() })
	r, err := startDevRedis(0, filepath.Join(dir, "redis"), false, nil)
	if err != nil {
		return nil, nil, err
	}
	stops = append(stops, r.stop)
	env, err = benchkit.Open(ctx, benchkit.Servers{NATSURL: ns.ClientURL(), Password: password,
		RedisURL: r.url, Dir: filepath.Join(dir, "scratch")})
	if err != nil {
		return nil, nil, err
	}
	if err := os.MkdirAll(env.Dir, 0o755); err != nil {
		env.Close(ctx)
		return nil, nil, fmt.Errorf("bench scratch folder: %w", err)
	}
	return env, func() { env.Close(ctx); stopAll() }, nil
}
