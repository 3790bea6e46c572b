package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shizu-gpu/shizu/services/gateway/identity"
	"github.com/shizu-gpu/shizu/shared/fault"
)

// The operator's verbs for tenants and API keys: they read and write the
// IDENTITY bucket (services/gateway/identity) over NATS as the admin, as
// the other operator verbs do.

// openIdentity connects and binds the IDENTITY bucket; close ends the
// connection.
func openIdentity(ctx context.Context, cf *clientFlags) (dir *identity.Directory, closeFn func(), err error) {
	conn, _, err := cf.connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	closeFn = func() { _ = conn.Close(context.WithoutCancel(ctx)) }
	dir, err = identity.Open(ctx, conn.JetStream())
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		closeFn()
		return nil, nil, errors.New("no IDENTITY bucket: the gateway makes it when it starts (shizu dev runs one)")
	}
	if err != nil {
		closeFn()
		return nil, nil, err
	}
	return dir, closeFn, nil
}

// identityError puts the directory's errors in the CLI's terms: bad
// input exits 2, an unknown tenant or key 4.
func identityError(err error) error {
	switch {
	case err == nil:
		return nil
	case fault.IsInvalid(err):
		return usagef("%w", err)
	case fault.IsNotFound(err):
		return notFoundError{err}
	}
	return err
}

type notFoundError struct{ err error }

func (e notFoundError) Error() string { return e.err.Error() }
func (e notFoundError) Unwrap() error { return e.err }
func (notFoundError) exitCode() int   { return exitNotFound }

// identityVerb is one operator verb on the directory.
func identityVerb(name, summary, usage, examples string, flags func(fs *flag.FlagSet) func(context.Context, *identity.Directory, []string, io.Writer, bool) error) verb {
	return verb{name: name, summary: summary, usage: usage, examples: examples,
		setup: func(fs *flag.FlagSet) func(context.Context, []string, io.Writer) error {
			var cf clientFlags
			cf.register(fs)
			run := flags(fs)
			return func(ctx context.Context, args []string, stdout io.Writer) error {
				dir, closeFn, err := openIdentity(ctx, &cf)
				if err != nil {
					return err
				}
				defer closeFn()
				return identityError(run(ctx, dir, args, stdout, cf.output == "json"))
			}
		}}
}

func tenantsList(ctx context.Context, dir *identity.Directory, args []string, stdout io.Writer, asJSON bool) error {
	if len(args) > 0 {
		return usagef("unexpected argument %q (did you mean shizu tenants show %s?)", args[0], args[0])
	}
	ts, err := dir.ListTenants(ctx)
	if err != nil {
		return err
	}
	if ts == nil {
		ts = []identity.Tenant{}
	}
	if asJSON {
		return printJSON(stdout, ts)
	}
	tw := table(stdout)
	fmt.Fprintln(tw, "TENANT\tNAME\tCREATED")
	for _, t := range ts {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", t.ID, t.Name, t.CreatedAt.Local().Format(time.DateTime))
	}
	if len(ts) == 0 {
		fmt.Fprintln(tw, "(no tenants: make one with `shizu tenants create <id>`)")
	}
	return tw.Flush()
}

var tenantsVerb = identityVerb("tenants", "The platform's tenants (operator).", "[flags]",
	"  shizu tenants\n  shizu tenants create acme -name \"Acme Corp\"\n  shizu tenants show acme\n",
	func(*flag.FlagSet) func(context.Context, *identity.Directory, []string, io.Writer, bool) error {
		return tenantsList
	})

var tenantsLsVerb = identityVerb("tenants ls", "List the platform's tenants (operator).", "[flags]", "  shizu tenants ls -o json\n",
	func(*flag.FlagSet) func(context.Context, *identity.Directory, []string, io.Writer, bool) error {
		return tenantsList
	})

var tenantsCreateVerb = identityVerb("tenants create", "Record a tenant (operator); then make its key with shizu keys create.", "<tenant> [-name NAME]",
	"  shizu tenants create acme -name \"Acme Corp\"\n  shizu keys create -tenant acme\n",
	func(fs *flag.FlagSet) func(context.Context, *identity.Directory, []string, io.Writer, bool) error {
		name := fs.String("name", "", "a name for people (default: the id)")
		return func(ctx context.Context, dir *identity.Directory, args []string, stdout io.Writer, asJSON bool) error {
			if len(args) != 1 {
				return usagef("want one tenant id (1..63 of a-z, 0-9 and '-')")
			}
			t, err := dir.CreateTenant(ctx, args[0], *name)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(stdout, t)
			}
			fmt.Fprintf(stdout, "tenant %s (%s) created; make its API key with: shizu keys create -tenant %s\n", t.ID, t.Name, t.ID)
			return nil
		}
	})

var tenantsShowVerb = identityVerb("tenants show", "Show a tenant and its API keys, never their secrets (operator).", "<tenant> [flags]",
	"  shizu tenants show acme\n",
	func(*flag.FlagSet) func(context.Context, *identity.Directory, []string, io.Writer, bool) error {
		return func(ctx context.Context, dir *identity.Directory, args []string, stdout io.Writer, asJSON bool) error {
			if len(args) != 1 {
				return usagef("want one tenant id (see shizu tenants ls)")
			}
			t, err := dir.GetTenant(ctx, args[0])
			if err != nil {
				return err
			}
			keys, err := dir.ListKeys(ctx, t.ID)
			if err != nil {
				return err
			}
			if asJSON {
				if keys == nil {
					keys = []identity.Key{}
				}
				return printJSON(stdout, struct {
					identity.Tenant
					Keys []identity.Key `json:"keys"`
				}{t, keys})
			}
			fmt.Fprintf(stdout, "tenant %s (%s), created %s\n\n", t.ID, t.Name, t.CreatedAt.Local().Format(time.DateTime))
			return printKeys(stdout, keys)
		}
	})

func printKeys(stdout io.Writer, keys []identity.Key) error {
	tw := table(stdout)
	fmt.Fprintln(tw, "KEY\tTENANT\tSCOPE\tNAME\tCREATED\tREVOKED")
	for _, k := range keys {
		revoked := "-"
		if k.RevokedAt != nil {
			revoked = k.RevokedAt.Local().Format(time.DateTime)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, dash(k.Tenant), k.Scope, dash(k.Name), k.CreatedAt.Local().Format(time.DateTime), revoked)
	}
	if len(keys) == 0 {
		fmt.Fprintln(tw, "(no keys: make one with `shizu keys create`)")
	}
	return tw.Flush()
}

func keysList(fs *flag.FlagSet) func(context.Context, *identity.Directory, []string, io.Writer, bool) error {
	tenant := fs.String("tenant", "", "only this tenant's keys")
	operator := fs.Bool("operator", false, "only the operator keys")
	return func(ctx context.Context, dir *identity.Directory, args []string, stdout io.Writer, asJSON bool) error {
		if len(args) > 0 {
			return usagef("unexpected argument %q", args[0])
		}
		if *operator && *tenant != "" {
			return usagef("-operator and -tenant %s: an operator key belongs to no tenant; pass one of them", *tenant)
		}
		t := *tenant
		if *operator {
			t = identity.OperatorTenant
		}
		keys, err := dir.ListKeys(ctx, t)
		if err != nil {
			return err
		}
		if asJSON {
			if keys == nil {
				keys = []identity.Key{}
			}
			return printJSON(stdout, keys)
		}
		return printKeys(stdout, keys)
	}
}

var keysVerb = identityVerb("keys", "API keys (operator): list, create, revoke.", "[flags]",
	"  shizu keys\n  shizu keys create -tenant acme\n  shizu keys revoke 0123456789ab\n", keysList)

var keysLsVerb = identityVerb("keys ls", "List API keys, never their secrets (operator).", "[-tenant T | -operator] [flags]",
	"  shizu keys ls -tenant acme\n  shizu keys ls -operator -o json\n", keysList)

// createdKey is what keys create -o json prints: the key and, once, its
// secret.
type createdKey struct {
	identity.Key
	Secret string `json:"secret"`
}

var keysCreateVerb = identityVerb("keys create", "Make an API key (operator); its secret is printed once, only its hash is kept.",
	"-tenant T [-read-only] | -operator [-name NAME]",
	"  shizu keys create -tenant acme                 # read-write\n  shizu keys create -tenant acme -read-only -name dashboards\n  shizu keys create -operator\n",
	func(fs *flag.FlagSet) func(context.Context, *identity.Directory, []string, io.Writer, bool) error {
		tenant := fs.String("tenant", "", "the tenant the key acts for")
		readOnly := fs.Bool("read-only", false, "a key that may read but not rent or stop")
		operator := fs.Bool("operator", false, "an operator key (belongs to no tenant; the operator endpoints only)")
		name := fs.String("name", "", "a name for people, e.g. what uses the key")
		return func(ctx context.Context, dir *identity.Directory, args []string, stdout io.Writer, asJSON bool) error {
			scope := identity.ReadWrite
			switch {
			case len(args) > 0:
				return usagef("unexpected argument %q (pass the tenant with -tenant)", args[0])
			case *operator && (*tenant != "" || *readOnly):
				return usagef("-operator: an operator key belongs to no tenant and is not read-only; leave out -tenant and -read-only")
			case *operator:
				scope = identity.Operator
			case *tenant == "":
				return usagef("want -tenant T (a tenant's key) or -operator")
			case *readOnly:
				scope = identity.ReadOnly
			}
			k, secret, err := dir.CreateKey(ctx, *tenant, scope, *name)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(stdout, createdKey{Key: k, Secret: secret})
			}
			who := "tenant " + k.Tenant
			if k.Scope == identity.Operator {
				who = "the operator"
			}
			fmt.Fprintf(stdout, "key %s (%s) for %s:\n\n  %s\n\nThe secret is shown only now: keep it (only its hash is stored). Use it with: shizu login\n",
				k.ID, k.Scope, who, secret)
			return nil
		}
	})

var keysRevokeVerb = identityVerb("keys revoke", "Revoke an API key (operator): every gateway refuses it within a second.", "<key id> [flags]",
	"  shizu keys revoke 0123456789ab\n",
	func(*flag.FlagSet) func(context.Context, *identity.Directory, []string, io.Writer, bool) error {
		return func(ctx context.Context, dir *identity.Directory, args []string, stdout io.Writer, asJSON bool) error {
			if len(args) != 1 {
				return usagef("want one key id (the 12 hex characters after shz_; see shizu keys ls)")
			}
			id := args[0]
			if whole, ok := strings.CutPrefix(id, "shz_"); ok && len(whole) > 12 {
				id = whole[:12] // a whole key names its id
			}
			k, err := dir.RevokeKey(ctx, id)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(stdout, k)
			}
			fmt.Fprintf(stdout, "key %s (%s, %s) revoked at %s\n", k.ID, dash(k.Tenant), k.Scope, k.RevokedAt.Local().Format(time.DateTime))
			return nil
		}
	})
