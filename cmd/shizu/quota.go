package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/quota"
)

// quotaVerb is the operator's view of per-tenant quotas (shared/quota):
// the QUOTAS bucket every scheduler replica watches.
var quotaVerb = verb{
	name:    "quota",
	summary: "Per-tenant quotas: how many GPUs a tenant may hold at once, in all and per model.",
	usage:   "<set|show|delete> [flags]",
	examples: `  shizu quota set -tenant acme -max-gpus 8 -model H100-SXM5-80GB=2
  shizu quota show -tenant acme
  shizu quota delete -tenant acme
`,
	setup: func(*flag.FlagSet) func(context.Context, []string, io.Writer) error {
		return func(context.Context, []string, io.Writer) error {
			return usagef("want a sub-command: set, show or delete (shizu quota set -h)")
		}
	},
}

// quotaTenant checks a show or delete command line: no arguments, a
// tenant that is a subject token.
func quotaTenant(args []string, tenant string) error {
	if len(args) > 0 {
		return usagef("unexpected argument %q", args[0])
	}
	if err := quota.CheckTenant(tenant); err != nil {
		return usagef("-tenant: %s", oneLine(err))
	}
	return nil
}

// openQuotas connects as cf says and binds the QUOTAS bucket; done closes
// the connection.
func openQuotas(ctx context.Context, cf *clientFlags) (*quota.Store, resolved, func(), error) {
	conn, r, err := cf.connect(ctx)
	if err != nil {
		return nil, r, nil, err
	}
	done := func() { _ = conn.Close(context.WithoutCancel(ctx)) }
	qs, err := quota.Open(ctx, conn.JetStream())
	if err != nil {
		done()
		return nil, r, nil, err
	}
	return qs, r, done, nil
}

var quotaSetVerb = verb{
	name:    "quota set",
	summary: "Set a tenant's quota (replacing the one it had): every scheduler replica enforces it on the tenant's next reservations.",
	usage:   "-tenant T -max-gpus N [-model MODEL=N ...] [flags]",
	examples: `  shizu quota set -tenant acme -max-gpus 8
  shizu quota set -tenant acme -max-gpus 8 -model H100-SXM5-80GB=2 -model A100-SXM4-80GB=4
`,
	setup: func(fs *flag.FlagSet) func(context.Context, []string, io.Writer) error {
		var cf clientFlags
		cf.register(fs)
		tenant := fs.String("tenant", "", "the tenant; required")
		maxGPUs := fs.Int64("max-gpus", -1, "most GPUs the tenant may hold at once (a fraction counts as its share); required")
		var models []string
		fs.Func("model", "MODEL=N: at most N GPUs of that model (repeatable)", func(v string) error {
			models = append(models, v)
			return nil
		})
		return func(ctx context.Context, args []string, stdout io.Writer) error {
			l, err := quotaLimits(args, *tenant, *maxGPUs, models)
			if err != nil {
				return err
			}
			qs, _, done, err := openQuotas(ctx, &cf)
			if err != nil {
				return err
			}
			defer done()
			if err := qs.Put(ctx, *tenant, l); err != nil {
				return err
			}
			if cf.output == "json" {
				return printJSON(stdout, map[string]any{"tenant": *tenant, "quota": l})
			}
			fmt.Fprintf(stdout, "quota of %s set: %s\n", *tenant, l)
			return nil
		}
	},
}

var quotaShowVerb = verb{
	name:    "quota show",
	summary: "Show a tenant's quota and, with a Redis URL, what it holds now.",
	usage:   "-tenant T [flags]",
	examples: `  shizu quota show -tenant acme
  shizu quota show -tenant acme -o json
`,
	setup: func(fs *flag.FlagSet) func(context.Context, []string, io.Writer) error {
		var cf clientFlags
		cf.register(fs)
		tenant := fs.String("tenant", "", "the tenant; required")
		return func(ctx context.Context, args []string, stdout io.Writer) error {
			if err := quotaTenant(args, *tenant); err != nil {
				return err
			}
			qs, r, done, err := openQuotas(ctx, &cf)
			if err != nil {
				return err
			}
			defer done()
			l, ok, err := qs.Get(ctx, *tenant)
			if err != nil {
				return err
			}
			u, err := tenantUsage(ctx, r.redisURL, *tenant)
			if err != nil {
				return err
			}
			return printQuota(stdout, cf.output, *tenant, l, ok, u)
		}
	},
}

var quotaDeleteVerb = verb{
	name:     "quota delete",
	summary:  "Remove a tenant's quota: it may then hold any number of GPUs.",
	usage:    "-tenant T [flags]",
	examples: "  shizu quota delete -tenant acme\n",
	setup: func(fs *flag.FlagSet) func(context.Context, []string, io.Writer) error {
		var cf clientFlags
		cf.register(fs)
		tenant := fs.String("tenant", "", "the tenant; required")
		return func(ctx context.Context, args []string, stdout io.Writer) error {
			if err := quotaTenant(args, *tenant); err != nil {
				return err
			}
			qs, _, done, err := openQuotas(ctx, &cf)
			if err != nil {
				return err
			}
			defer done()
			if err := qs.Delete(ctx, *tenant); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "quota of %s removed: it may hold any number of GPUs\n", *tenant)
			return nil
		}
	},
}

// parseModelLimit reads a -model value, MODEL=N.
func parseModelLimit(v string) (string, int64, error) {
	m, n, ok := strings.Cut(v, "=")
	if !ok || m == "" {
		return "", 0, fmt.Errorf("%q: want MODEL=N, e.g. H100-SXM5-80GB=2", v)
	}
	c, err := strconv.ParseInt(n, 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("%q: %s is not a whole number of GPUs", v, n)
	}
	return m, c, nil
}

// quotaLimits checks set's arguments and builds the limits.
func quotaLimits(args []string, tenant string, maxGPUs int64, models []string) (quota.Limits, error) {
	if len(args) > 0 {
		return quota.Limits{}, usagef("unexpected argument %q", args[0])
	}
	if err := quota.CheckTenant(tenant); err != nil {
		return quota.Limits{}, usagef("-tenant: %s", oneLine(err))
	}
	if maxGPUs < 0 {
		return quota.Limits{}, usagef("-max-gpus: required, a whole number of GPUs (0 allows none)")
	}
	l := quota.Limits{MaxGPUs: maxGPUs}
	for _, v := range models {
		m, n, err := parseModelLimit(v)
		if err != nil {
			return quota.Limits{}, usagef("-model %w", err)
		}
		if _, dup := l.MaxGPUsPerModel[m]; dup {
			return quota.Limits{}, usagef("-model: %s given twice", m)
		}
		if l.MaxGPUsPerModel == nil {
			l.MaxGPUsPerModel = map[string]int64{}
		}
		l.MaxGPUsPerModel[m] = n
	}
	if err := l.Validate(); err != nil {
		return quota.Limits{}, usagef("%s", oneLine(err))
	}
	return l, nil
}

// tenantUsage reads what the tenant holds from the capacity store; nil
// without a Redis URL.
func tenantUsage(ctx context.Context, redisURL, tenant string) (*capacity.Usage, error) {
	if redisURL == "" {
		return nil, nil
	}
	opts, err := redis.ParseURL(redisURL)
	if err != nil {
		return nil, usagef("-redis-url: %w", err)
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	store, err := capacity.New(rdb)
	if err != nil {
		return nil, err
	}
	u, err := store.Usage(ctx, tenant)
	if err != nil {
		return nil, fmt.Errorf("read the capacity store at %s: %s", opts.Addr, oneLine(err))
	}
	return &u, nil
}

func printQuota(w io.Writer, output, tenant string, l quota.Limits, ok bool, u *capacity.Usage) error {
	if output == "json" {
		out := map[string]any{"tenant": tenant, "quota": nil}
		if ok {
			out["quota"] = l
		}
		if u != nil {
			out["usage"] = map[string]any{"milli_gpu": u.MilliGPU, "milli_gpu_per_model": u.PerModel}
		}
		return printJSON(w, out)
	}
	if ok {
		fmt.Fprintf(w, "quota of %s: %s\n", tenant, l)
	} else {
		fmt.Fprintf(w, "%s has no quota: it may hold any number of GPUs\n", tenant)
	}
	if u != nil {
		fmt.Fprintf(w, "holds now: %s GPUs", capacity.FormatGPUs(u.MilliGPU))
		for _, m := range slices.Sorted(maps.Keys(u.PerModel)) {
			fmt.Fprintf(w, ", %s %s", capacity.FormatGPUs(u.PerModel[m]), m)
		}
		fmt.Fprintln(w)
	}
	return nil
}
