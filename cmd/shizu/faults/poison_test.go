package faults

import (
	"context"
	"crypto/rand"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// poisonTenant is the routing token of every poison message: the
// history reads only the load's tenant.
const poisonTenant = "poison"

// poisonKind builds one kind of poison message for a subject that carries
// event (its protobuf name) in stream.
type poisonKind struct {
	name  string
	build func(subj, stream, event string) *nats.Msg
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// poisonKinds are the kinds the issue lists: random bytes without headers,
// a valid event of another type, an unknown type, Nats-Expected-* headers
// (which the dead letter's copy must not carry to its own stream),
// invalid UTF-8 in a string field, and an oversized payload.
var poisonKinds = []poisonKind{
	{"random-bytes", func(subj, _, _ string) *nats.Msg { return &nats.Msg{Subject: subj, Data: randomBytes(64)} }},
	{"another-type", func(subj, _, event string) *nats.Msg {
		var ev proto.Message = &shizuv1.RentalCancelRequested{Meta: shizuv1.NewMeta("poison:cancel", "faults", "", "", time.Now()),
			RentalId: "poison", TenantId: poisonTenant, RequestedBy: "faults"}
		if event == bus.EventName(ev) {
			ev = &shizuv1.RentalRequested{Meta: shizuv1.NewMeta("poison:request", "faults", "", "", time.Now()), RentalId: "poison",
				TenantId: poisonTenant, Spec: onDemandSpec(0)}
		}
		data, _ := proto.Marshal(ev)
		m := nats.NewMsg(subj)
		m.Data = data
		m.Header.Set(bus.HeaderEvent, bus.EventName(ev))
		return m
	}},
	{"unknown-type", func(subj, _, _ string) *nats.Msg {
		m := nats.NewMsg(subj)
		m.Data = randomBytes(32)
		m.Header.Set(bus.HeaderEvent, "shizu.v1.NoSuchEvent")
		return m
	}},
	{"nats-expected-headers", func(subj, stream, event string) *nats.Msg {
		m := nats.NewMsg(subj)
		m.Data = randomBytes(48)
		m.Header.Set(bus.HeaderEvent, event)
		m.Header.Set("Nats-Expected-Stream", stream)
		return m
	}},
	{"invalid-utf8", func(subj, _, event string) *nats.Msg {
		m := nats.NewMsg(subj)
		m.Data = protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), []byte{0xff, 0xfe, 0xfd, 'x'})
		m.Header.Set(bus.HeaderEvent, event)
		return m
	}},
	{"oversized", func(subj, _, event string) *nats.Msg {
		m := nats.NewMsg(subj)
		m.Data = randomBytes(512 << 10)
		m.Header.Set(bus.HeaderEvent, event)
		return m
	}},
}

// consumedSubject is one concrete subject some durable consumes.
type consumedSubject struct {
	subject, stream string
	durables        []string
}

// consumedSubjects lists a concrete subject for every filter of every
// durable of the topology (routing keys replaced by poisonTenant) and for
// node's agent's commands, with every durable that consumes it.
func consumedSubjects(node string) []consumedSubject {
	type durable struct{ stream, name, filter string }
	var all []durable
	for _, svc := range topology.Services() {
		for _, c := range svc.Consumers {
			for _, f := range c.FilterSubjects {
				all = append(all, durable{c.Stream, c.Durable, f})
			}
		}
	}
	agent, _ := topology.AgentCommands(node)
	all = append(all, durable{agent.Stream, agent.Durable, agent.FilterSubjects[0]})
	var out []consumedSubject
	seen := map[string]bool{}
	for _, d := range all {
		for _, subj := range concrete(d.filter, node) {
			if seen[subj] {
				continue
			}
			seen[subj] = true
			cs := consumedSubject{subject: subj, stream: d.stream}
			for _, o := range all {
				if o.stream == d.stream && subjectMatches(o.filter, subj) && !containsString(cs.durables, o.name) {
					cs.durables = append(cs.durables, o.name)
				}
			}
			out = append(out, cs)
		}
	}
	return out
}

// concrete turns a filter into the subjects poison is sent to: '*'
// tokens become poisonTenant, and the agent's command verbs are listed.
func concrete(filter, node string) []string {
	if strings.HasPrefix(filter, "agent.") {
		var out []string
		for _, verb := range []string{"start", "stop", "drain"} {
			out = append(out, "agent."+node+".cmd."+verb)
		}
		return out
	}
	return []string{strings.ReplaceAll(filter, "*", poisonTenant)}
}

func subjectMatches(filter, subj string) bool {
	f, s := strings.Split(filter, "."), strings.Split(subj, ".")
	for i, tok := range f {
		if tok == ">" {
			return len(s) > i
		}
		if i >= len(s) || (tok != "*" && tok != s[i]) {
			return false
		}
	}
	return len(f) == len(s)
}

func containsString(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// deadLetterKey names one expected dead letter: a message of a stream
// (by sequence), dead-lettered by one durable.
type deadLetterKey struct {
	stream  string
	seq     uint64
	durable string
}

// poison publishes every poison kind on every consumed subject while
// requests keep arriving; each must be dead-lettered, with a reason, by
// every durable that consumes its subject, and the platform must go on
// (the usual invariants).
func poison() scenario {
	return scenario{Name: "poison", Fault: func(r *run) {
		expected := map[deadLetterKey]string{}
		sent := 0
		for _, cs := range consumedSubjects(r.d.nodes[0]) {
			event, _ := bus.EventOn(cs.subject)
			for _, k := range poisonKinds {
				ack, err := r.d.js.PublishMsg(r.ctx, k.build(cs.subject, cs.stream, event))
				if err != nil {
					r.t.Errorf("poison %s on %s: %v", k.name, cs.subject, err)
					continue
				}
				sent++
				for _, d := range cs.durables {
					expected[deadLetterKey{ack.Stream, ack.Sequence, d}] = k.name + " on " + cs.subject
				}
			}
		}
		found, reasonless, missing := r.waitDeadLetters(expected)
		r.res.Extra["poisoned"] = float64(sent)
		r.res.Extra["dead_letters_expected"] = float64(len(expected))
		r.res.Extra["dead_lettered"] = float64(found)
		r.res.Extra["bad_dead_letters_without_reason"] = float64(reasonless)
		r.res.Extra["bad_dead_letters_missing"] = float64(len(missing))
		for i, m := range missing {
			if i < 10 {
				r.res.problem("not dead-lettered: %s", m)
			}
		}
	}}
}

// waitDeadLetters waits until every expected dead letter is in the
// DEADLETTER stream (or a minute passed) and returns how many were
// found, how many carry no reason, and what is missing.
func (r *run) waitDeadLetters(expected map[deadLetterKey]string) (found, reasonless int, missing []string) {
	end := time.Now().Add(90 * time.Second)
	for {
		got, err := r.deadLetters(r.ctx)
		if err == nil {
			found, reasonless, missing = 0, 0, nil
			for k, what := range expected {
				reason, ok := got[k]
				switch {
				case !ok:
					missing = append(missing, fmt.Sprintf("%s (%s #%d, %s)", what, k.stream, k.seq, k.durable))
				case reason == "":
					reasonless++
					found++
				default:
					found++
				}
			}
			if len(missing) == 0 {
				return found, reasonless, nil
			}
		}
		if time.Now().After(end) {
			return found, reasonless, missing
		}
		hold(r.ctx, time.Second)
	}
}

// deadLetters reads the DEADLETTER stream: key -> reason.
func (r *run) deadLetters(ctx context.Context) (map[deadLetterKey]string, error) {
	msgs, err := readStream(ctx, r.d.js, topology.StreamDeadLetter)
	if err != nil {
		return nil, err
	}
	out := map[deadLetterKey]string{}
	for _, m := range msgs {
		h := m.Headers()
		seq, _ := strconv.ParseUint(h.Get(bus.HeaderDLQStreamSeq), 10, 64)
		out[deadLetterKey{h.Get(bus.HeaderDLQStream), seq, h.Get(bus.HeaderDLQConsumer)}] = h.Get(bus.HeaderDLQReason)
	}
	return out, nil
}
