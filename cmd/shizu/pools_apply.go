package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/autoscaler/policy"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// poolsApplyVerb is `shizu pools apply`: declare (or replace) an autoscaled
// pool through the bus, from one pool of the policy file's format.
var poolsApplyVerb = verb{
	name:    "pools apply",
	summary: "Declare or replace an autoscaled pool: publish its policy (one pool in the policy file's JSON format) to the autoscaler.",
	usage:   "-f pool.json [flags]",
	examples: `  shizu pools apply -f chat-api.json
  cat chat-api.json | shizu pools apply -f -
`,
	setup: func(fs *flag.FlagSet) func(context.Context, []string, io.Writer) error {
		var cf clientFlags
		cf.register(fs)
		file := fs.String("f", "", "the pool's policy, JSON (\"-\" reads stdin); required")
		return func(ctx context.Context, args []string, stdout io.Writer) error {
			if len(args) > 0 {
				return usagef("unexpected arguments %q; the pool comes from -f", args)
			}
			if *file == "" {
				return usagef("-f: required (the pool's policy file, or - for stdin)")
			}
			data, err := readPoolFile(*file)
			if err != nil {
				return err
			}
			// The autoscaler checks again with the same rules; checking here
			// names every problem before anything is published.
			pool, err := policy.ParsePool(data)
			if err != nil {
				// Errors print as one line: every problem, separated by "; ".
				return usagef("%s: %s", *file, strings.ReplaceAll(err.Error(), "\n", "; "))
			}
			ev := &shizuv1.PoolDeclared{PoolId: pool.ID, TenantId: pool.Tenant, PolicyJson: data}
			if err := publishPool(ctx, cf, ev); err != nil {
				return err
			}
			if cf.output == "json" {
				return printJSON(stdout, poolPublished{Pool: pool.ID, Tenant: pool.Tenant, Declared: true,
					MinReplicas: pool.MinReplicas, MaxReplicas: pool.MaxReplicas, GPUs: pool.Rental.GPUCount})
			}
			fmt.Fprintf(stdout, "pool %s of %s declared: %d to %d replicas of %d GPU(s).\n", pool.ID, pool.Tenant,
				pool.MinReplicas, pool.MaxReplicas, pool.Rental.GPUCount)
			fmt.Fprint(stdout, deadLetterHint)
			return nil
		}
	},
}

// poolPublished is what `shizu pools apply` and `withdraw` print with
// -o json: what was published (the autoscaler may still refuse it).
type poolPublished struct {
	Pool        string `json:"pool_id"`
	Tenant      string `json:"tenant_id"`
	Declared    bool   `json:"declared,omitempty"`
	Withdrawn   bool   `json:"withdrawn,omitempty"`
	MinReplicas int    `json:"min_replicas,omitempty"`
	MaxReplicas int    `json:"max_replicas,omitempty"`
	GPUs        int32  `json:"gpus_per_replica,omitempty"`
}

// deadLetterHint follows a published declaration or withdrawal: the
// command cannot know whether the autoscaler accepted it.
const deadLetterHint = "The autoscaler refuses a pool of its policy file or another tenant's: see dead letters on dlq.SCALING.autoscaler-pools.\n"

// poolsWithdrawVerb is `shizu pools withdraw`: the autoscaler cancels the
// pool's replicas and forgets it.
var poolsWithdrawVerb = verb{
	name:     "pools withdraw",
	summary:  "Withdraw a pool declared with `shizu pools apply`: the autoscaler cancels its replicas and forgets its policy.",
	usage:    "<pool> [flags]",
	examples: "  shizu pools withdraw chat-api -tenant acme\n",
	setup: func(fs *flag.FlagSet) func(context.Context, []string, io.Writer) error {
		var cf clientFlags
		cf.register(fs)
		tenant := tenantFlag(fs)
		return func(ctx context.Context, args []string, stdout io.Writer) error {
			if len(args) != 1 {
				return usagef("want exactly one pool id")
			}
			ev := &shizuv1.PoolDeclared{PoolId: args[0], TenantId: *tenant, Withdrawn: true}
			if err := publishPool(ctx, cf, ev); err != nil {
				return err
			}
			if cf.output == "json" {
				return printJSON(stdout, poolPublished{Pool: args[0], Tenant: *tenant, Withdrawn: true})
			}
			fmt.Fprintf(stdout, "withdrawal of pool %s of %s published: the autoscaler cancels its replicas and forgets its policy.\n", args[0], *tenant)
			fmt.Fprint(stdout, deadLetterHint)
			return nil
		}
	},
}

func readPoolFile(name string) ([]byte, error) {
	if name == "-" {
		return io.ReadAll(os.Stdin)
	}
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, usagef("-f: %w", err)
	}
	return data, nil
}

// publishPool validates ev, gives it an envelope and publishes it on
// scale.<pool>.declared.
func publishPool(ctx context.Context, cf clientFlags, ev *shizuv1.PoolDeclared) error {
	now := time.Now()
	ev.Meta = shizuv1.NewMeta("pool:"+ev.GetPoolId()+":declared:"+strconv.FormatInt(now.UnixNano(), 10), cliSource, "", ev.GetPoolId(), now)
	if err := ev.Validate(); err != nil {
		return invalid(err, fieldWords{"pool_id": "pool id", "tenant_id": "-tenant", "policy_json": "the pool file (-f)"})
	}
	subj, err := subject.Format(subject.ScalePoolDeclared, ev.GetPoolId())
	if err != nil {
		return usagef("pool id: %w", err)
	}
	conn, _, err := cf.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Publish(ctx, subj, ev); err != nil {
		return fmt.Errorf("publish the pool: %w", err)
	}
	return nil
}

// with gives v sub-commands, each named "<v.name> <sub>".
func (v verb) with(subs ...verb) verb {
	v.subs = append(v.subs, subs...)
	v.summary += " Sub-commands:"
	for _, s := range subs {
		v.summary += " " + strings.TrimPrefix(s.name, v.name+" ")
	}
	v.summary += " (shizu " + v.name + " <sub-command> -h)."
	return v
}

// sub is the sub-command args start with, if any.
func (v verb) sub(args []string) (verb, bool) {
	if len(args) == 0 {
		return verb{}, false
	}
	for _, s := range v.subs {
		if s.name == v.name+" "+args[0] {
			return s, true
		}
	}
	return verb{}, false
}
