package service_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/shared/service"
)

// ownFlags is a service's own flag section, as a service registers it.
type ownFlags struct {
	Tick    time.Duration
	Workers int
	Policy  string
	Zone    string
	Fast    bool
}

func (o *ownFlags) register(c *service.Config, fs *flag.FlagSet) {
	f := c.Flags(fs)
	f.Duration(&o.Tick, "tick", "how often")
	f.Int(&o.Workers, "commit-workers", "parallel reserves")
	f.String(&o.Policy, "policy", "placement policy")
	f.String(&o.Zone, "zone", "zone of this node", service.Alias("SHIZU_NODE_ZONE"))
	f.Bool(&o.Fast, "fast-ack", "acknowledge without waiting")
}

func TestEnvVarIsTheServiceAndTheFlagUpperCased(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ service, flag, want string }{
		{"autoscaler", "spot-capacity", "SHIZU_AUTOSCALER_SPOT_CAPACITY"},
		{"node-agent", "heartbeat-ttl", "SHIZU_NODE_AGENT_HEARTBEAT_TTL"},
		{"scheduler", "tick", "SCHEDULER_TICK"},
	} {
		if got := service.EnvVar(c.service, c.flag); !strings.HasSuffix(got, c.want) || !strings.HasPrefix(got, "SHIZU_") {
			t.Errorf("EnvVar(%q, %q) = %q, want %q", c.service, c.flag, got, c.want)
		}
	}
}

func TestAVariableThatDoesNotParseFailsValidationNamingItTheValueAndWhatWasExpected(t *testing.T) {
	t.Setenv("SHIZU_SCHEDULER_TICK", "soon")
	t.Setenv("SHIZU_SCHEDULER_COMMIT_WORKERS", "four")
	t.Setenv("SHIZU_SCHEDULER_FAST_ACK", "maybe")
	t.Setenv("SHIZU_SHUTDOWN_TIMEOUT", "later")
	cfg := service.Defaults("scheduler")
	var own ownFlags
	fs := flag.NewFlagSet("scheduler", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	own.register(&cfg, fs)
	err := cfg.Validate()
	if err == nil {
		t.Fatal("variables that do not parse were accepted")
	}
	for _, want := range []string{
		`SHIZU_SCHEDULER_TICK: "soon" is not a duration (e.g. 15s)`,
		`SHIZU_SCHEDULER_COMMIT_WORKERS: "four" is not a whole number`,
		`SHIZU_SCHEDULER_FAST_ACK: "maybe" is not true or false`,
		`SHIZU_SHUTDOWN_TIMEOUT: "later" is not a duration (e.g. 15s)`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q:\n%v", want, err)
		}
	}
}

func TestMainExitsTwoListingEveryVariableThatDoesNotParse(t *testing.T) {
	t.Setenv("SHIZU_SCHEDULER_TICK", "soon")
	t.Setenv("SHIZU_SCHEDULER_COMMIT_WORKERS", "four")
	cfg := service.Defaults("scheduler")
	var own ownFlags
	var stderr bytes.Buffer
	code := service.Main([]string{"-validate"}, &stderr, service.Binary{
		Config:   &cfg,
		Flags:    func(fs *flag.FlagSet) { own.register(&cfg, fs) },
		Validate: func() error { return cfg.Validate() },
		Run:      func(context.Context) error { return errors.New("must not run") },
	})
	if code != 2 {
		t.Fatalf("exit code %d, want 2", code)
	}
	for _, want := range []string{"SHIZU_SCHEDULER_TICK", "SHIZU_SCHEDULER_COMMIT_WORKERS"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr does not mention %s:\n%s", want, stderr.String())
		}
	}
}

func TestTheCommandLineWinsOverTheEnvironment(t *testing.T) {
	t.Setenv("SHIZU_SCHEDULER_TICK", "3s")
	t.Setenv("SHIZU_SCHEDULER_POLICY", "fgd")
	t.Setenv("SHIZU_NATS_URL", "nats://from-env:4222")
	cfg := service.Defaults("scheduler")
	var own ownFlags
	fs := flag.NewFlagSet("scheduler", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	own.register(&cfg, fs)
	if own.Tick != 3*time.Second || own.Policy != "fgd" || cfg.NATS.URL != "nats://from-env:4222" {
		t.Fatalf("environment not applied: tick %s, policy %q, nats %q", own.Tick, own.Policy, cfg.NATS.URL)
	}
	if err := fs.Parse([]string{"-tick", "7s", "-nats-url", "nats://from-flag:4222"}); err != nil {
		t.Fatal(err)
	}
	if own.Tick != 7*time.Second || cfg.NATS.URL != "nats://from-flag:4222" {
		t.Errorf("flag lost to the environment: tick %s, nats %q", own.Tick, cfg.NATS.URL)
	}
	if own.Policy != "fgd" {
		t.Errorf("policy %q: a flag not on the command line keeps its variable", own.Policy)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestAFlagsOwnVariableWinsOverItsAlias(t *testing.T) {
	t.Setenv("SHIZU_NODE_ZONE", "old-name")
	cfg := service.Defaults("node-agent")
	var own ownFlags
	own.register(&cfg, flag.NewFlagSet("node-agent", flag.ContinueOnError))
	if own.Zone != "old-name" {
		t.Fatalf("zone %q: the alias SHIZU_NODE_ZONE is not read", own.Zone)
	}
	t.Setenv("SHIZU_NODE_AGENT_ZONE", "new-name")
	own = ownFlags{}
	own.register(&cfg, flag.NewFlagSet("node-agent", flag.ContinueOnError))
	if own.Zone != "new-name" {
		t.Fatalf("zone %q: SHIZU_NODE_AGENT_ZONE must win over the alias", own.Zone)
	}
}

func TestEveryFlagOfAServiceHasAVariableShownInItsHelp(t *testing.T) {
	t.Parallel()
	cfg := service.Defaults("scheduler")
	var own ownFlags
	fs := flag.NewFlagSet("scheduler", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	own.register(&cfg, fs)
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		n++
		if want := "[" + service.EnvVar("scheduler", f.Name); !strings.Contains(f.Usage, want) {
			t.Errorf("-%s help %q does not name %s]", f.Name, f.Usage, want)
		}
	})
	if n < 15 {
		t.Fatalf("%d flags visited", n)
	}
	if u := fs.Lookup("nats-url").Usage; !strings.HasSuffix(u, "[SHIZU_SCHEDULER_NATS_URL, SHIZU_NATS_URL]") {
		t.Errorf("-nats-url help %q does not name its alias", u)
	}
}

// words is a flag.Value: a command split on spaces.
type words []string

func (w *words) String() string { return strings.Join(*w, " ") }
func (w *words) Set(v string) error {
	if strings.TrimSpace(v) == "" {
		return errors.New("empty command")
	}
	*w = strings.Fields(v)
	return nil
}

func TestAnyFlagValueIsBoundAndSaysWhatItExpects(t *testing.T) {
	t.Setenv("SHIZU_DEFAULT_COMMAND", "sleep 60")
	cfg := service.Defaults("node-agent")
	cmd := words{"sleep", "infinity"}
	cfg.Flags(flag.NewFlagSet("node-agent", flag.ContinueOnError)).Var(&cmd, "default-command", "command of a rental that names none",
		service.Alias("SHIZU_DEFAULT_COMMAND"), service.Expect("a command, e.g. \"sleep infinity\""))
	if cmd.String() != "sleep 60" {
		t.Fatalf("command %q from SHIZU_DEFAULT_COMMAND", cmd.String())
	}
	t.Setenv("SHIZU_NODE_AGENT_DEFAULT_COMMAND", " ")
	cfg = service.Defaults("node-agent")
	cfg.Flags(flag.NewFlagSet("node-agent", flag.ContinueOnError)).Var(&cmd, "default-command", "command of a rental that names none",
		service.Alias("SHIZU_DEFAULT_COMMAND"), service.Expect("a command, e.g. \"sleep infinity\""))
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), `SHIZU_NODE_AGENT_DEFAULT_COMMAND: " " is not a command, e.g. "sleep infinity"`) {
		t.Fatalf("Validate = %v", err)
	}
}
