package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/services/gateway/app"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Run serves the API with the gateway's own NATS user, reports ready, and
// returns when ctx ends; the tenant and key commands work against it.
func TestRunServesAndTheCommandsManageTenantsAndKeys(t *testing.T) {
	t.Parallel()
	d := testkit.Platform(t)
	cfg := app.DefaultConfig()
	cfg.Service = d.ServiceConfig(t, topology.Gateway)
	cfg.Service.RedisURL = ""
	cfg.Service.HTTPAddr = freeAddr(t)
	cfg.Listen = "127.0.0.1:0"
	listening := make(chan string, 1)
	cfg.OnListen = func(addr string) { listening <- addr }
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx, cfg) }()
	get := func(url, key string) (int, []byte, error) {
		req, err := http.NewRequestWithContext(t.Context(), "GET", url, nil)
		if err != nil {
			return 0, nil, err
		}
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, b, err
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		code, _, err := get("http://"+cfg.Service.HTTPAddr+"/readyz", "")
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("readyz %d", code)
		}
		return err
	})
	cfg.Listen = <-listening
	env := []string{"-nats-url", d.NATS.URL, "-nats-user", topology.Gateway, "-nats-password", testkit.Password(topology.Gateway)}
	command := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := app.Command(t.Context(), append(args, env...), &out, &errOut)
		return code, out.String(), errOut.String()
	}
	if code, out, errOut := command("tenant", "create", "-id", "acme", "-name", "Acme Corp"); code != 0 || !strings.Contains(out, `"tenant_id": "acme"`) {
		t.Fatalf("tenant create: %d %s %s", code, out, errOut)
	}
	code, out, errOut := command("key", "create", "-tenant", "acme", "-scope", "read-only")
	var created struct {
		ID     string `json:"key_id"`
		Secret string
	}
	if err := json.Unmarshal([]byte(out), &created); code != 0 || err != nil || !strings.HasPrefix(created.Secret, "shz_") {
		t.Fatalf("key create: %d %s %s", code, out, errOut)
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		code, body, err := get("http://"+cfg.Listen+"/v1/rentals", created.Secret)
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("%d %s", code, body)
		}
		return err
	})
	if code, out, errOut := command("key", "ls", "-tenant", "acme"); code != 0 || strings.Contains(out, created.Secret) || !strings.Contains(out, created.ID) {
		t.Fatalf("key ls: %d %s %s", code, out, errOut)
	}
	if code, _, errOut := command("key", "revoke", "-id", created.ID); code != 0 {
		t.Fatalf("key revoke: %d %s", code, errOut)
	}
	testkit.Eventually(t, time.Second, func() error {
		if code, _, _ := get("http://"+cfg.Listen+"/v1/rentals", created.Secret); code != http.StatusUnauthorized {
			return fmt.Errorf("a revoked key answered %d", code)
		}
		return nil
	})
	if code, _, errOut := command("tenant", "create", "-id", "Not.A.Tenant"); code != 1 || !strings.Contains(errOut, "tenant id") {
		t.Fatalf("a bad tenant id: %d %s", code, errOut)
	}
	if code, _, _ := command("tenant", "delete"); code != 2 {
		t.Fatalf("an unknown verb: exit %d, want 2", code)
	}
	stop()
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

// A gateway started before `shizu provision` waits for the streams, then
// serves.
func TestAGatewayWaitsForTheStreams(t *testing.T) {
	t.Parallel()
	d := testkit.Platform(t, testkit.WithoutStreams())
	opened := make(chan error, 1)
	go func() {
		_, err := app.Open(t.Context(), d.Connect(t, topology.Gateway), testOptions(), nil, nil)
		opened <- err
	}()
	select {
	case err := <-opened:
		t.Fatalf("Open returned before the streams exist: %v", err)
	default:
	}
	d.Provision(t)
	select {
	case err := <-opened:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Open did not return after provisioning")
	}
}
