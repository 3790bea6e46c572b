package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// trafficFields are the TrafficSampled fields `shizu traffic` sets.
var trafficFields = fieldWords{"pool_id": "pool id", "requests_per_second": "-rps", "concurrent_requests": "-concurrent",
	"p99_latency": "-p99", "window": "-window"}

var trafficVerb = verb{
	name:    "traffic",
	summary: "Publish traffic samples of a serving pool (TrafficSampled), as a load balancer would, to drive the autoscaler.",
	usage:   "<pool> [flags]",
	examples: `  shizu traffic chat-api -rps 2400 -concurrent 600 -p99 85ms
  shizu traffic chat-api -rps 2400 -count 12 -every 5s     # a minute of samples
  shizu traffic chat-api -rps 0 -count 3                   # idle: scale in / to zero
`,
	setup: func(fs *flag.FlagSet) func(context.Context, []string, io.Writer) error {
		var cf clientFlags
		cf.register(fs)
		rps := fs.Float64("rps", 0, "requests per second over the window")
		conc := fs.Int64("concurrent", 0, "concurrent requests")
		p99 := fs.Duration("p99", 0, "p99 latency over the window (0: not measured)")
		window := fs.Duration("window", 10*time.Second, "window each sample covers")
		count := fs.Int("count", 1, "samples to publish")
		every := fs.Duration("every", 5*time.Second, "time between samples")
		return func(ctx context.Context, args []string, stdout io.Writer) error {
			if len(args) != 1 {
				return usagef("want one pool id")
			}
			pool := args[0]
			subj, err := subject.Format(subject.TrafficSample, pool)
			if err != nil {
				return usagef("pool id: %w", err)
			}
			if *count < 1 || *every < 0 {
				return usagef("-count %d must be >= 1 and -every %s not negative", *count, *every)
			}
			mk := func(now time.Time) *shizuv1.TrafficSampled {
				ev := &shizuv1.TrafficSampled{Meta: shizuv1.NewMeta(fmt.Sprintf("traffic:%s:%d", pool, now.UnixNano()), cliSource, "", pool, now), PoolId: pool,
					ConcurrentRequests: *conc, RequestsPerSecond: *rps, Window: durationpb.New(*window)}
				if *p99 > 0 {
					ev.P99Latency = durationpb.New(*p99)
				}
				return ev
			}
			if err := mk(time.Now()).Validate(); err != nil {
				return invalid(err, trafficFields)
			}
			conn, _, err := cf.connect(ctx)
			if err != nil {
				return err
			}
			defer conn.Close(context.WithoutCancel(ctx))
			p99Text := "not measured"
			if *p99 > 0 {
				p99Text = p99.String()
			}
			for i := range *count {
				if i > 0 {
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-time.After(*every):
					}
				}
				if _, err := conn.Publish(ctx, subj, mk(time.Now())); err != nil {
					return fmt.Errorf("publish sample: %w", err)
				}
				if cf.output == "table" {
					fmt.Fprintf(stdout, "[%d/%d] %s: %g req/s, %d concurrent, p99 %s\n", i+1, *count, pool, *rps, *conc, p99Text)
				}
			}
			if cf.output == "json" {
				return printJSON(stdout, map[string]any{"pool_id": pool, "samples": *count})
			}
			fmt.Fprintf(stdout, "watch the decisions with: shizu pools %s\n", pool)
			return nil
		}
	},
}
