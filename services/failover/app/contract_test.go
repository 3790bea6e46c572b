package app

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shizu-gpu/shizu/services/failover/app/failovertest"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// The app's interfaces are the contracts' (and the fakes implement them).
var (
	_ placementRecords  = failovertest.PlacementRecords(nil)
	_ moveRecords       = failovertest.MoveRecords(nil)
	_ quarantineRecords = failovertest.QuarantineRecords(nil)
	_ eventBatch        = failovertest.EventBatch(nil)
	_ placementRecords  = (*failovertest.Placements)(nil)
	_ moveRecords       = (*failovertest.Moves)(nil)
	_ quarantineRecords = (*failovertest.Quarantines)(nil)
	_ eventBatch        = (*failovertest.Batch)(nil)
)

func redisRecords(t *testing.T) records {
	return records{rdb: testkit.StartRedis(t).Client(t), prefix: "shizu"}
}

func TestTheRedisPlacementsKeepTheContract(t *testing.T) {
	t.Parallel()
	failovertest.RunPlacementRecordsContract(t, func(t *testing.T) failovertest.PlacementRecords {
		return redisPlacements{redisRecords(t)}
	})
}

func TestTheRedisMovesKeepTheContract(t *testing.T) {
	t.Parallel()
	failovertest.RunMoveRecordsContract(t, func(t *testing.T) failovertest.MoveRecords { return redisMoves{redisRecords(t)} })
}

func TestTheRedisQuarantinesKeepTheContract(t *testing.T) {
	t.Parallel()
	failovertest.RunQuarantineRecordsContract(t, func(t *testing.T) failovertest.QuarantineRecords {
		return redisQuarantines{redisRecords(t)}
	})
}

func TestTheBusBatchKeepsTheContract(t *testing.T) {
	t.Parallel()
	pw := func(user string) string { return "pw-" + user }
	failovertest.RunEventBatchContract(t, func(t *testing.T) (func() failovertest.EventBatch, func(*testing.T) []failovertest.Event) {
		srv := testkit.StartNATS(t, testkit.WithUsers(topology.Users(), pw))
		conn, err := bus.Connect(t.Context(), bus.Config{URL: srv.URL, User: topology.Admin, Password: pw(topology.Admin)}, bus.Instruments{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close(t.Context()) })
		if err := conn.EnsureStreams(t.Context(), topology.Streams(1)...); err != nil {
			t.Fatal(err)
		}
		_, js := srv.JetStream(t, nats.UserInfo(topology.Admin, pw(topology.Admin)))
		return func() failovertest.EventBatch { return newBusBatch(conn) },
			func(t *testing.T) []failovertest.Event { return streamed(t, js, failovertest.MigratingSubject) }
	})
}

// streamed reads every event stored under subject so far.
func streamed(t *testing.T, js jetstream.JetStream, subject string) []failovertest.Event {
	t.Helper()
	c, err := js.OrderedConsumer(t.Context(), topology.StreamRentals, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		t.Fatal(err)
	}
	var out []failovertest.Event
	for {
		batch, err := c.Fetch(100, jetstream.FetchMaxWait(300*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			out = append(out, failovertest.Event{Subject: m.Subject(), ID: m.Headers().Get(bus.HeaderMsgID)})
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			t.Fatal(err)
		}
		if n == 0 {
			return out
		}
	}
}
