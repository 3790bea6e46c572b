package metertest_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shizu-gpu/shizu/services/metering/app"
	"github.com/shizu-gpu/shizu/services/metering/app/metertest"
	"github.com/shizu-gpu/shizu/services/metering/redisstore"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

var prefixes atomic.Int64

// realStore is a redisstore on its own real Redis.
func realStore(t *testing.T) *redisstore.Store {
	t.Helper()
	return redisstore.New(testkit.StartRedis(t).Client(t), fmt.Sprintf("c%d:", prefixes.Add(1)))
}

func TestRedisstorePassesTheSegmentStoreContract(t *testing.T) {
	t.Parallel()
	metertest.RunSegmentStoreContract(t, func(t *testing.T) app.SegmentStore { return realStore(t) })
}

func TestTheFakeStorePassesTheSegmentStoreContract(t *testing.T) {
	t.Parallel()
	metertest.RunSegmentStoreContract(t, func(*testing.T) app.SegmentStore { return metertest.NewStore() })
}

func TestRedisstorePassesTheUsageStoreContract(t *testing.T) {
	t.Parallel()
	metertest.RunUsageStoreContract(t, func(t *testing.T) app.UsageStore { return realStore(t) })
}

func TestTheFakeStorePassesTheUsageStoreContract(t *testing.T) {
	t.Parallel()
	metertest.RunUsageStoreContract(t, func(*testing.T) app.UsageStore { return metertest.NewStore() })
}

func TestTheBusPublisherPassesThePublisherContract(t *testing.T) {
	t.Parallel()
	metertest.RunPublisherContract(t, func(t *testing.T) (app.Publisher, func(t *testing.T) []string) {
		n := testkit.StartNATS(t)
		conn, err := bus.Connect(t.Context(), bus.Config{URL: n.URL, Name: "contract"}, bus.Instruments{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close(t.Context()) })
		if err := conn.EnsureStreams(t.Context(), topology.Streams(1)...); err != nil {
			t.Fatal(err)
		}
		return app.NewBusPublisher(conn), func(t *testing.T) []string {
			s, err := conn.JetStream().Stream(t.Context(), topology.StreamBilling)
			if err != nil {
				t.Fatal(err)
			}
			info, err := s.Info(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
				m, err := s.GetMsg(t.Context(), seq)
				if err != nil {
					t.Fatal(err)
				}
				if subject.Matches(subject.UsageRecordedAll, m.Subject) {
					ids = append(ids, m.Header.Get(jetstream.MsgIDHeader))
				}
			}
			return ids
		}
	})
}

func TestTheBusPublisherPassesTheDeadLetterContract(t *testing.T) {
	t.Parallel()
	metertest.RunDeadLetterContract(t, func(t *testing.T) (app.Publisher, func(t *testing.T) []app.DeadLetter) {
		n := testkit.StartNATS(t)
		conn, err := bus.Connect(t.Context(), bus.Config{URL: n.URL, Name: "contract"}, bus.Instruments{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close(t.Context()) })
		if err := conn.EnsureStreams(t.Context(), topology.Streams(1)...); err != nil {
			t.Fatal(err)
		}
		return app.NewBusPublisher(conn), func(t *testing.T) []app.DeadLetter {
			s, err := conn.JetStream().Stream(t.Context(), topology.StreamDeadLetter)
			if err != nil {
				t.Fatal(err)
			}
			info, err := s.Info(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			var out []app.DeadLetter
			for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
				m, err := s.GetMsg(t.Context(), seq)
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, app.DeadLetter{Subject: m.Subject, ID: m.Header.Get(jetstream.MsgIDHeader),
					Stream: m.Header.Get(bus.HeaderDLQStream), Consumer: m.Header.Get(bus.HeaderDLQConsumer), Reason: m.Header.Get(bus.HeaderDLQReason)})
			}
			return out
		}
	})
}

func TestTheFakePublisherPassesTheDeadLetterContract(t *testing.T) {
	t.Parallel()
	metertest.RunDeadLetterContract(t, func(*testing.T) (app.Publisher, func(t *testing.T) []app.DeadLetter) {
		p := metertest.NewPublisher()
		return p, func(*testing.T) []app.DeadLetter {
			out := p.DeadLetters()
			for i := range out {
				out[i].Event = nil
			}
			return out
		}
	})
}

func TestTheFakePublisherPassesThePublisherContract(t *testing.T) {
	t.Parallel()
	metertest.RunPublisherContract(t, func(*testing.T) (app.Publisher, func(t *testing.T) []string) {
		p := metertest.NewPublisher()
		return p, func(*testing.T) []string {
			var ids []string
			for _, m := range p.Stored() {
				ids = append(ids, m.ID())
			}
			return ids
		}
	})
}
