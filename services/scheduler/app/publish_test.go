package app_test

import (
	"context"
	"testing"

	"github.com/shizu-gpu/shizu/services/scheduler/app"
	"github.com/shizu-gpu/shizu/services/scheduler/ports"
	"github.com/shizu-gpu/shizu/services/scheduler/ports/porttest"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// The bus publisher (the scheduler's own NATS user on the topology's
// streams) keeps the contract the round's fakes are held to.
func TestTheBusPublisherKeepsThePublisherContract(t *testing.T) {
	t.Parallel()
	e := newQuietEnv(t)
	porttest.RunPublisherContract(t, func(t *testing.T) ports.Publisher {
		conn, err := bus.Connect(t.Context(), bus.Config{URL: e.nats.URL, User: topology.Scheduler, Password: password(topology.Scheduler)}, bus.Instruments{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close(context.WithoutCancel(t.Context())) })
		return app.BusPublisher{Conn: conn}
	})
}
