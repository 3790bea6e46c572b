package app_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// A bad spot price carrying a publish expectation (Nats-Expected-Stream,
// which the MARKET stream met) is dead-lettered all the same, and the
// metering-spot consumer's ack floor moves past it: the watermark that
// closes running rentals does not freeze on it.
func TestABadSpotPriceWithAPublishExpectationDoesNotHoldTheAckFloor(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := testConfig()
	e.startMeter(t, cfg, fixed(base))
	subj, err := subject.Format(subject.SpotPriceChanged, "eu-1", "H100-SXM5-80GB")
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(subj)
	m.Data = []byte{0xff, 0xff, 0xff, 0x01}
	m.Header.Set(bus.HeaderEvent, "shizu.v1.SpotPriceChanged")
	m.Header.Set(bus.HeaderMsgID, "bad-price")
	m.Header.Set("Nats-Expected-Stream", topology.StreamMarket)
	ack, err := e.pub.PublishMsg(t.Context(), m)
	if err != nil {
		t.Fatal(err)
	}
	e.prices(t, cfg)
	testkit.Eventually(t, 30*time.Second, func() error {
		cons, err := e.pub.JetStream().Consumer(t.Context(), topology.StreamMarket, "metering-spot")
		if err != nil {
			return err
		}
		info, err := cons.Info(t.Context())
		if err != nil {
			return err
		}
		if info.AckFloor.Stream < ack.Sequence || info.NumAckPending != 0 {
			return fmt.Errorf("metering-spot ack floor %d (bad price at %d), %d unacknowledged", info.AckFloor.Stream, ack.Sequence, info.NumAckPending)
		}
		var found bool
		for _, dl := range deadLetters(t, e) {
			found = found || dl.Header.Get(bus.HeaderDLQStreamSeq) == fmt.Sprint(ack.Sequence) &&
				dl.Header.Get(bus.HeaderDLQReason) != "" && dl.Header.Get("Nats-Expected-Stream") == ""
		}
		if !found {
			return fmt.Errorf("the bad price (seq %d) is not dead-lettered", ack.Sequence)
		}
		return nil
	})
}
