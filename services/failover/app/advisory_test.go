package app_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// withSystemUser gives the server an explicit system account with one user,
// who may read the server's advisories ($SYS.ACCOUNT.<account>.DISCONNECT).
func withSystemUser(user, pw string) func(*server.Options) {
	return func(o *server.Options) {
		sys := server.NewAccount("SYS")
		o.Accounts = append(o.Accounts, sys)
		o.SystemAccount = "SYS"
		o.Users = append(o.Users, &server.User{Username: user, Password: pw, Account: sys})
	}
}

func TestACrashedAgentsDisconnectIsALossLongBeforeItsHeartbeatExpires(t *testing.T) {
	t.Parallel()
	srv := testkit.StartNATS(t, testkit.WithUsers(topology.Users(), testkit.Password), withSystemUser("sys", "pw-sys"))
	// The heartbeat outlives the test's patience: only the disconnect can
	// reveal the crash.
	e := newEnv(t, time.Minute, testkit.OnNATS(srv))
	epoch := e.node(t, "n1", 8)
	e.rent(t, "r1", "n1", epoch, shizuv1.Plan_PLAN_ON_DEMAND, 0)
	cfg := testConfig()
	cfg.Advisory.URL, cfg.Advisory.User, cfg.Advisory.Password = srv.URL, "sys", "pw-sys"
	e.startReplica(t, cfg, "failover-a", nil)
	waitIndexed(t, e, "r1")
	agent := srv.Connect(t, nats.UserInfo(topology.NodeAgent, testkit.Password(topology.NodeAgent)), nats.Name("node-agent:n1"))
	// Another service's connection closing is no node's loss.
	other := srv.Connect(t, nats.UserInfo(topology.NodeAgent, testkit.Password(topology.NodeAgent)), nats.Name("node-agent"))
	other.Close()
	e.beat(t, "n1", epoch)()
	agent.Close() // the process dies: the server sees the connection drop
	var lost []*shizuv1.NodeLost
	eventually(t, func() error {
		if lost = events[*shizuv1.NodeLost](t, e, topology.StreamNodes, subject.NodeLostAll); len(lost) != 1 {
			return fmt.Errorf("%d NodeLost", len(lost))
		}
		return nil
	})
	if lost[0].GetReason() != shizuv1.NodeLostReason_NODE_LOST_REASON_AGENT_DISCONNECTED || lost[0].GetNodeId() != "n1" {
		t.Fatalf("NodeLost %v, want n1 AGENT_DISCONNECTED", lost[0])
	}
	eventually(t, func() error {
		if m := migratingByRental(t, e)["r1"]; m == nil {
			return fmt.Errorf("r1 not moved")
		}
		return nil
	})
}
