package topology_test

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/shizu-gpu/shizu/shared/topology"
)

// TestDeployedNATSConfigLoadsTheTopologyUsers parses deploy/nats/nats.conf
// with nats-server's own parser, as the server would at start, and checks
// that every topology user arrives with its password (from the
// environment) and its declared permissions.
func TestDeployedNATSConfigLoadsTheTopologyUsers(t *testing.T) {
	setPasswords(t)
	opts, err := server.ProcessConfigFile(filepath.Join("..", "..", "deploy", "nats", "nats.conf"))
	if err != nil {
		t.Fatalf("nats.conf does not load: %v", err)
	}
	if !opts.JetStream || !opts.SyncAlways {
		t.Fatalf("jetstream=%v sync_always=%v: want JetStream with every write fsynced", opts.JetStream, opts.SyncAlways)
	}
	got := map[string]*server.User{}
	for _, u := range opts.Users {
		got[u.Username] = u
	}
	for _, want := range topology.Users() {
		u, ok := got[want.Name]
		if !ok {
			t.Errorf("user %s missing from the deployed config", want.Name)
			continue
		}
		if u.Password != "pw-"+want.Name {
			t.Errorf("user %s: password not taken from $%s", want.Name, topology.PasswordVar(want.Name))
		}
		if u.Permissions == nil || !slices.Equal(u.Permissions.Publish.Allow, want.Permissions.Publish) {
			t.Errorf("user %s: publish permissions differ from the topology", want.Name)
		}
		if u.Permissions != nil && (u.Permissions.Response != nil) != want.Permissions.Responses {
			t.Errorf("user %s: allow_responses %v, the topology says %v", want.Name, u.Permissions.Response != nil, want.Permissions.Responses)
		}
	}
	if opts.SystemAccount != topology.SystemAccount {
		t.Errorf("system account %q, want %q", opts.SystemAccount, topology.SystemAccount)
	}
	for _, want := range topology.SystemUsers() {
		u, ok := got[want.Name]
		if !ok {
			t.Errorf("system user %s missing from the deployed config", want.Name)
			continue
		}
		if u.Account == nil || u.Account.Name != topology.SystemAccount || u.Password != "pw-"+want.Name {
			t.Errorf("system user %s: account %v, password from $%s: %v", want.Name, u.Account, topology.PasswordVar(want.Name), u.Password == "pw-"+want.Name)
		}
		if u.Permissions == nil || !slices.Equal(u.Permissions.Subscribe.Allow, want.Permissions.Subscribe) || !slices.Equal(u.Permissions.Publish.Deny, []string{">"}) {
			t.Errorf("system user %s: permissions %+v, want subscribe %v only", want.Name, u.Permissions, want.Permissions.Subscribe)
		}
	}
}

func setPasswords(t *testing.T) {
	for _, u := range append(topology.Users(), topology.SystemUsers()...) {
		t.Setenv(topology.PasswordVar(u.Name), "pw-"+u.Name)
	}
}

// TestTheDeployedAdvisoryUserSeesAnAgentDisconnect runs a server from the
// deployed configuration: the failover-advisories user reads the
// disconnect advisory of a node agent (a user of the global account),
// which failover's fast path needs, and may publish nothing.
func TestTheDeployedAdvisoryUserSeesAnAgentDisconnect(t *testing.T) {
	setPasswords(t)
	opts, err := server.ProcessConfigFile(filepath.Join("..", "..", "deploy", "nats", "nats.conf"))
	if err != nil {
		t.Fatal(err)
	}
	opts.Host, opts.Port, opts.HTTPPort, opts.StoreDir, opts.NoLog, opts.NoSigs = "127.0.0.1", -1, 0, t.TempDir(), true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	errs := make(chan error, 4)
	adv, err := nats.Connect(s.ClientURL(), nats.UserInfo(topology.FailoverAdvisories, "pw-"+topology.FailoverAdvisories),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer adv.Close()
	sub, err := adv.SubscribeSync(topology.DisconnectAdvisories)
	if err != nil {
		t.Fatal(err)
	}
	if err := adv.Flush(); err != nil {
		t.Fatal(err)
	}
	agent, err := nats.Connect(s.ClientURL(), nats.UserInfo(topology.NodeAgent, "pw-"+topology.NodeAgent), nats.Name("node-agent:n1"))
	if err != nil {
		t.Fatal(err)
	}
	agent.Close()
	for {
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("no disconnect advisory: %v", err)
		}
		if strings.Contains(string(m.Data), `"name":"node-agent:n1"`) {
			break
		}
	}
	// Publishing anything is refused.
	if err := adv.Publish("rental.acme.requested", []byte("x")); err != nil {
		t.Fatal(err)
	}
	_ = adv.Flush()
	select {
	case err := <-errs:
		if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			t.Fatalf("publish refused with %v, want a permissions violation", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the advisory user published without a permissions violation")
	}
}
