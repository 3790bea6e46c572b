package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// exit codes
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

// usageError is a command line mistake: exit 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// usagef formats a command line mistake as fmt.Errorf does (%w keeps the
// cause).
func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// clientFlags are the connection flags every verb that talks to the
// platform takes. Precedence: flag, then SHIZU_* environment, then the env
// file a running `shizu dev` wrote in its data folder.
type clientFlags struct {
	devDir   string
	url      string
	user     string
	password string
	redisURL string
	ca       string
	output   string
	timeout  time.Duration
}

func (c *clientFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.devDir, "dev-dir", envOr("SHIZU_DEV_DIR", ".shizu"), "data folder of a running shizu dev, whose env file gives the credentials [SHIZU_DEV_DIR]")
	fs.StringVar(&c.url, "nats-url", "", "NATS server URL (default: SHIZU_NATS_URL, else the dev env file)")
	fs.StringVar(&c.user, "nats-user", "", "NATS user (default: SHIZU_NATS_USER, else admin)")
	fs.StringVar(&c.password, "nats-password", "", "NATS password; prefer SHIZU_NATS_PASSWORD or the dev env file")
	fs.StringVar(&c.redisURL, "redis-url", "", "Redis URL, for the capacity view (default: SHIZU_REDIS_URL, else the dev env file)")
	fs.StringVar(&c.ca, "nats-ca", os.Getenv("SHIZU_NATS_CA"), "CA certificate (PEM); enables TLS [SHIZU_NATS_CA]")
	fs.StringVar(&c.output, "o", "table", "output: table or json")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "how long to wait for the platform")
}

// resolved is the connection the flags, environment and env file name.
type resolved struct {
	bus      bus.Config
	redisURL string
	from     string // where the URL came from, for error messages
}

func (c *clientFlags) resolve() (resolved, error) {
	if c.output != "table" && c.output != "json" {
		return resolved{}, usagef("-o %q: want table or json", c.output)
	}
	fileVals := map[string]string{}
	envFile := filepath.Join(c.devDir, "env")
	if f, err := os.Open(envFile); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			k, v, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(sc.Text()), "export "), "=")
			if ok {
				fileVals[k] = v
			}
		}
		_ = f.Close()
	}
	pick := func(flagVal, env string) (string, string) {
		if flagVal != "" {
			return flagVal, "flag"
		}
		if v := os.Getenv(env); v != "" {
			return v, env
		}
		if v := fileVals[env]; v != "" {
			return v, envFile
		}
		return "", ""
	}
	var r resolved
	url, from := pick(c.url, "SHIZU_NATS_URL")
	if url == "" {
		return r, fmt.Errorf("no platform to talk to: no -nats-url, no SHIZU_NATS_URL and no %s; start one with `shizu dev` (or pass -dev-dir)", envFile)
	}
	user, _ := pick(c.user, "SHIZU_NATS_USER")
	if user == "" {
		user = topology.Admin
	}
	pw, _ := pick(c.password, "SHIZU_NATS_PASSWORD")
	r.redisURL, _ = pick(c.redisURL, "SHIZU_REDIS_URL")
	r.bus = bus.Config{URL: url, Name: "shizu-cli", User: user, Password: pw, CAFile: c.ca, ConnectTimeout: 3 * time.Second}
	r.from = from
	return r, nil
}

// connect opens the bus; an unreachable server is one line saying how to
// start one.
func (c *clientFlags) connect(ctx context.Context) (*bus.Conn, resolved, error) {
	r, err := c.resolve()
	if err != nil {
		return nil, r, err
	}
	conn, err := bus.Connect(ctx, r.bus, bus.Instruments{})
	if err != nil {
		hint := "is `shizu dev` running? start it with `shizu dev`"
		if r.from != envFileName(c.devDir) && r.from != "" {
			hint += " (URL from " + r.from + ")"
		}
		return nil, r, fmt.Errorf("cannot reach the platform at %s: %s; %s", r.bus.URL, oneLine(err), hint)
	}
	return conn, r, nil
}

func envFileName(dir string) string { return filepath.Join(dir, "env") }

// oneLine keeps the first line of an error, so nothing prints a trace.
func oneLine(err error) string {
	s := err.Error()
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}

// event is one stored event with its stream position.
type event struct {
	Seq     uint64
	Subject string
	Msg     proto.Message
}

// readStream returns every event stored in stream under the filters, in
// stream order, decoding each by its Shizu-Event header. Events of unknown
// types are skipped.
func readStream(ctx context.Context, c *bus.Conn, stream string, filters ...string) ([]event, error) {
	js := c.JetStream()
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: filters, DeliverPolicy: jetstream.DeliverAllPolicy}
	cons, err := js.OrderedConsumer(ctx, stream, cfg)
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("stream %s does not exist: run `shizu provision` (shizu dev does it)", stream)
		}
		return nil, fmt.Errorf("read %s: %w", stream, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", stream, err)
	}
	pending := info.NumPending
	var out []event
	for pending > 0 {
		batch, err := cons.Fetch(int(min(pending, 500)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", stream, err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			meta, err := m.Metadata()
			if err != nil {
				continue
			}
			pending = meta.NumPending
			if ev := decode(m.Headers().Get(bus.HeaderEvent), m.Data()); ev != nil {
				out = append(out, event{Seq: meta.Sequence.Stream, Subject: m.Subject(), Msg: ev})
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return nil, fmt.Errorf("read %s: %w", stream, err)
		}
		if got == 0 {
			break
		}
	}
	return out, nil
}

func decode(name string, data []byte) proto.Message {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(name))
	if err != nil {
		return nil
	}
	m := mt.New().Interface()
	if proto.Unmarshal(data, m) != nil {
		return nil
	}
	return m
}

// cliSource is the source of the events the CLI publishes.
const cliSource = "shizu-cli"

// printJSON writes v indented.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }

// verb is a subcommand: its flag set is built by setup, and run does the
// work. Errors are printed as one line: usageError exits 2, others 1.
type verb struct {
	name     string
	summary  string
	usage    string // argument synopsis
	examples string
	setup    func(fs *flag.FlagSet) func(ctx context.Context, args []string, stdout io.Writer) error
	// subs are sub-commands (`shizu pools apply`), see verb.with.
	subs []verb
}

func (v verb) main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if sub, ok := v.sub(args); ok {
		return sub.main(ctx, args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("shizu "+v.name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	run := v.setup(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "%s\n\nUsage:\n  shizu %s %s\n\nExamples:\n%s\nFlags:\n", v.summary, v.name, v.usage, v.examples)
		fs.PrintDefaults()
	}
	// Flags may follow positional arguments (`shizu show r-1 -o json`);
	// everything after "--" is positional as is (a command to run).
	var positional, tail []string
	rest := args
	for i, a := range args {
		if a == "--" {
			rest, tail = args[:i], args[i+1:]
			break
		}
	}
	for {
		if err := parseFlags(fs, rest, stderr); err != nil {
			return flagExit(err)
		}
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	positional = append(positional, tail...)
	if err := run(ctx, positional, stdout); err != nil {
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(stderr, "shizu %s: %s %s\n", v.name, oneLine(err), helpHint("shizu "+v.name))
			return exitUsage
		}
		fmt.Fprintf(stderr, "shizu %s: %s\n", v.name, oneLine(err))
		return exitCodeOf(err)
	}
	return exitOK
}
