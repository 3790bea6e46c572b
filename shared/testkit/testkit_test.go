package testkit_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shizu-gpu/shizu/shared/testkit"
)

func TestNATSServesJetStream(t *testing.T) {
	t.Parallel()
	n := testkit.StartNATS(t)
	_, js := n.JetStream(t)
	info, err := js.AccountInfo(t.Context())
	if err != nil {
		t.Fatalf("account info: %v", err)
	}
	if info.API.Level < 1 {
		t.Fatalf("JetStream API level %d does not support per-key TTL", info.API.Level)
	}
}

func TestRedisAnswersAndRestartsEmpty(t *testing.T) {
	t.Parallel()
	r := testkit.StartRedis(t)
	rdb := r.Client(t)
	if err := rdb.Set(t.Context(), "k", "v", 0).Err(); err != nil {
		t.Fatalf("set: %v", err)
	}
	r.Restart(t)
	n, err := rdb.Exists(t.Context(), "k").Result()
	if err != nil {
		t.Fatalf("exists after restart: %v", err)
	}
	if n != 0 {
		t.Fatalf("restarted redis kept key k; it must start empty")
	}
}

func TestClusterCreatesReplicatedStream(t *testing.T) {
	t.Parallel()
	c := testkit.StartCluster(t, 3)
	nc := c.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var s jetstream.Stream
	testkit.Eventually(t, 20*time.Second, func() error {
		s, err = js.CreateOrUpdateStream(t.Context(), jetstream.StreamConfig{
			Name: "R3", Subjects: []string{"r3.>"}, Replicas: 3, Storage: jetstream.FileStorage,
		})
		return err
	})
	if _, err := js.Publish(t.Context(), "r3.x", []byte("hello")); err != nil {
		t.Fatalf("publish to R3 stream: %v", err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Replicas != 3 || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("stream has replicas=%d peers=%d, want 3 and 2 followers", info.Config.Replicas, len(info.Cluster.Replicas))
	}
}

func TestNATSRestartsOnItsPortAndStore(t *testing.T) {
	t.Parallel()
	n := testkit.StartNATS(t)
	_, js := n.JetStream(t)
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "KEPT", Subjects: []string{"kept"},
		Storage: jetstream.FileStorage}); err != nil {
		t.Fatalf("create stream: %v", err)
	}
	if _, err := js.Publish(t.Context(), "kept", []byte("x")); err != nil {
		t.Fatalf("publish: %v", err)
	}
	n.Stop(t)
	n.Restart(t)
	testkit.Eventually(t, 10*time.Second, func() error {
		s, err := js.Stream(t.Context(), "KEPT")
		if err != nil {
			return err
		}
		if got := s.CachedInfo().State.Msgs; got != 1 {
			t.Fatalf("after the restart the stream holds %d messages, want 1", got)
		}
		return nil
	})
}
