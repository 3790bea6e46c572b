package app

import (
	"context"
	"strconv"

	"google.golang.org/protobuf/proto"

	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
)

// publisher is what the agent needs of the bus to announce what happened:
// publish one event to a subject and return once the stream holds it. A
// repeated event id is stored once (agenttest.RunPublisherContract).
type publisher interface {
	Publish(ctx context.Context, subject string, ev proto.Message) error
}

// heartbeat is what the agent needs of the heartbeat bucket: renew the
// node's key with its epoch; the key expires by its TTL when the beats
// stop (agenttest.RunHeartbeatContract).
type heartbeat interface {
	Beat(ctx context.Context, node string, epoch int64) error
}

// nodeRecords is what the agent needs of the capacity store: its node's
// registration (and its restore into a store that was lost: the store's
// generation tells), epoch and status, and the allocations it holds
// (agenttest.RunNodeRecordsContract). *capacity.Store is the real one.
type nodeRecords interface {
	Join(ctx context.Context, n capacity.Node) (capacity.Registration, error)
	Restore(ctx context.Context, in capacity.RestoreInput) (capacity.RestoreResult, error)
	Generation(ctx context.Context) (string, error)
	Node(ctx context.Context, nodeID string) (capacity.NodeState, error)
	Renew(ctx context.Context, rentalID, nodeID string, epoch uint64) error
	SetStatus(ctx context.Context, nodeID string, status capacity.NodeStatus, expectedEpoch uint64) error
	Allocations(ctx context.Context, nodeID string) ([]capacity.Allocation, error)
}

// busPublisher publishes on JetStream.
type busPublisher struct{ conn *bus.Conn }

func (p busPublisher) Publish(ctx context.Context, subject string, ev proto.Message) error {
	_, err := p.conn.Publish(ctx, subject, ev)
	return err
}

// busHeartbeat beats in the JetStream heartbeat bucket; the payload is the
// epoch in decimal, which failover reads.
type busHeartbeat struct{ hb *bus.Heartbeats }

func (h busHeartbeat) Beat(ctx context.Context, node string, epoch int64) error {
	_, err := h.hb.Beat(ctx, node, []byte(strconv.FormatInt(epoch, 10)))
	return err
}
