package topology_test

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

var update = flag.Bool("update", false, "rewrite deploy/nats/users.conf from the topology")

func TestUsersConfIsCurrent(t *testing.T) {
	path := filepath.Join("..", "..", "deploy", "nats", "users.conf")
	want := topology.UsersConf()
	if *update {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v: run go test ./shared/topology -run TestUsersConfIsCurrent -update", err)
	}
	if string(got) != want {
		t.Fatalf("%s is stale: run go test ./shared/topology -run TestUsersConfIsCurrent -update", path)
	}
}

func TestEverySubjectHasExactlyOneStream(t *testing.T) {
	t.Parallel()
	streams := topology.Streams(1)
	owner := func(subj string) []string {
		var names []string
		for _, s := range streams {
			for _, pat := range s.Subjects {
				if subject.Matches(pat, subj) {
					names = append(names, s.Name)
				}
			}
		}
		return names
	}
	samples := []string{
		"rental.t.requested", "rental.t.cancel_requested", "node.n.registered", "node.n.telemetry",
		"node.n.health", "node.n.lost", "agent.n.cmd.start", "traffic.p.sample", "scale.p.decided",
		"scale.fleet.shortage", "usage.t.recorded", "invoice.t.closed", "spot.z.m.price", "dlq.RENTALS.scheduler",
		"audit.t.rental_create",
		"log.t.r-1",
	}
	for _, s := range samples {
		if got := owner(s); len(got) != 1 {
			t.Errorf("subject %s is stored by %v; want exactly one stream", s, got)
		}
	}
	for _, svc := range topology.Services() {
		for _, pub := range svc.Publishes {
			concrete := strings.ReplaceAll(pub, "*", "x")
			if got := owner(concrete); len(got) != 1 {
				t.Errorf("%s publishes %s, stored by %v; want exactly one stream", svc.Name, pub, got)
			}
		}
		for _, c := range svc.Consumers {
			if err := c.Validate(); err != nil {
				t.Errorf("%s: %v", svc.Name, err)
			}
		}
	}
	for _, s := range streams {
		if err := s.Validate(); err != nil {
			t.Errorf("stream %s: %v", s.Name, err)
		}
	}
}

func TestServicePermissionsAreLeastPrivilege(t *testing.T) {
	t.Parallel()
	sched, ok := topology.ServiceNamed(topology.Scheduler)
	if !ok {
		t.Fatal("no scheduler")
	}
	p := sched.Permissions()
	allowed := func(subj string) bool {
		for _, pat := range p.Publish {
			if subject.Matches(pat, subj) {
				return true
			}
		}
		return false
	}
	for _, subj := range []string{"rental.acme.scheduled", "$JS.API.CONSUMER.MSG.NEXT.RENTALS.scheduler",
		"$JS.ACK.RENTALS.scheduler.1.2.3.4.5.6", "dlq.RENTALS.scheduler", "scale.fleet.shortage"} {
		if !allowed(subj) {
			t.Errorf("scheduler may not publish %s", subj)
		}
	}
	for _, subj := range []string{"usage.acme.recorded", "rental.acme.started", "$JS.API.STREAM.CREATE.RENTALS",
		"$JS.API.CONSUMER.MSG.NEXT.RENTALS.metering", "$KV.HEARTBEATS.node.n1", "dlq.RENTALS.metering"} {
		if allowed(subj) {
			t.Errorf("scheduler may publish %s; it should not", subj)
		}
	}
	if _, err := topology.AgentCommands("a.b"); err == nil {
		t.Error("agent command consumer accepted a node id with a dot")
	}
	if got := topology.PasswordVar("node-agent"); got != "SHIZU_NODE_AGENT_NATS_PASSWORD" {
		t.Errorf("PasswordVar = %s", got)
	}
}

func TestTheNodeAgentMayPublishRentalLogsAndNothingElseInTheLogStream(t *testing.T) {
	t.Parallel()
	agent, _ := topology.ServiceNamed(topology.NodeAgent)
	allowed := func(subj string) bool {
		for _, pat := range agent.Permissions().Publish {
			if subject.Matches(pat, subj) {
				return true
			}
		}
		return false
	}
	if !allowed("log.acme.r-1") {
		t.Error("node-agent may not publish log.acme.r-1")
	}
	for _, subj := range []string{"log.acme", "log.acme.r-1.more", "$JS.API.STREAM.PURGE.LOGS", "$JS.API.STREAM.DELETE.LOGS"} {
		if allowed(subj) {
			t.Errorf("node-agent may publish %s; it should not", subj)
		}
	}
	for _, svc := range topology.Services() {
		if svc.Name == topology.NodeAgent {
			continue
		}
		for _, pat := range svc.Permissions().Publish {
			if subject.Matches(pat, "log.acme.r-1") {
				t.Errorf("%s may publish rental logs (%s)", svc.Name, pat)
			}
		}
	}
}

func TestALogReaderMayReadButNeitherWriteNorPurgeLogs(t *testing.T) {
	t.Parallel()
	p := topology.Service{Name: "reader", ReadsLogs: true}.Permissions()
	allowed := func(subj string) bool {
		for _, pat := range p.Publish {
			if subject.Matches(pat, subj) {
				return true
			}
		}
		return false
	}
	for _, subj := range []string{"$JS.API.STREAM.INFO.LOGS", "$JS.API.DIRECT.GET.LOGS", "$JS.API.DIRECT.GET.LOGS.log.acme.r-1",
		"$JS.API.CONSUMER.CREATE.LOGS.oc_1.log.acme.r-1", "$JS.API.CONSUMER.MSG.NEXT.LOGS.oc_1", "$JS.API.CONSUMER.DELETE.LOGS.oc_1"} {
		if !allowed(subj) {
			t.Errorf("a log reader may not publish %s", subj)
		}
	}
	for _, subj := range []string{"log.acme.r-1", "$JS.API.STREAM.PURGE.LOGS", "$JS.API.STREAM.MSG.DELETE.LOGS",
		"$JS.API.STREAM.UPDATE.LOGS", "$JS.API.CONSUMER.CREATE.LOGS.oc_1", "$JS.API.CONSUMER.CREATE.RENTALS.oc_1.rental.acme.started"} {
		if allowed(subj) {
			t.Errorf("a log reader may publish %s; it should not", subj)
		}
	}
}

func TestTheLogStreamIsBoundedPerRentalAndInAll(t *testing.T) {
	t.Parallel()
	for _, s := range topology.Streams(1) {
		if s.Name != topology.StreamLogs {
			continue
		}
		if s.MaxMsgsPerSubject <= 0 || s.MaxBytes <= 0 || s.MaxAge <= 0 || s.MaxMsgSize < topology.LogMaxBatchBytes {
			t.Fatalf("LOGS is not bounded: %+v", s)
		}
		if !s.AllowDirect {
			t.Fatal("LOGS does not allow direct gets (rentallogs.Tail reads by subject)")
		}
		return
	}
	t.Fatal("no LOGS stream")
}

func TestPerInstanceDurablesMayRunTheirExhaustedForwarder(t *testing.T) {
	t.Parallel()
	agent, _ := topology.ServiceNamed(topology.NodeAgent)
	p := agent.Permissions()
	cmds, err := topology.AgentCommands("n7")
	if err != nil {
		t.Fatal(err)
	}
	want := "$JS.API.CONSUMER.MSG.NEXT." + topology.StreamAdvisories + "." + bus.ExhaustedDurable(cmds.Durable)
	for _, pat := range p.Publish {
		if subject.Matches(pat, want) {
			return
		}
	}
	t.Fatalf("node-agent may not pull %s", want)
}

func TestTheGatewayMayPublishForTenantsAndUseItsBucketsOnly(t *testing.T) {
	t.Parallel()
	gw, ok := topology.ServiceNamed(topology.Gateway)
	if !ok {
		t.Fatal("no gateway")
	}
	p := gw.Permissions()
	allowed := func(subj string) bool {
		for _, pat := range p.Publish {
			if subject.Matches(pat, subj) {
				return true
			}
		}
		return false
	}
	for _, subj := range []string{"rental.acme.requested", "rental.acme.cancel_requested", "audit.acme.rental_create",
		"$KV.IDENTITY.key.k1", "$KV.IDEMPOTENCY.x.y", "$KV.RENTAL_VIEW.acme.r-1", "$JS.API.STREAM.CREATE.KV_IDENTITY",
		"$JS.API.CONSUMER.MSG.NEXT.RENTALS.rentalview", "$JS.API.DIRECT.GET.KV_RENTAL_VIEW.$KV.RENTAL_VIEW.acme.r-1",
		"$JS.API.DIRECT.GET.LOGS.log.acme.r-1", "$JS.API.CONSUMER.DELETE.LOGS.oc1",
		"scale.acme_chat.declared", "traffic.acme_chat.sample", "$JS.API.STREAM.MSG.GET.SCALING", "$JS.API.STREAM.INFO.SCALING"} {
		if !allowed(subj) {
			t.Errorf("gateway may not publish %s", subj)
		}
	}
	for _, subj := range []string{"rental.acme.scheduled", "rental.acme.stopped", "agent.n1.cmd.start", "usage.acme.recorded",
		"$KV.HEARTBEATS.node.n1", "$JS.API.STREAM.CREATE.RENTALS", "$JS.API.STREAM.PURGE.KV_IDENTITY",
		"$JS.API.CONSUMER.MSG.NEXT.RENTALS.scheduler", "$JS.API.STREAM.PURGE.LOGS", "log.acme.r-1",
		"scale.acme_chat.decided", "scale.fleet.shortage", "$JS.API.CONSUMER.CREATE.SCALING.x"} {
		if allowed(subj) {
			t.Errorf("gateway may publish %s; it should not", subj)
		}
	}
	for _, b := range topology.Buckets(1) {
		if err := b.Validate(); err != nil {
			t.Errorf("bucket %s: %v", b.Name, err)
		}
	}
}

// Money queries are request-reply: metering answers them (it subscribes
// and may reply once per request), the gateway asks them, and no stream
// stores them.
func TestMoneyQueriesAreAnsweredByMeteringAndAskedByTheGateway(t *testing.T) {
	t.Parallel()
	m, _ := topology.ServiceNamed(topology.Metering)
	gw, _ := topology.ServiceNamed(topology.Gateway)
	mp, gp := m.Permissions(), gw.Permissions()
	matches := func(pats []string, subj string) bool {
		for _, p := range pats {
			if subject.Matches(p, subj) {
				return true
			}
		}
		return false
	}
	for _, q := range []string{"metering.acme.usage", "metering.acme.invoices", "metering.acme.budget"} {
		if !matches(mp.Subscribe, q) || matches(mp.Publish, q) {
			t.Errorf("metering: subscribe %s %v, publish %v; want subscribe only", q, matches(mp.Subscribe, q), matches(mp.Publish, q))
		}
		if !matches(gp.Publish, q) || matches(gp.Subscribe, q) {
			t.Errorf("gateway: publish %s %v, subscribe %v; want publish only", q, matches(gp.Publish, q), matches(gp.Subscribe, q))
		}
		for _, s := range topology.Streams(1) {
			if matches(s.Subjects, q) {
				t.Errorf("stream %s stores the query %s", s.Name, q)
			}
		}
	}
	if !mp.Responses || gp.Responses {
		t.Errorf("responses: metering %v, gateway %v; want metering only", mp.Responses, gp.Responses)
	}
	if topology.QueueGroup(topology.Metering) != "metering" {
		t.Errorf("queue group %q", topology.QueueGroup(topology.Metering))
	}
}
