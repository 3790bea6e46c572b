package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// syncBuffer is a bytes.Buffer written by a command running in another
// goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLogsPrintsTheTailAndFollowsARentalsOutput runs `shizu logs` against
// a real nats-server holding the LOGS stream, with batches published as
// the node agent does.
func TestLogsPrintsTheTailAndFollowsARentalsOutput(t *testing.T) {
	t.Parallel()
	pw := func(u string) string { return "pw-" + u }
	n := testkit.StartNATS(t, testkit.WithUsers(topology.Users(), pw))
	admin, err := bus.Connect(t.Context(), bus.Config{URL: n.URL, User: topology.Admin, Password: pw(topology.Admin)}, bus.Instruments{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close(context.WithoutCancel(t.Context())) })
	if err := admin.EnsureStreams(t.Context(), topology.Streams(1)...); err != nil {
		t.Fatal(err)
	}
	offset := int64(0)
	ship := func(tenant string, dropped int64, lines ...string) {
		t.Helper()
		b := &shizuv1.RentalLogBatch{Meta: shizuv1.NewMeta(fmt.Sprintf("log:r-1:1:%s:%d", tenant, offset), "node-agent/n1", "", "r-1", time.Now()),
			RentalId: "r-1", TenantId: tenant, NodeId: "n1", Attempt: 1, Offset: offset, DroppedLines: dropped}
		for _, l := range lines {
			b.Lines = append(b.Lines, &shizuv1.LogLine{ReadAt: timestamppb.Now(), Text: l})
			offset += int64(len(l) + 1)
		}
		if _, err := admin.Publish(t.Context(), "log."+tenant+".r-1", b); err != nil {
			t.Fatal(err)
		}
	}
	ship("acme", 0, "epoch 1", "epoch 2", "epoch 3")
	ship("acme", 7, "epoch 9")
	ship("globex", 0, "another tenant's rental of the same id")
	conn := []string{"-nats-url", n.URL, "-nats-password", pw(topology.Admin), "-dev-dir", t.TempDir(), "-tenant", "acme"}
	shizu := func(ctx context.Context, stdout *syncBuffer, args ...string) (int, string) {
		var errOut bytes.Buffer
		code := run(ctx, append(append([]string{"logs"}, args...), conn...), stdout, &errOut)
		return code, errOut.String()
	}

	var out syncBuffer
	if code, errOut := shizu(t.Context(), &out, "-n", "3", "r-1"); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	want := "epoch 3\n[7 lines dropped: the rental wrote faster than the log rate limit]\nepoch 9\n"
	if out.String() != want {
		t.Fatalf("shizu logs -n 3 printed\n%s\nwant\n%s", out.String(), want)
	}

	var js syncBuffer
	if code, errOut := shizu(t.Context(), &js, "r-1", "-n", "1", "-o", "json"); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var line map[string]any
	if err := json.Unmarshal([]byte(js.String()), &line); err != nil || line["text"] != "epoch 9" || line["node_id"] != "n1" || line["attempt"] != 1.0 {
		t.Fatalf("-o json printed %s (%v); want one snake_case object for epoch 9", js.String(), err)
	}

	// -f prints the tail, then what comes, until interrupted.
	ctx, cancel := context.WithCancel(t.Context())
	var followed syncBuffer
	done := make(chan int, 1)
	go func() {
		code, _ := shizu(ctx, &followed, "-f", "-n", "1", "r-1")
		done <- code
	}()
	testkit.Eventually(t, 10*time.Second, func() error {
		if !strings.Contains(followed.String(), "epoch 9\n") {
			return fmt.Errorf("printed %q", followed.String())
		}
		return nil
	})
	ship("acme", 0, "epoch 10")
	testkit.Eventually(t, 10*time.Second, func() error {
		if followed.String() != "epoch 9\nepoch 10\n" {
			return fmt.Errorf("printed %q", followed.String())
		}
		return nil
	})
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("shizu logs -f exited %d when interrupted, want 0", code)
	}
	s, err := admin.JetStream().Stream(t.Context(), topology.StreamLogs)
	if err != nil || s.CachedInfo().State.Consumers != 0 {
		t.Fatalf("consumers left on LOGS: %v (%v)", s.CachedInfo().State.Consumers, err)
	}

	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no rental is a usage error", nil, 2, "want one rental id"},
		{"-n 0 without -f is a usage error", []string{"-n", "0", "r-1"}, 2, "-n 0: want 1..100000"},
		{"a rental id with a dot is a usage error", []string{"r.1"}, 2, "rental id"},
		{"a rental without output says why there is none", []string{"r-none"}, 1, "rental r-none of tenant acme has no output in its log (yet)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var o syncBuffer
			code, errOut := shizu(t.Context(), &o, c.args...)
			if code != c.code || !strings.Contains(errOut, c.want) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
				t.Fatalf("exit %d, stderr %q; want exit %d and one line saying %q", code, errOut, c.code, c.want)
			}
		})
	}
}
