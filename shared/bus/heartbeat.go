package bus

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shizu-gpu/shizu/shared/subject"
)

// Heartbeats is a KV bucket where each node's key lives only as long as the
// node keeps beating: every beat is written with a per-message TTL, and
// when a node stops the server removes its key and leaves a delete marker
// that watchers see. Needs nats-server 2.11+ (JetStream API level >= 1).
type Heartbeats struct {
	js     jetstream.JetStream
	kv     jetstream.KeyValue
	bucket string
	ttl    time.Duration
}

// HeartbeatBucket declares the heartbeat bucket.
type HeartbeatBucket struct {
	Name string
	// TTL is how long a key outlives its last beat (default 3 s).
	TTL      time.Duration
	Replicas int
}

// EnsureHeartbeats creates (or opens, unchanged) the heartbeat bucket.
func (c *Conn) EnsureHeartbeats(ctx context.Context, b HeartbeatBucket) (*Heartbeats, error) {
	if b.Name == "" {
		return nil, errors.New("heartbeat bucket: name required")
	}
	if b.TTL == 0 {
		b.TTL = 3 * time.Second
	}
	if b.TTL < time.Second {
		return nil, fmt.Errorf("heartbeat bucket %s: ttl %s is below the server's 1 s minimum", b.Name, b.TTL)
	}
	kv, err := c.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:         b.Name,
		Description:    "node heartbeats; a key expires when its node stops beating",
		History:        1,
		Storage:        jetstream.FileStorage,
		Replicas:       max(b.Replicas, 1),
		LimitMarkerTTL: time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("ensure heartbeat bucket %s: %w", b.Name, err)
	}
	return &Heartbeats{js: c.js, kv: kv, bucket: b.Name, ttl: b.TTL}, nil
}

// OpenHeartbeats opens an existing heartbeat bucket (for users that may
// read it but not create it).
func (c *Conn) OpenHeartbeats(ctx context.Context, name string, ttl time.Duration) (*Heartbeats, error) {
	kv, err := c.js.KeyValue(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("open heartbeat bucket %s: %w", name, err)
	}
	if ttl == 0 {
		ttl = 3 * time.Second
	}
	return &Heartbeats{js: c.js, kv: kv, bucket: name, ttl: ttl}, nil
}

// TTL is how long a node's key outlives its last beat.
func (h *Heartbeats) TTL() time.Duration { return h.ttl }

func heartbeatKey(node string) string { return "node." + node }

// Beat records that node is alive, with payload (e.g. the node's epoch),
// and renews its TTL. Each beat is one message with its own TTL, so a node
// that stops beating disappears TTL after its last beat.
func (h *Heartbeats) Beat(ctx context.Context, node string, payload []byte) (uint64, error) {
	if err := subject.Token(node); err != nil {
		return 0, fmt.Errorf("heartbeat: node id: %w", err)
	}
	ack, err := h.js.Publish(ctx, "$KV."+h.bucket+"."+heartbeatKey(node), payload, jetstream.WithMsgTTL(h.ttl))
	if err != nil {
		return 0, fmt.Errorf("heartbeat %s: %w", node, err)
	}
	return ack.Sequence, nil
}

// Stop removes node's key at once (a clean shutdown), so watchers see it
// leave without waiting for the TTL.
func (h *Heartbeats) Stop(ctx context.Context, node string) error {
	if err := h.kv.Delete(ctx, heartbeatKey(node)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("heartbeat stop %s: %w", node, err)
	}
	return nil
}

// Serving reports whether the bucket answers (nil) or not: JetStream can be
// down, or without a leader for the bucket's stream, while the connection
// to the server is up, and then no beat is written or seen.
func (h *Heartbeats) Serving(ctx context.Context) error {
	if _, err := h.kv.Status(ctx); err != nil {
		return fmt.Errorf("heartbeat bucket %s: %w", h.bucket, err)
	}
	return nil
}

// Alive reports whether node has beaten within the TTL, with its last payload.
func (h *Heartbeats) Alive(ctx context.Context, node string) (bool, []byte, error) {
	e, err := h.kv.Get(ctx, heartbeatKey(node))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil, nil
	}
	if err != nil {
		return false, nil, err
	}
	return true, e.Value(), nil
}

// HeartbeatChange is one observation from Watch.
type HeartbeatChange struct {
	Node    string
	Alive   bool
	Payload []byte
	At      time.Time
	// Initial is true for the current state replayed when the watch starts.
	Initial bool
}

// Watch streams heartbeat changes: the current state of every node first
// (Initial), then each beat (Alive) and each expiry or stop (not Alive).
// The channel closes when ctx ends.
func (h *Heartbeats) Watch(ctx context.Context) (<-chan HeartbeatChange, error) {
	w, err := h.kv.WatchAll(ctx)
	if err != nil {
		return nil, fmt.Errorf("watch heartbeats: %w", err)
	}
	out := make(chan HeartbeatChange, 64)
	go func() {
		defer close(out)
		defer func() { _ = w.Stop() }()
		initial := true
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil {
					initial = false
					continue
				}
				node, found := strings.CutPrefix(e.Key(), "node.")
				if !found {
					continue
				}
				ch := HeartbeatChange{Node: node, Alive: e.Operation() == jetstream.KeyValuePut,
					Payload: e.Value(), At: e.Created(), Initial: initial}
				select {
				case out <- ch:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, nil
}
