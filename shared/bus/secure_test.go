package bus_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

func password(user string) string { return "pw-" + user }

// secureServer starts a server that requires TLS 1.3 and knows one user
// per service with the permissions declared in topology, and provisions
// the streams as admin.
func secureServer(t *testing.T) (*testkit.NATS, testkit.TLSFiles) {
	t.Helper()
	files := testkit.NewTLS(t)
	n := testkit.StartNATS(t, testkit.WithTLS(t, files), testkit.WithUsers(topology.Users(), password))
	admin := connect(t, serviceConfig(n, files, topology.Admin), bus.Instruments{})
	if err := admin.EnsureStreams(t.Context(), topology.Streams(1)...); err != nil {
		t.Fatalf("admin provisioning: %v", err)
	}
	return n, files
}

func serviceConfig(n *testkit.NATS, f testkit.TLSFiles, user string) bus.Config {
	return bus.Config{URL: n.URL, Name: user, User: user, Password: password(user), CAFile: f.CAFile}
}

func TestServiceUsersOverTLS13(t *testing.T) {
	t.Parallel()
	n, files := secureServer(t)
	admin := connect(t, serviceConfig(n, files, topology.Admin), bus.Instruments{})
	sched := connect(t, serviceConfig(n, files, topology.Scheduler), bus.Instruments{})
	if cs, err := sched.NATS().TLSConnectionState(); err != nil || cs.Version != tls.VersionTLS13 {
		t.Fatalf("scheduler connection: TLS version %x, err %v; want TLS 1.3", cs.Version, err)
	}

	// The scheduler consumes requests through its declared durable and
	// publishes what it is allowed to.
	schedSvc, _ := topology.ServiceNamed(topology.Scheduler)
	got := make(chan string, 1)
	r := bus.NewRouter()
	bus.On(r, func(ctx context.Context, ev *shizuv1.RentalRequested, _ bus.Delivery) error {
		out := &shizuv1.RentalScheduled{Meta: &shizuv1.EventMeta{EventId: "sched:" + ev.GetRentalId()},
			RentalId: ev.GetRentalId(), TenantId: ev.GetTenantId(), NodeId: "n1"}
		subj, err := subject.Format(subject.RentalScheduled, ev.GetTenantId())
		if err != nil {
			return err
		}
		if _, err := sched.Publish(ctx, subj, out); err != nil {
			return err
		}
		got <- ev.GetRentalId()
		return nil
	})
	consume(t, sched, schedSvc.Consumers[0], r, bus.ConsumeOptions{})
	if _, err := admin.Publish(t.Context(), requestedSubject, rentalRequested("s-1", "r-1")); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-got:
		if id != "r-1" {
			t.Fatalf("scheduled %s", id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("scheduler user could not consume and publish its own subjects")
	}

	// Publishing a usage record is metering's business, not the scheduler's.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	t.Logf("before denied publish: %s", time.Now().Format("05.000"))
	started := time.Now()
	usage := &shizuv1.UsageRecorded{Meta: &shizuv1.EventMeta{EventId: "usage:r-1:0"}}
	_, err := sched.Publish(ctx, fmt.Sprintf(subject.UsageRecorded, "acme"), usage)
	if !errors.Is(err, bus.ErrPermissionDenied) {
		t.Fatalf("publish outside permissions: got %v, want ErrPermissionDenied", err)
	}
	if !strings.Contains(err.Error(), `Permissions Violation for Publish to "usage.acme.recorded"`) {
		t.Fatalf("error %q does not name the refused subject", err)
	}
	if ctx.Err() != nil {
		t.Fatalf("the refusal arrived only by timeout after %s", time.Since(started))
	}

	t.Logf("after denied publish: %s", time.Now().Format("05.000"))
	// A wrong password is refused.
	bad := serviceConfig(n, files, topology.Scheduler)
	bad.Password = "nope"
	if _, err := bus.Connect(t.Context(), bad, bus.Instruments{}); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("wrong password: got %v, want an authorization violation", err)
	}
}

func TestClientOfferingOnlyTLS12IsRefused(t *testing.T) {
	t.Parallel()
	n, files := secureServer(t)
	pem, err := os.ReadFile(files.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	_, err = nats.Connect(n.URL, nats.UserInfo(topology.Scheduler, password(topology.Scheduler)),
		nats.Secure(&tls.Config{RootCAs: pool, MaxVersion: tls.VersionTLS12}), nats.Timeout(5*time.Second))
	if err == nil || !strings.Contains(err.Error(), "protocol version not supported") {
		t.Fatalf("TLS 1.2 client: got %v, want a protocol version refusal", err)
	}
	// And a plaintext client cannot talk to it either.
	if _, err := bus.Connect(t.Context(), bus.Config{URL: n.URL, User: topology.Scheduler,
		Password: password(topology.Scheduler)}, bus.Instruments{}); err == nil {
		t.Fatal("a client without the CA connected to the TLS server")
	}
}

func TestEveryServiceCanUseItsDeclaredConsumersAndSubjects(t *testing.T) {
	t.Parallel()
	n, files := secureServer(t)
	for _, svc := range topology.Services() {
		c := connect(t, serviceConfig(n, files, svc.Name), bus.Instruments{})
		for _, spec := range svc.Consumers {
			if _, err := c.EnsureConsumer(t.Context(), spec); err != nil {
				t.Errorf("%s: ensure own consumer %s: %v", svc.Name, spec.Durable, err)
			}
		}
	}
	agent := connect(t, serviceConfig(n, files, topology.NodeAgent), bus.Instruments{})
	cmds, err := topology.AgentCommands("node-7")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := agent.EnsureConsumer(t.Context(), cmds); err != nil {
		t.Fatalf("node-agent: ensure its command consumer: %v", err)
	}
	other := bus.Consumer{Stream: topology.StreamRentals, Durable: "scheduler",
		FilterSubjects: []string{subject.RentalRequestedAll}}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if _, err := agent.EnsureConsumer(ctx, other); err == nil {
		t.Fatal("node-agent took over the scheduler's consumer")
	}
}
