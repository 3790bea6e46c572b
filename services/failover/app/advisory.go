package app

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shizu-gpu/shizu/services/failover/detect"
)

// AdvisoryConfig reaches the NATS server's client-disconnect advisories
// ($SYS.ACCOUNT.<account>.DISCONNECT), which only a user of the system
// account may read. Empty URL: the fast path is off and crashes are found
// by heartbeat expiry alone.
type AdvisoryConfig struct {
	URL      string
	User     string
	Password string
}

// disconnectSubject is every account's client-disconnect advisory.
const disconnectSubject = "$SYS.ACCOUNT.*.DISCONNECT"

// disconnectAdvisory is the part of the server's
// io.nats.server.advisory.v1.client_disconnect event failover reads.
type disconnectAdvisory struct {
	Type   string    `json:"type"`
	Time   time.Time `json:"timestamp"`
	Client struct {
		Name string `json:"name"`
		User string `json:"user"`
	} `json:"client"`
	Reason string `json:"reason"`
}

// parseDisconnect reads a node agent's disconnect out of an advisory; ok is
// false for anything else (another service's connection, a malformed
// message).
func parseDisconnect(data []byte, received time.Time) (Disconnect, bool) {
	var a disconnectAdvisory
	if err := json.Unmarshal(data, &a); err != nil || a.Type != "io.nats.server.advisory.v1.client_disconnect" {
		return Disconnect{}, false
	}
	node, ok := detect.NodeFromClientName(a.Client.Name)
	if !ok {
		return Disconnect{}, false
	}
	// The server's clock, like the heartbeats' (see observe).
	at := a.Time
	if at.IsZero() {
		at = received
	}
	return Disconnect{Node: node, At: at}, true
}

// watchDisconnects subscribes to the advisories with its own connection
// and feeds node agents' disconnects to out until ctx ends.
func watchDisconnects(ctx context.Context, cfg AdvisoryConfig, now func() time.Time, log *slog.Logger) (<-chan Disconnect, func(), error) {
	nc, err := nats.Connect(cfg.URL, nats.UserInfo(cfg.User, cfg.Password), nats.Name("failover-advisories"),
		nats.MaxReconnects(-1))
	if err != nil {
		return nil, nil, fmt.Errorf("failover: connect for disconnect advisories to %s as %s: %w", cfg.URL, cfg.User, err)
	}
	out := make(chan Disconnect, 256)
	sub, err := nc.Subscribe(disconnectSubject, func(m *nats.Msg) {
		dc, ok := parseDisconnect(m.Data, now())
		if !ok {
			return
		}
		select {
		case out <- dc:
		case <-ctx.Done():
		}
	})
	if err == nil {
		err = nc.Flush()
	}
	if err == nil {
		err = nc.LastError()
	}
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("failover: subscribe to %s (needs a system account user): %w", disconnectSubject, err)
	}
	log.Info("watching client disconnect advisories", "subject", disconnectSubject)
	return out, func() { _ = sub.Unsubscribe(); nc.Close() }, nil
}
