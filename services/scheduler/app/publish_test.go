package app_test

import (
	"testing"

	"github.com/shizu-gpu/shizu/services/scheduler/app"
	"github.com/shizu-gpu/shizu/services/scheduler/ports"
	"github.com/shizu-gpu/shizu/services/scheduler/ports/porttest"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// The bus publisher (the scheduler's own NATS user on the topology's
// streams) keeps the contract the round's fakes are held to.
func TestTheBusPublisherKeepsThePublisherContract(t *testing.T) {
	t.Parallel()
	d := testkit.Platform(t)
	porttest.RunPublisherContract(t, func(t *testing.T) ports.Publisher {
		return app.BusPublisher{Conn: d.Connect(t, topology.Scheduler)}
	})
}
