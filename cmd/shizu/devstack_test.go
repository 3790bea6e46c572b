package main

import (
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestADevStackStopsWhatItStartedInReverseOrder(t *testing.T) {
	t.Parallel()
	s := newDevStack(t.Context(), devOptions{}, io.Discard)
	var stopped []string
	for _, part := range []string{"data folder", "NATS", "Redis", "services"} {
		s.onStop(func() { stopped = append(stopped, part) })
	}
	s.close()
	if want := []string{"services", "Redis", "NATS", "data folder"}; !slices.Equal(stopped, want) {
		t.Fatalf("stopped %v, want %v", stopped, want)
	}
	if s.ctx.Err() == nil {
		t.Fatal("the services' context is not ended by close")
	}
}

// A step that fails (here the autoscaler policy file is missing, found
// after NATS and Redis started) stops everything started before it.
func TestADevStackWhoseStepFailsStopsWhatStarted(t *testing.T) {
	t.Parallel()
	data := filepath.Join(t.TempDir(), "data")
	s := newDevStack(t.Context(), devOptions{dataDir: data, fleet: "rtx4090x8:1", logLevel: "info",
		interval: time.Minute, policy: filepath.Join(t.TempDir(), "missing.json")}, io.Discard)
	err := s.start(t.Context())
	s.close()
	if err == nil || !strings.Contains(err.Error(), "autoscaler.policy") || !strings.Contains(err.Error(), "missing.json") {
		t.Fatalf("start: %v, want the missing policy file named", err)
	}
	if s.natsURL == "" || s.redisURL == "" {
		t.Fatalf("NATS (%q) and Redis (%q) did not start before the failing step", s.natsURL, s.redisURL)
	}
	for _, u := range []string{s.natsURL, s.redisURL} {
		addr, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		if c, err := net.DialTimeout("tcp", addr.Host, time.Second); err == nil {
			c.Close()
			t.Errorf("%s still answers after close", u)
		}
	}
	if _, err := os.Stat(filepath.Join(data, "env")); !os.IsNotExist(err) {
		t.Errorf("env file written by a stack that did not start: %v", err)
	}
}
