package service

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"
)

// Flags registers a service's flags on a flag set, each bound to an
// environment variable: SHIZU_<SERVICE>_<FLAG>, the flag name upper-cased
// with '-' as '_' (-spot-capacity of the autoscaler is
// SHIZU_AUTOSCALER_SPOT_CAPACITY). A variable is a flag's default, so a
// flag given on the command line wins over it. A flag may also keep an
// older variable name (Alias), read when its own variable is unset.
//
// A value in the environment that does not parse is not a silent default:
// it is recorded, naming the variable, the value and what was expected,
// and reported by Config.Validate with every other problem.
//
// Main's own -validate and -healthcheck are commands, not configuration,
// and have no variable.
type Flags struct {
	fs      *flag.FlagSet
	service string
	errs    *[]error
}

// EnvVar is the variable of flag on service name: SHIZU_<SERVICE>_<FLAG>
// (SHIZU_NODE_AGENT_HEARTBEAT_TTL for -heartbeat-ttl of "node-agent").
func EnvVar(service, flagName string) string {
	return "SHIZU_" + envToken(service) + "_" + envToken(flagName)
}

func envToken(s string) string { return strings.ToUpper(strings.ReplaceAll(s, "-", "_")) }

// Flags returns the registrar of the service's own flags on fs: their
// variables start with SHIZU_<c.Name>_ and their parse errors are
// reported by c.Validate.
func (c *Config) Flags(fs *flag.FlagSet) *Flags {
	return &Flags{fs: fs, service: c.Name, errs: &c.envErrs}
}

// FlagOption adjusts one flag's binding.
type FlagOption func(*binding)

type binding struct {
	aliases  []string
	expected string
}

// Alias keeps an existing, documented variable name for a flag (e.g.
// SHIZU_NATS_URL, shared by every service); the flag's own
// SHIZU_<SERVICE>_<FLAG> variable wins when both are set.
func Alias(name string) FlagOption {
	return func(b *binding) { b.aliases = append(b.aliases, name) }
}

// Expect says what a flag's value must look like ("a price, e.g. 2.49"),
// for the message about a variable that does not parse. Typed flags have
// one already.
func Expect(what string) FlagOption {
	return func(b *binding) { b.expected = what }
}

// String registers a string flag.
func (f *Flags) String(p *string, name, usage string, opts ...FlagOption) {
	f.fs.StringVar(p, name, *p, usage)
	f.bind(name, "", opts)
}

// Int registers an int flag.
func (f *Flags) Int(p *int, name, usage string, opts ...FlagOption) {
	f.fs.IntVar(p, name, *p, usage)
	f.bind(name, "a whole number", opts)
}

// Int64 registers an int64 flag.
func (f *Flags) Int64(p *int64, name, usage string, opts ...FlagOption) {
	f.fs.Int64Var(p, name, *p, usage)
	f.bind(name, "a whole number", opts)
}

// Float64 registers a float64 flag.
func (f *Flags) Float64(p *float64, name, usage string, opts ...FlagOption) {
	f.fs.Float64Var(p, name, *p, usage)
	f.bind(name, "a number", opts)
}

// Bool registers a bool flag.
func (f *Flags) Bool(p *bool, name, usage string, opts ...FlagOption) {
	f.fs.BoolVar(p, name, *p, usage)
	f.bind(name, "true or false", opts)
}

// Duration registers a duration flag.
func (f *Flags) Duration(p *time.Duration, name, usage string, opts ...FlagOption) {
	f.fs.DurationVar(p, name, *p, usage)
	f.bind(name, "a duration (e.g. 15s)", opts)
}

// Var registers a flag of any flag.Value (a list, a price); pass Expect to
// say what a valid value looks like.
func (f *Flags) Var(v flag.Value, name, usage string, opts ...FlagOption) {
	f.fs.Var(v, name, usage)
	f.bind(name, "", opts)
}

// bind applies the flag's variable (or its first alias that is set) to
// the flag just registered, and names the variables in its help text.
func (f *Flags) bind(name, expected string, opts []FlagOption) {
	b := binding{expected: expected}
	for _, o := range opts {
		o(&b)
	}
	fl := f.fs.Lookup(name)
	vars := append([]string{EnvVar(f.service, name)}, b.aliases...)
	fl.Usage = fmt.Sprintf("%s [%s]", fl.Usage, strings.Join(vars, ", "))
	for _, key := range vars {
		v, ok := os.LookupEnv(key)
		if !ok {
			continue
		}
		if err := fl.Value.Set(v); err != nil {
			*f.errs = append(*f.errs, envError(key, v, b.expected, err))
			return
		}
		fl.DefValue = fl.Value.String()
		return
	}
}

func envError(key, value, expected string, err error) error {
	if expected == "" {
		return fmt.Errorf("%s: %q is not valid: %w", key, value, err)
	}
	return fmt.Errorf("%s: %q is not %s", key, value, expected)
}
