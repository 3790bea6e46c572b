package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	nodeagent "github.com/shizu-gpu/shizu/services/node-agent/app"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// The chaos endpoint answers the admin only, names the fleet, and refuses
// what it cannot do in one line. (Breaking running agents is covered by the
// end-to-end test.)
func TestChaosEndpointAnswersOnlyTheAdmin(t *testing.T) {
	t.Parallel()
	pw := func(u string) string { return "pw-" + u }
	n := testkit.StartNATS(t, testkit.WithUsers(topology.Users(), pw))
	nodes, err := parseFleet("h100x8:1,rtx4090x8:1:spot")
	if err != nil {
		t.Fatal(err)
	}
	runner, err := newFleetRunner(nodes, func(fn fleetNode) nodeagent.Config {
		c := nodeagent.DefaultConfig()
		c.NodeID, c.Simulate, c.Market = fn.ID, fn.Profile, fn.Market
		return c
	}, discardLogger())
	if err != nil {
		t.Fatal(err)
	}
	admin := n.Connect(t, nats.UserInfo(topology.Admin, pw(topology.Admin)))
	sub, err := runner.serveChaos(t.Context(), admin)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	ask := func(nc *nats.Conn, node string, req chaosRequest) (chaosReply, error) {
		data, _ := json.Marshal(req)
		msg, err := nc.Request(fmt.Sprintf(chaosSubject, node), data, 5*time.Second)
		if err != nil {
			return chaosReply{}, err
		}
		var r chaosReply
		return r, json.Unmarshal(msg.Data, &r)
	}
	r, err := ask(admin, "all", chaosRequest{Action: "list"})
	if err != nil || !r.OK || len(r.Nodes) != 2 || r.Nodes[1].ID != "rtx4090x8-spot-1" || r.Nodes[1].Market != "spot" || r.Nodes[0].Running {
		t.Fatalf("list: %+v, %v", r, err)
	}
	for _, c := range []struct {
		name, node string
		req        chaosRequest
		want       string
	}{
		{"an unknown node is named", "v100-1", chaosRequest{Action: "kill"}, `no simulated node "v100-1"`},
		{"a stopped node cannot be killed", "h100x8-1", chaosRequest{Action: "kill"}, "is not running"},
		{"a stopped node takes no Xid", "h100x8-1", chaosRequest{Action: "xid", GPU: 1, XID: 79}, "is not running"},
		{"an unknown action is refused", "h100x8-1", chaosRequest{Action: "melt"}, `unknown action "melt"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := ask(admin, c.node, c.req)
			if err != nil || r.OK || !strings.Contains(r.Error, c.want) {
				t.Fatalf("reply %+v, %v; want an error with %q", r, err, c.want)
			}
		})
	}

	// A service user may not publish there: the server refuses it.
	refused := make(chan error, 4)
	sched := n.Connect(t, nats.UserInfo(topology.Scheduler, pw(topology.Scheduler)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { refused <- err }))
	if err := sched.Publish(fmt.Sprintf(chaosSubject, "h100x8-1"), []byte(`{"action":"kill"}`)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-refused:
		if !strings.Contains(err.Error(), "Permissions Violation") {
			t.Fatalf("scheduler's chaos publish: %v, want a permissions violation", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the server did not refuse the scheduler's chaos publish")
	}
	if runner.nodes()[0].Running {
		t.Fatal("a refused request started an agent")
	}
}
