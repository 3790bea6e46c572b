package bus_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// garbage does not decode as any protobuf message.
var garbage = []byte{0xff, 0xff, 0xff, 0x01}

// poisonKinds are the kinds of input a consumer cannot use, each with what
// its dead letter's reason must say.
var poisonKinds = []struct {
	name, reason string
	msg          func(subj, want string) *nats.Msg
	// tenantOnly: the kind exists on tenant subjects only.
	tenantOnly bool
}{
	{"header-less bytes that do not decode", "decode", func(subj, _ string) *nats.Msg {
		m := nats.NewMsg(subj)
		m.Data = garbage
		return m
	}, false},
	{"a valid event of another type", "carries", func(subj, want string) *nats.Msg {
		var ev proto.Message = rentalRequested("other-"+subj, "r-other")
		if want == bus.EventName(&shizuv1.RentalRequested{}) {
			ev = &shizuv1.RentalCancelRequested{Meta: &shizuv1.EventMeta{EventId: "other-" + subj, OccurredAt: timestamppb.Now(), Source: "test"},
				RentalId: "r-other", TenantId: "acme", RequestedBy: "u"}
		}
		data, _ := proto.Marshal(ev)
		m := nats.NewMsg(subj)
		m.Data = data
		m.Header.Set(bus.HeaderEvent, bus.EventName(ev))
		return m
	}, false},
	{"an unknown type", "carries", func(subj, _ string) *nats.Msg {
		m := nats.NewMsg(subj)
		m.Data = garbage
		m.Header.Set(bus.HeaderEvent, "shizu.v9.FromTheFuture")
		return m
	}, false},
	{"a body naming another tenant than its subject", `"victim"`, func(subj, want string) *nats.Msg {
		m := nats.NewMsg(subj)
		m.Data = forgedBody(want, "victim")
		m.Header.Set(bus.HeaderEvent, want)
		return m
	}, true},
}

// forgedBody is an event of type event whose only field is tenant_id.
func forgedBody(event, tenant string) []byte {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(event))
	if err != nil {
		panic(err)
	}
	ev := mt.New()
	ev.Set(mt.Descriptor().Fields().ByName("tenant_id"), protoreflect.ValueOfString(tenant))
	data, err := proto.Marshal(ev.Interface())
	if err != nil {
		panic(err)
	}
	return data
}

// hasTenant reports whether events of type event name a tenant.
func hasTenant(event string) bool {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(event))
	return err == nil && mt.Descriptor().Fields().ByName("tenant_id") != nil
}

// concrete fills a subscribe-form pattern's wildcards with token.
func concrete(pattern, token string) string {
	toks := strings.Split(pattern, ".")
	for i, t := range toks {
		if t == "*" {
			toks[i] = token
		}
	}
	return strings.Join(toks, ".")
}

// declaredConsumers are every durable topology declares, with one node
// agent's command queue.
func declaredConsumers(t *testing.T) []bus.Consumer {
	t.Helper()
	var out []bus.Consumer
	for _, svc := range topology.Services() {
		out = append(out, svc.Consumers...)
	}
	agent, err := topology.AgentCommands("n1")
	if err != nil {
		t.Fatal(err)
	}
	return append(out, agent)
}

// carriedBy returns the subjects (subscribe form) spec receives, each
// with the event it carries.
func carriedBy(spec bus.Consumer) map[string]string {
	out := map[string]string{}
	for _, c := range bus.Carried() {
		for _, f := range spec.FilterSubjects {
			if overlap(f, c.Subject) {
				out[c.Subject] = c.Event
			}
		}
	}
	return out
}

// overlap reports whether two subscribe forms ('*', or a trailing '>') can match
// one subject.
func overlap(a, b string) bool {
	at, bt := strings.Split(a, "."), strings.Split(b, ".")
	for i := range at {
		if at[i] == ">" || i < len(bt) && bt[i] == ">" {
			return i < len(bt)
		}
		if i >= len(bt) || at[i] != bt[i] && at[i] != "*" && bt[i] != "*" {
			return false
		}
	}
	return len(at) == len(bt)
}

// recorder is a consumer's handlers: each decodes and validates its event
// and records what it handled.
type recorder struct {
	mu      sync.Mutex
	handled []string
}

func (rec *recorder) handle(_ context.Context, d bus.Delivery) error {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(d.Event))
	if err != nil {
		return fault.Invalid("no type %s", d.Event)
	}
	ev := mt.New().Interface()
	if err := proto.Unmarshal(d.Data, ev); err != nil {
		return fault.Invalid("decode %s: %w", d.Event, err)
	}
	if v, ok := ev.(bus.Validator); ok {
		if err := v.Validate(); err != nil {
			return fault.Invalid("validate %s: %w", d.Event, err)
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.handled = append(rec.handled, d.Subject+" "+d.Event)
	return nil
}

// TestEveryKindOfPoisonOnEveryConsumedSubjectIsDeadLettered publishes each
// kind of unusable input on every subject each declared consumer takes,
// through a router (as most services consume) and through a batch handler
// that switches on the delivery's event (as metering does).
func TestEveryKindOfPoisonOnEveryConsumedSubjectIsDeadLettered(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"router", "batch"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			_, c := setup(t, bus.Instruments{})
			specs := declaredConsumers(t)
			rec := &recorder{}
			for _, spec := range specs {
				startRecording(t, c, spec, rec, mode)
			}
			// What each consumer must dead-letter: stream sequence -> reason.
			want := map[string]map[uint64]string{}
			published := map[string]bool{}
			for _, spec := range specs {
				want[spec.Durable] = map[uint64]string{}
				for pattern, event := range carriedBy(spec) {
					for k, kind := range poisonKinds {
						subj := concrete(pattern, "poison"+strconv.Itoa(k))
						if _, tenanted := subject.TenantOf(subj); kind.tenantOnly && (!tenanted || !hasTenant(event)) {
							continue
						}
						if spec.Stream == topology.StreamAgentCmds {
							subj = strings.Replace(subj, "agent.poison"+strconv.Itoa(k), "agent.n1", 1)
						}
						m := kind.msg(subj, event)
						m.Header.Set(bus.HeaderMsgID, "poison:"+subj+":"+strconv.Itoa(k))
						ack, err := c.PublishMsg(t.Context(), m)
						if err != nil {
							t.Fatalf("publish %s on %s: %v", kind.name, subj, err)
						}
						if !published[subj+strconv.Itoa(k)] && ack.Duplicate {
							t.Fatalf("%s on %s stored as a duplicate", kind.name, subj)
						}
						published[subj+strconv.Itoa(k)] = true
						want[spec.Durable][ack.Sequence] = kind.name + " on " + subj + ": reason says " + kind.reason
					}
				}
			}
			testkit.Eventually(t, 60*time.Second, func() error {
				got := deadLetterReasons(t, c)
				var missing []string
				total := 0
				for durable, seqs := range want {
					for seq, what := range seqs {
						total++
						reason, ok := got[durable][seq]
						switch {
						case !ok:
							missing = append(missing, fmt.Sprintf("%s: no dead letter for %s", durable, what))
						case !strings.Contains(reason, what[strings.LastIndex(what, " ")+1:]):
							missing = append(missing, fmt.Sprintf("%s: %s; got %q", durable, what, reason))
						}
					}
				}
				if len(missing) > 0 {
					slices.Sort(missing)
					rec.mu.Lock()
					defer rec.mu.Unlock()
					return fmt.Errorf("%d of %d poison deliveries not dead-lettered as they should be (%d handled), e.g.\n%s",
						len(missing), total, len(rec.handled), strings.Join(missing[:min(4, len(missing))], "\n"))
				}
				return nil
			})
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if len(rec.handled) != 0 {
				t.Fatalf("handlers took unusable input: %v", rec.handled)
			}
		})
	}
}

// startRecording consumes spec with a recorder handling every event its
// subjects carry.
func startRecording(t *testing.T, c *bus.Conn, spec bus.Consumer, rec *recorder, mode string) {
	t.Helper()
	events := map[string]bool{}
	for _, e := range carriedBy(spec) {
		events[e] = true
	}
	if len(events) == 0 {
		t.Fatalf("consumer %s receives no subject with a declared event", spec.Durable)
	}
	spec.AckWait, spec.MaxDeliver = 5*time.Second, 2
	if mode == "router" {
		r := bus.NewRouter()
		for e := range events {
			r.Handle(e, rec.handle)
		}
		consume(t, c, spec, r, bus.ConsumeOptions{RetryDelays: []time.Duration{10 * time.Millisecond}})
		return
	}
	h := func(ctx context.Context, ds []bus.Delivery) []error {
		out := make([]error, len(ds))
		for i, d := range ds {
			if events[d.Event] {
				out[i] = rec.handle(ctx, d)
			} // else: an event this consumer does not know, acknowledged
		}
		return out
	}
	sub, err := c.ConsumeBatch(t.Context(), spec, h, bus.BatchOptions{RetryDelays: []time.Duration{10 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 5*time.Second)
		defer cancel()
		_ = sub.Drain(ctx)
	})
}

// deadLetterHeaders reads the headers of every stored dead letter, by
// sequence (no consumer: a poll must not pile up ephemeral consumers).
func deadLetterHeaders(t *testing.T, c *bus.Conn) []nats.Header {
	t.Helper()
	s, err := c.JetStream().Stream(t.Context(), topology.StreamDeadLetter)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var out []nats.Header
	for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(t.Context(), seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m.Header)
	}
	return out
}

// deadLetterReasons maps consumer -> original stream sequence -> reason.
func deadLetterReasons(t *testing.T, c *bus.Conn) map[string]map[uint64]string {
	t.Helper()
	out := map[string]map[uint64]string{}
	for _, h := range deadLetterHeaders(t, c) {
		if claim := h.Get(bus.HeaderDLQOriginal + bus.HeaderEvent); claim != "" && h.Get(bus.HeaderEvent) != "" {
			t.Errorf("dead letter of a contradicted type %s keeps it as its event %s", claim, h.Get(bus.HeaderEvent))
		}
		seq, _ := strconv.ParseUint(h.Get(bus.HeaderDLQStreamSeq), 10, 64)
		durable := h.Get(bus.HeaderDLQConsumer)
		if out[durable] == nil {
			out[durable] = map[uint64]string{}
		}
		out[durable][seq] = h.Get(bus.HeaderDLQReason)
	}
	return out
}

// Every subject a declared consumer takes carries a declared event, so the
// bus can tell each delivery's type from its subject.
func TestEveryConsumedSubjectCarriesADeclaredEvent(t *testing.T) {
	t.Parallel()
	for _, spec := range declaredConsumers(t) {
		for _, f := range spec.FilterSubjects {
			covered := false
			for _, c := range bus.Carried() {
				covered = covered || overlap(f, c.Subject)
			}
			if !covered {
				t.Errorf("consumer %s filters %s, which no declared subject covers", spec.Durable, f)
			}
		}
	}
	for _, c := range bus.Carried() {
		if strings.Contains(c.Subject, ">") {
			t.Errorf("%s: the contract's subjects use '*' only", c.Subject)
		}
		if got, ok := bus.EventOn(concrete(c.Subject, "t1")); !ok || got != c.Event {
			t.Errorf("EventOn(%s) = %q, %v; want %s", concrete(c.Subject, "t1"), got, ok, c.Event)
		}
		if _, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(c.Event)); err != nil {
			t.Errorf("%s carries %s, which is no registered message", c.Subject, c.Event)
		}
	}
	if _, ok := bus.EventOn("agent.n1.cmd.checkpoint"); ok {
		t.Error("a command verb this build does not know has a declared event")
	}
}
