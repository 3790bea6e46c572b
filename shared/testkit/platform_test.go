package testkit_test

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

func TestPlatformRunsNATSWithTheTopologysUsersAndProvisionedStreams(t *testing.T) {
	t.Parallel()
	p := testkit.Platform(t, testkit.WithHeartbeats(2*time.Second))
	for _, s := range topology.Streams(1) {
		if _, err := p.Admin.JetStream().Stream(t.Context(), s.Name); err != nil {
			t.Errorf("stream %s not provisioned: %v", s.Name, err)
		}
	}
	if p.Heartbeats == nil || p.Heartbeats.TTL() != 2*time.Second {
		t.Fatalf("heartbeat bucket %+v", p.Heartbeats)
	}
	p.Connect(t, topology.Scheduler)
	wrong := p.BusConfig(topology.Scheduler)
	wrong.Password = "not-the-password"
	if _, err := bus.Connect(t.Context(), wrong, bus.Instruments{}); err == nil {
		t.Fatal("a wrong password was accepted: NATS runs without the topology's users")
	}
	if err := p.ServiceConfig(t, topology.Scheduler).Validate(); err != nil {
		t.Fatalf("service config on the platform: %v", err)
	}
	n := capacity.Node{ID: "n1", Zone: "z", Market: capacity.MarketOnDemand, Currency: "USD", PricePerGPUHourMicros: 1,
		CPUMilli: 1000, MemoryMiB: 1024, GPUs: []capacity.GPU{{Index: 0, UUID: "GPU-1", Model: "H100", VRAMMiB: 1024}}}
	if _, err := p.Capacity(t).Register(t.Context(), n); err != nil {
		t.Fatalf("capacity store on the platform's Redis: %v", err)
	}
}

func TestPlatformWithoutStreamsOrUsers(t *testing.T) {
	t.Parallel()
	p := testkit.Platform(t, testkit.WithoutStreams(), testkit.WithoutUsers(), testkit.WithHeartbeats(time.Second))
	if _, err := p.Admin.JetStream().Stream(t.Context(), topology.StreamRentals); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("stream before provisioning: %v; want not found", err)
	}
	if p.Heartbeats != nil {
		t.Fatal("heartbeat bucket provisioned with WithoutStreams")
	}
	if cfg := p.BusConfig(topology.Scheduler); cfg.User != "" || cfg.Password != "" {
		t.Fatalf("credentials without users: %+v", cfg)
	}
	p.Provision(t)
	if _, err := p.Admin.JetStream().Stream(t.Context(), topology.StreamRentals); err != nil {
		t.Fatalf("stream after Provision: %v", err)
	}
	if p.Heartbeats == nil || p.Heartbeats.TTL() != time.Second {
		t.Fatalf("heartbeat bucket after Provision: %+v", p.Heartbeats)
	}
}
