package app_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Input the scheduler cannot use is dead-lettered with the reason and
// does nothing: a valid request filed on the cancel subject is not
// placed, and header-less bytes on the stopped subject are not acked
// unread.
func TestMisfiledAndHeaderlessInputIsDeadLetteredAndDoesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register(gpuNode("n1", 2, capacity.MarketOnDemand))
	e.replica(testConfig(), time.Now)
	js := e.Admin.JetStream()
	misfiled := requested("misfiled", "acme", spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), time.Now())
	raw, err := proto.Marshal(misfiled)
	if err != nil {
		t.Fatal(err)
	}
	wrong := nats.NewMsg("rental.acme.cancel_requested")
	wrong.Data = raw
	wrong.Header.Set(jetstream.MsgIDHeader, "misfiled")
	wrong.Header.Set(bus.HeaderEvent, bus.EventName(misfiled))
	headerless := nats.NewMsg("rental.acme.stopped")
	headerless.Data = []byte{0xff, 0xff, 0xff, 0x01}
	for _, m := range []*nats.Msg{wrong, headerless} {
		if _, err := js.PublishMsg(t.Context(), m); err != nil {
			t.Fatal(err)
		}
	}
	e.publish(requested("good", "acme", spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), time.Now()))
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) (err error) { _, err = scheduledOf(o, "good"); return })
	testkit.Eventually(t, 20*time.Second, func() error {
		stream, err := js.Stream(t.Context(), topology.StreamDeadLetter)
		if err != nil {
			return err
		}
		info, err := stream.Info(t.Context())
		if err != nil {
			return err
		}
		var reasons []string
		for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
			if m, err := stream.GetMsg(t.Context(), seq); err == nil && m.Subject == "dlq.RENTALS.scheduler" {
				reasons = append(reasons, m.Header.Get(bus.HeaderDLQReason))
			}
		}
		all := strings.Join(reasons, "\n")
		if len(reasons) != 2 || !strings.Contains(all, "which carries shizu.v1.RentalCancelRequested") || !strings.Contains(all, "decode shizu.v1.RentalStopped") {
			return fmt.Errorf("dead letters of the scheduler: %q", reasons)
		}
		return nil
	})
	e.seen.waitFor(t, time.Second, func(o *outcomes) error {
		if n := len(o.scheduled["misfiled"]) + len(o.pending["misfiled"]) + len(o.rejected["misfiled"]); n != 0 {
			return fmt.Errorf("the misfiled request got %d outcomes", n)
		}
		return nil
	})
}
