package bus_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// forgedRequest is a valid RentalRequested of tenant "victim", to be
// published on another tenant's subject.
func forgedRequest(id string) *shizuv1.RentalRequested {
	ev := rentalRequested("forged:"+id, id)
	ev.TenantId = "victim"
	return ev
}

// deadLetterReasonFor waits for the dead letter of the message published
// on subj by durable and returns its reason.
func deadLetterReasonFor(t *testing.T, c *bus.Conn, durable, subj string) string {
	t.Helper()
	var reason string
	testkit.Eventually(t, 20*time.Second, func() error {
		for _, h := range deadLetterHeaders(t, c) {
			if h.Get(bus.HeaderDLQConsumer) == durable && h.Get(bus.HeaderDLQSubject) == subj {
				reason = h.Get(bus.HeaderDLQReason)
				return nil
			}
		}
		return fmt.Errorf("no dead letter of %s on %s yet", durable, subj)
	})
	return reason
}

// A RentalRequested on rental.dev.requested whose body names tenant
// "victim" is terminated and dead-lettered, with a reason naming both
// tenants, by a router consumer and by a batch consumer; neither handler
// sees it (the batch consumer's Unusable is told), and both handle the
// honest request after it.
func TestABodyNamingAnotherTenantThanItsSubjectIsDeadLettered(t *testing.T) {
	t.Parallel()
	_, c := setup(t, bus.Instruments{})
	var mu sync.Mutex
	handled := map[string][]string{}
	record := func(mode string, ev *shizuv1.RentalRequested) {
		mu.Lock()
		defer mu.Unlock()
		handled[mode] = append(handled[mode], ev.GetTenantId()+"/"+ev.GetRentalId())
	}
	r := bus.NewRouter()
	bus.On(r, func(_ context.Context, ev *shizuv1.RentalRequested, _ bus.Delivery) error {
		record("router", ev)
		return nil
	})
	consume(t, c, testConsumer("router", 3), r, bus.ConsumeOptions{})
	sub, err := c.ConsumeBatch(t.Context(), testConsumer("batch", 3), func(_ context.Context, ds []bus.Delivery) []error {
		for _, d := range ds {
			ev := &shizuv1.RentalRequested{}
			if err := proto.Unmarshal(d.Data, ev); err != nil {
				t.Errorf("batch handler got %s: %v", d.Subject, err)
			}
			record("batch", ev)
		}
		return nil
	}, bus.BatchOptions{Unusable: func(_ context.Context, d bus.Delivery, reason error) {
		mu.Lock()
		defer mu.Unlock()
		handled["unusable"] = append(handled["unusable"], d.Event+": "+reason.Error())
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Drain(context.WithoutCancel(t.Context())) })

	if _, err := c.Publish(t.Context(), "rental.dev.requested", forgedRequest("r-forged")); err != nil {
		t.Fatal(err)
	}
	honest := rentalRequested("honest", "r-honest")
	honest.TenantId = "dev"
	if _, err := c.Publish(t.Context(), "rental.dev.requested", honest); err != nil {
		t.Fatal(err)
	}
	for _, durable := range []string{"router", "batch"} {
		reason := deadLetterReasonFor(t, c, durable, "rental.dev.requested")
		if !strings.Contains(reason, `"dev"`) || !strings.Contains(reason, `"victim"`) {
			t.Errorf("%s: dead letter reason %q does not name both tenants", durable, reason)
		}
	}
	testkit.Eventually(t, 20*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		for _, mode := range []string{"router", "batch"} {
			if got := strings.Join(handled[mode], ","); got != "dev/r-honest" {
				return fmt.Errorf("%s handled %q; want only dev/r-honest", mode, got)
			}
		}
		if got := handled["unusable"]; len(got) != 1 || !strings.HasPrefix(got[0], "shizu.v1.RentalRequested: tenant mismatch") {
			return fmt.Errorf("the batch consumer's Unusable was told %q", got)
		}
		return nil
	})
}

// A history scan leaves out the events whose body names another tenant
// than their subject, and keeps the rest (non-tenant subjects included).
func TestAScanLeavesOutForgedTenantEvents(t *testing.T) {
	t.Parallel()
	_, c := setup(t, bus.Instruments{})
	honest := rentalRequested("honest", "r-honest")
	honest.TenantId = "dev"
	usage := &shizuv1.UsageRecorded{Meta: &shizuv1.EventMeta{EventId: "usage:forged", OccurredAt: timestamppb.Now(), Source: "test"},
		RentalId: "r-honest", TenantId: "victim"}
	for _, p := range []struct {
		subj string
		ev   proto.Message
	}{
		{"rental.dev.requested", forgedRequest("r-forged")},
		{"rental.dev.requested", honest},
		{"usage.dev.recorded", usage},
	} {
		if _, err := c.Publish(t.Context(), p.subj, p.ev); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for _, stream := range []string{topology.StreamRentals, topology.StreamBilling} {
		_, err := bus.ScanStream(t.Context(), c.JetStream(), stream, ">", func(m *jetstream.RawStreamMsg) error {
			got = append(got, m.Header.Get(bus.HeaderMsgID))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if strings.Join(got, ",") != "honest" {
		t.Fatalf("scanned %v; want only honest", got)
	}
}

func TestTenantMismatchNamesBothTenantsAndIgnoresOtherSubjects(t *testing.T) {
	t.Parallel()
	event := bus.EventName(&shizuv1.RentalRequested{})
	forged, _ := proto.Marshal(forgedRequest("r-1"))
	err := bus.TenantMismatch("rental.dev.requested", event, forged)
	if err == nil || !strings.Contains(err.Error(), `names tenant "dev"`) || !strings.Contains(err.Error(), `names tenant "victim"`) {
		t.Fatalf("forged body: %v", err)
	}
	if err := bus.TenantMismatch("rental.victim.requested", event, forged); err != nil {
		t.Errorf("matching tenants: %v", err)
	}
	if err := bus.TenantMismatch("rental.dev.requested", event, garbage); err != nil {
		t.Errorf("a body that does not parse is its decoder's to report: %v", err)
	}
	noTenant, _ := proto.Marshal(&shizuv1.RentalRequested{RentalId: "r-1"})
	if err := bus.TenantMismatch("rental.dev.requested", event, noTenant); err != nil {
		t.Errorf("a body without a tenant is its validator's to report: %v", err)
	}
	health := bus.EventName(&shizuv1.NodeHealthChanged{})
	if err := bus.TenantMismatch("node.dev.health", health, forged); err != nil {
		t.Errorf("a node subject: %v", err)
	}
}
