package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	autoscaler "github.com/shizu-gpu/shizu/services/autoscaler/app"
	"github.com/shizu-gpu/shizu/services/autoscaler/policy"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// TestPoolsApplyDeclaresAPoolTheAutoscalerScales runs the CLI against real
// NATS and the autoscaler (real Redis): `shizu pools apply` declares a
// pool, whose floor the autoscaler then requests under the pool's tenant;
// `shizu pools withdraw` cancels them. A bad file is refused with every
// problem before anything is published.
func TestPoolsApplyDeclaresAPoolTheAutoscalerScales(t *testing.T) {
	t.Parallel()
	pw := func(u string) string { return "pw-" + u }
	n := testkit.StartNATS(t, testkit.WithUsers(topology.Users(), pw))
	r := testkit.StartRedis(t)
	admin, err := bus.Connect(t.Context(), bus.Config{URL: n.URL, User: topology.Admin, Password: pw(topology.Admin)}, bus.Instruments{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close(context.WithoutCancel(t.Context())) })
	if err := admin.EnsureStreams(t.Context(), topology.Streams(1)...); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var requested, cancelled []string
	sub, err := admin.NATS().Subscribe("rental.globex.*", func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case strings.HasSuffix(m.Subject, ".requested"):
			ev := &shizuv1.RentalRequested{}
			if proto.Unmarshal(m.Data, ev) == nil && ev.GetSpec().GetLabels()[autoscaler.PoolLabel] == "chat" {
				requested = append(requested, ev.GetRentalId())
			}
		case strings.HasSuffix(m.Subject, ".cancel_requested"):
			ev := &shizuv1.RentalCancelRequested{}
			if proto.Unmarshal(m.Data, ev) == nil {
				cancelled = append(cancelled, ev.GetRentalId())
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := admin.NATS().Flush(); err != nil {
		t.Fatal(err)
	}

	cfg := autoscaler.DefaultConfig()
	cfg.Service.NATS.URL, cfg.Service.NATS.Password = n.URL, pw(topology.Autoscaler)
	cfg.Service.RedisURL = "redis://" + r.Addr + "/0"
	cfg.Service.HTTPAddr, cfg.Service.LogFormat, cfg.Service.LogWriter = "", "text", t.Output()
	cfg.Service.ShutdownTimeout = 5 * time.Second
	cfg.Tick = 50 * time.Millisecond
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context())) // stopped in the cleanup
	done := make(chan error, 1)
	go func() { done <- autoscaler.RunWith(ctx, cfg, autoscaler.Deps{Policy: &policy.File{}}) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("autoscaler: %v", err)
		}
	})

	shizu := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		args = append(args, "-nats-url", n.URL, "-nats-user", topology.Admin, "-nats-password", pw(topology.Admin), "-dev-dir", t.TempDir())
		code := run(t.Context(), args, &out, &errOut)
		return code, out.String(), errOut.String()
	}
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}

	// A bad pool: every problem named, exit 2, nothing published.
	bad := write("bad.json", `{"id":"chat","tenant":"globex","rental":{"gpu_count":1,"milli_gpu":1000},
		"min_replicas":3,"max_replicas":2,"max_step_out":1,"max_step_in":1,
		"thresholds":[{"name":"busy","metric":"qps","scale_out_above":10,"step":1}]}`)
	code, _, errOut := shizu("pools", "apply", "-f", bad)
	if code != exitUsage || !strings.Contains(errOut, "max_replicas: 2 is below min_replicas 3") || !strings.Contains(errOut, `thresholds[0].metric: "qps"`) {
		t.Fatalf("bad pool: exit %d, stderr %q; want exit %d naming max_replicas and the metric", code, errOut, exitUsage)
	}
	info, err := admin.JetStream().Stream(t.Context(), topology.StreamScaling)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := info.Info(t.Context(), jetstream.WithSubjectFilter("scale.*.declared")); err != nil || len(st.State.Subjects) != 0 {
		t.Fatalf("a refused pool was published: %v (%v)", st.State.Subjects, err)
	}

	good := write("chat.json", `{"id":"chat","tenant":"globex","rental":{"gpu_count":1,"milli_gpu":1000},
		"min_replicas":2,"max_replicas":4,"max_step_out":1,"max_step_in":1,
		"target_tracking":{"metric":"requests_per_second_per_replica","value":100}}`)
	code, out, errOut := shizu("pools", "apply", "-f", good)
	if code != exitOK || !strings.Contains(out, "pool chat of globex declared: 2 to 4 replicas") {
		t.Fatalf("apply: exit %d\n%s%s", code, out, errOut)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if !slices.Equal(requested, []string{"pool-chat-1", "pool-chat-2"}) {
			return fmt.Errorf("requested %v", requested)
		}
		return nil
	})

	code, out, errOut = shizu("pools", "withdraw", "chat", "-tenant", "globex")
	if code != exitOK || !strings.Contains(out, "withdrawal of pool chat of globex published") || !strings.Contains(out, "dlq.SCALING.autoscaler-pools") {
		t.Fatalf("withdraw: exit %d\n%s%s", code, out, errOut)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if !slices.Equal(cancelled, []string{"pool-chat-2", "pool-chat-1"}) {
			return fmt.Errorf("cancelled %v", cancelled)
		}
		return nil
	})
}
