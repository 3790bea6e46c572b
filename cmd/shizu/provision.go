package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/quota"
	"github.com/shizu-gpu/shizu/shared/topology"
)

func provisionCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("shizu provision", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `Create or update every JetStream stream and the heartbeat bucket that
Shizu's services use, from the topology compiled into this binary. Safe to
run again: an unchanged declaration changes nothing.

Example:
  SHIZU_NATS_PASSWORD=$SHIZU_ADMIN_NATS_PASSWORD shizu provision -nats-url nats://nats:4222 -replicas 3

Flags:
`)
		fs.PrintDefaults()
	}
	cfg := bus.Config{Name: "shizu-provision"}
	fs.StringVar(&cfg.URL, "nats-url", envOr("SHIZU_NATS_URL", "nats://127.0.0.1:4222"), "NATS server URL(s) [SHIZU_NATS_URL]")
	fs.StringVar(&cfg.User, "nats-user", envOr("SHIZU_NATS_USER", topology.Admin), "NATS user allowed to create streams [SHIZU_NATS_USER]")
	fs.StringVar(&cfg.Password, "nats-password", os.Getenv("SHIZU_NATS_PASSWORD"), "password; prefer the environment [SHIZU_NATS_PASSWORD]")
	fs.StringVar(&cfg.CAFile, "nats-ca", os.Getenv("SHIZU_NATS_CA"), "CA certificate (PEM); enables TLS 1.3 [SHIZU_NATS_CA]")
	defReplicas, err := strconv.Atoi(envOr("SHIZU_STREAM_REPLICAS", "1"))
	if err != nil {
		fmt.Fprintf(stderr, "shizu provision: SHIZU_STREAM_REPLICAS=%q is not a number\n", os.Getenv("SHIZU_STREAM_REPLICAS"))
		return 2
	}
	replicas := fs.Int("replicas", defReplicas, "stream replicas: 1 on one server, 3 on a cluster [SHIZU_STREAM_REPLICAS]")
	ttl := fs.Duration("heartbeat-ttl", 3*time.Second, "how long a node's heartbeat key outlives its last beat")
	if err := parseFlags(fs, args, stderr); err != nil {
		return flagExit(err)
	}
	if *replicas < 1 || *replicas > 5 {
		fmt.Fprintf(stderr, "shizu provision: -replicas %d is out of range 1..5\n", *replicas)
		return 2
	}
	if err := provision(ctx, cfg, *replicas, *ttl); err != nil {
		fmt.Fprintf(stderr, "shizu provision: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "provisioned %d streams and the %s bucket (replicas %d)\n", len(topology.Streams(*replicas)), topology.HeartbeatBucket, *replicas)
	return 0
}

// provision creates or updates every stream, the quota bucket and the
// heartbeat bucket.
func provision(ctx context.Context, cfg bus.Config, replicas int, ttl time.Duration) error {
	c, err := bus.Connect(ctx, cfg, bus.Instruments{})
	if err != nil {
		return err
	}
	defer c.Close(context.WithoutCancel(ctx))
	if err := c.EnsureStreams(ctx, topology.Streams(replicas)...); err != nil {
		return err
	}
	if _, err := quota.Ensure(ctx, c.JetStream(), replicas); err != nil {
		return err
	}
	_, err = c.EnsureHeartbeats(ctx, topology.Heartbeats(replicas, ttl))
	return err
}

func envOr(key, def string) string {
	if v, ok := os.LookupEnv(key); ok {
		return v
	}
	return def
}
