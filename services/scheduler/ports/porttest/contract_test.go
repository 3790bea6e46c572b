package porttest_test

import (
	"fmt"
	"testing"

	"github.com/shizu-gpu/shizu/services/scheduler/ports"
	"github.com/shizu-gpu/shizu/services/scheduler/ports/porttest"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

func TestTheFakeReserverKeepsTheReserverContract(t *testing.T) {
	t.Parallel()
	porttest.RunReserverContract(t, func(*testing.T) porttest.ReserverFixture {
		return porttest.ReserverFixture{Reserver: porttest.NewReserver(porttest.FakeNode{ID: "n1", Epoch: 1, GPUs: 2}), Node: "n1", Epoch: 1}
	})
}

func TestTheCapacityStoreKeepsTheReserverContract(t *testing.T) {
	t.Parallel()
	srv := testkit.StartRedis(t)
	n := 0
	porttest.RunReserverContract(t, func(t *testing.T) porttest.ReserverFixture {
		n++
		store, err := capacity.New(srv.Client(t), capacity.WithPrefix(fmt.Sprintf("contract%d", n)))
		if err != nil {
			t.Fatal(err)
		}
		node := capacity.Node{ID: "n1", Zone: "zone-a", Market: capacity.MarketOnDemand, PricePerGPUHourMicros: 1, Currency: "USD",
			CPUMilli: 8000, MemoryMiB: 8192, GPUs: []capacity.GPU{{Index: 0, UUID: "GPU-n1-0", Model: "H100-SXM5-80GB", VRAMMiB: 80 * 1024}}}
		epoch, err := store.Register(t.Context(), node)
		if err != nil {
			t.Fatal(err)
		}
		return porttest.ReserverFixture{Reserver: store, Node: "n1", Epoch: epoch}
	})
}

func TestTheFakeRecordsKeepTheOutcomeRecordsContract(t *testing.T) {
	t.Parallel()
	porttest.RunOutcomeRecordsContract(t, func(*testing.T) ports.OutcomeRecords { return porttest.NewRecords() })
}

func TestTheFakePublisherKeepsThePublisherContract(t *testing.T) {
	t.Parallel()
	porttest.RunPublisherContract(t, func(*testing.T) ports.Publisher { return &porttest.Publisher{} })
}
