package app

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shizu-gpu/shizu/services/failover/app/failovertest"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
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
	_ releases          = failovertest.Releases(nil)
	_ releases          = (*failovertest.Capacity)(nil)
	_ releases          = (*capacity.Store)(nil)
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

func TestTheCapacityStoreKeepsTheReleasesContract(t *testing.T) {
	t.Parallel()
	failovertest.RunReleasesContract(t, func(t *testing.T) failovertest.ReleasesUnderTest {
		store, err := capacity.New(testkit.StartRedis(t).Client(t))
		if err != nil {
			t.Fatal(err)
		}
		epochs := map[string]uint64{}
		return failovertest.ReleasesUnderTest{Releases: store,
			Place: func(t *testing.T, rental, node string) {
				if epochs[node] == 0 {
					n := capacity.Node{ID: node, Zone: "z1", Market: capacity.MarketOnDemand, PricePerGPUHourMicros: 2_000_000,
						Currency: "USD", CPUMilli: 192_000, MemoryMiB: 2 << 20}
					for i := range 8 {
						n.GPUs = append(n.GPUs, capacity.GPU{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", node, i), Model: "H100-SXM5-80GB", VRAMMiB: 81920})
					}
					if epochs[node], err = store.Register(t.Context(), n); err != nil {
						t.Fatal(err)
					}
				}
				p := capacity.Placement{RentalID: rental, NodeID: node, Epoch: epochs[node], Tenant: "acme", CPUMilli: 1000, MemoryMiB: 1024,
					GPUs: []capacity.GPUShare{{Index: 0, Milli: 100, VRAMMiB: 1024}}}
				if _, err := store.Reserve(t.Context(), p); err != nil {
					t.Fatal(err)
				}
			},
			Held: func(t *testing.T, node string) []string {
				as, err := store.Allocations(t.Context(), node)
				if err != nil {
					t.Fatal(err)
				}
				var out []string
				for _, a := range as {
					out = append(out, a.RentalID)
				}
				return out
			}}
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
