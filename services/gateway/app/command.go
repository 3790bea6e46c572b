package app

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/shizu-gpu/shizu/services/gateway/identity"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// IsCommand says whether name is one of the gateway's one-shot commands
// (tenant, key) rather than a flag of the server.
func IsCommand(name string) bool { return name == "tenant" || name == "key" }

// Command runs "tenant create|ls" or "key create|ls|revoke" against the
// IDENTITY bucket and prints the result as JSON; it returns the exit code
// (0 ok, 1 failed, 2 bad usage).
func Command(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) < 2 {
		fmt.Fprintln(stderr, "usage: gateway tenant create|ls [flags] | gateway key create|ls|revoke [flags]")
		return 2
	}
	cfg := DefaultConfig()
	fs := flag.NewFlagSet("gateway "+args[0]+" "+args[1], flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg.Service.RegisterFlags(fs)
	id := fs.String("id", "", "tenant id (tenant create) or key id (key revoke)")
	name := fs.String("name", "", "a name for people (tenant create, key create)")
	tenant := fs.String("tenant", "", "the key's tenant (key create, key ls)")
	scope := fs.String("scope", string(identity.ReadWrite), "read-only, read-write or operator (key create)")
	if err := fs.Parse(args[2:]); err != nil {
		return 2
	}
	if err := cfg.Service.Validate(); err != nil {
		fmt.Fprintf(stderr, "gateway %s: invalid configuration:\n%v\n", args[0], err)
		return 2
	}
	conn, err := bus.Connect(ctx, cfg.Service.NATS, bus.Instruments{})
	if err != nil {
		fmt.Fprintf(stderr, "gateway %s: %v\n", args[0], err)
		return 1
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	// The bucket is the running gateway's (it creates it at start, with
	// its -replicas): a command never creates or resizes it.
	dir, err := identity.Open(ctx, conn.JetStream())
	if err != nil {
		fmt.Fprintf(stderr, "gateway %s: %v (is a gateway running on this NATS? it creates the %s bucket)\n", args[0], err, topology.IdentityBucket)
		return 1
	}
	out, err := identityCommand(ctx, dir, args[0]+" "+args[1], *id, *name, *tenant, identity.Scope(*scope))
	if errors.Is(err, errUsage) {
		fmt.Fprintf(stderr, "gateway: %v\n", err)
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "gateway %s %s: %v\n", args[0], args[1], err)
		return 1
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		return 1
	}
	return 0
}

var errUsage = errors.New("want tenant create|ls or key create|ls|revoke")

// createdKey is what key create prints: the key and, once, its secret.
type createdKey struct {
	identity.Key
	Secret string `json:"secret"`
	Note   string `json:"note"`
}

func identityCommand(ctx context.Context, dir *identity.Directory, verb, id, name, tenant string, scope identity.Scope) (any, error) {
	switch verb {
	case "tenant create":
		return dir.CreateTenant(ctx, id, name)
	case "tenant ls":
		return dir.ListTenants(ctx)
	case "key create":
		k, secret, err := dir.CreateKey(ctx, tenant, scope, name)
		if err != nil {
			return nil, err
		}
		return createdKey{Key: k, Secret: secret, Note: "the secret is shown only now: keep it; only its hash is stored"}, nil
	case "key ls":
		return dir.ListKeys(ctx, tenant)
	case "key revoke":
		return dir.RevokeKey(ctx, id)
	}
	return nil, fmt.Errorf("%q: %w", verb, errUsage)
}
