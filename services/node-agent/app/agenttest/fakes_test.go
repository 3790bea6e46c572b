package agenttest_test

import (
	"testing"

	"github.com/shizu-gpu/shizu/services/node-agent/app/agenttest"
)

func TestTheFakeBusPassesThePublisherContract(t *testing.T) {
	t.Parallel()
	agenttest.RunPublisherContract(t, func(t *testing.T) agenttest.PublisherUnderTest {
		b := agenttest.NewBus()
		return agenttest.PublisherUnderTest{Publisher: b, Held: func(_ *testing.T, subject string) [][]byte { return b.Held(subject) }}
	})
}

func TestTheFakeBeatsPassTheHeartbeatContract(t *testing.T) {
	t.Parallel()
	agenttest.RunHeartbeatContract(t, func(t *testing.T) agenttest.HeartbeatUnderTest {
		h := agenttest.NewBeats()
		return agenttest.HeartbeatUnderTest{Heartbeat: h, Alive: func(_ *testing.T, node string) (bool, int64) { return h.Alive(node) }}
	})
}

func TestTheFakeCapacityPassesTheNodeRecordsContract(t *testing.T) {
	t.Parallel()
	agenttest.RunNodeRecordsContract(t, func(t *testing.T) agenttest.NodeRecordsUnderTest {
		c := agenttest.NewCapacity()
		return agenttest.NodeRecordsUnderTest{Records: c,
			Reserve: func(t *testing.T, rental, node string, epoch uint64) {
				if err := c.Reserve(rental, node, epoch); err != nil {
					t.Fatal(err)
				}
			},
			Fence: func(t *testing.T, node string, epoch uint64) {
				if err := c.Fence(node, epoch); err != nil {
					t.Fatal(err)
				}
			}}
	})
}
