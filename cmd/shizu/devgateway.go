package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	gateway "github.com/shizu-gpu/shizu/services/gateway/app"
	"github.com/shizu-gpu/shizu/services/gateway/identity"
	"github.com/shizu-gpu/shizu/services/metering/pricing"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// shizu dev's gateway: the tenant API on a fixed loopback port, with its
// own NATS user, and a dev tenant with a tenant key and an operator key
// that the CLI finds in the env file.

// devTenant is the tenant shizu dev makes its key for.
const devTenant = "dev"

// devAPIPort is the gateway's port unless -api-port says otherwise.
const devAPIPort = 8080

// devKeys are the keys shizu dev made; they live in the data folder
// (mode 0600) so a restart keeps using them: only their hashes are in
// the IDENTITY bucket.
type devKeys struct {
	Tenant   string `json:"tenant_id"`
	Key      string `json:"api_key"`
	Operator string `json:"operator_key"`
	// created says the keys were made by this start (the key is printed
	// once, then).
	created bool
}

// writeDevCatalogue writes the shipped price catalogue into the data
// folder and returns its path.
func writeDevCatalogue(dir string) (string, error) {
	path := filepath.Join(dir, "catalogue.json")
	if err := os.WriteFile(path, pricing.ShippedFile(), 0o644); err != nil {
		return "", fmt.Errorf("write the price catalogue: %w", err)
	}
	return path, nil
}

// gatewayUnit configures the gateway as one of the services: its own NATS
// user, the API on 127.0.0.1:<-api-port> (a free port when taken).
func (s *devStack) gatewayUnit() serviceUnit {
	cfg := gateway.DefaultConfig()
	cfg.Service = s.serviceConfig(topology.Gateway)
	cfg.Service.RedisURL = ""
	// One developer's scripts and tests poll: a higher rate than a
	// deployed gateway's default (20/s, 40 at once), still limited.
	cfg.RatePerSecond, cfg.RateBurst = 200, 400
	// A developer's webhook receiver is usually a local http server.
	cfg.WebhookLoopback = true
	// GET /v1/models answers the prices metering bills at: the shipped
	// catalogue, which dev's metering uses, written where the gateway reads it.
	if path, err := writeDevCatalogue(s.dataDir); err != nil {
		s.notes = append(s.notes, "note: GET /v1/models lists no prices: "+err.Error())
	} else {
		cfg.CataloguePath = path
	}
	port, note := pickPort(s.o.apiPort, "gateway")
	s.notes = append(s.notes, note)
	cfg.Listen = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	s.apiURL = "http://" + cfg.Listen
	return serviceUnit{topology.Gateway, cfg.Service, func(ctx context.Context) error { return gateway.Run(ctx, cfg) }}
}

// makeDevKeys makes sure the dev tenant, its key and an operator key
// exist: the keys kept in the data folder are used again while the
// IDENTITY bucket still knows them, else new ones are made.
func (s *devStack) makeDevKeys(ctx context.Context) error {
	conn, err := bus.Connect(ctx, bus.Config{URL: s.natsURL, Name: "shizu-dev-keys", User: topology.Admin, Password: s.passwords[topology.Admin]}, bus.Instruments{})
	if err != nil {
		return fmt.Errorf("dev keys: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	dir, err := identity.Open(ctx, conn.JetStream())
	if err != nil {
		return fmt.Errorf("dev keys: %w", err)
	}
	keys, err := ensureDevKeys(ctx, dir, filepath.Join(s.dataDir, "api-keys.json"))
	if err != nil {
		return fmt.Errorf("dev keys: %w", err)
	}
	s.keys = keys
	return s.waitKeyTaken(ctx)
}

// waitKeyTaken waits until the gateway takes the tenant key (its watched
// cache has it within milliseconds), so the first verb is not refused.
func (s *devStack) waitKeyTaken(ctx context.Context) error {
	c, err := newAPIClient(s.apiURL, s.keys.Key, "", 2*time.Second)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := c.do(ctx, request{method: http.MethodGet, path: "/v1/rentals?limit=1"}, nil)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("the gateway does not take the dev key: %w", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// ensureDevKeys returns the keys kept at path when dir still takes them,
// else makes the tenant (when missing) and new keys, and keeps them.
func ensureDevKeys(ctx context.Context, dir *identity.Directory, path string) (devKeys, error) {
	var kept devKeys
	if b, err := os.ReadFile(path); err == nil && json.Unmarshal(b, &kept) == nil && kept.Tenant == devTenant {
		tk, err1 := dir.Authenticate(ctx, kept.Key)
		ok, err2 := dir.Authenticate(ctx, kept.Operator)
		if err1 == nil && err2 == nil && tk.Tenant == devTenant && tk.CanWrite() && ok.Scope == identity.Operator {
			return kept, nil
		}
		for _, err := range []error{err1, err2} {
			if err != nil && !errors.Is(err, identity.ErrUnauthenticated) {
				return devKeys{}, err
			}
		}
	}
	if _, err := dir.CreateTenant(ctx, devTenant, "shizu dev"); err != nil && !fault.IsConflict(err) {
		return devKeys{}, err
	}
	_, key, err := dir.CreateKey(ctx, devTenant, identity.ReadWrite, "shizu dev")
	if err != nil {
		return devKeys{}, err
	}
	_, op, err := dir.CreateKey(ctx, "", identity.Operator, "shizu dev operator")
	if err != nil {
		return devKeys{}, err
	}
	keys := devKeys{Tenant: devTenant, Key: key, Operator: op, created: true}
	b, _ := json.MarshalIndent(keys, "", "  ")
	if err := writePrivate(path, append(b, '\n')); err != nil {
		return devKeys{}, err
	}
	return keys, nil
}

// devEnvAPI is the env file's lines for the tenant verbs.
func (s *devStack) devEnvAPI() string {
	return fmt.Sprintf("export %s=%s\nexport %s=%s\nexport %s=%s\n", envAPIURL, s.apiURL, envAPIKey, s.keys.Key, envOperatorKey, s.keys.Operator)
}

// printAPI says where the gateway is and that the key was saved; a key
// made by this start is printed, once.
func (s *devStack) printAPI(stdout io.Writer) {
	fmt.Fprintf(stdout, "\nTenant API: %s (OpenAPI document at %s/v1/openapi.json)\n", s.apiURL, s.apiURL)
	fmt.Fprintf(stdout, "API key of tenant %s saved in %s (SHIZU_API_KEY; the shizu verbs read it from there)\n", s.keys.Tenant, s.envPath)
	if s.keys.created {
		fmt.Fprintf(stdout, "  new key, shown only now: %s\n", s.keys.Key)
	}
}
