package topology_test

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/shizu-gpu/shizu/shared/topology"
)

// TestDeployedNATSConfigLoadsTheTopologyUsers parses deploy/nats/nats.conf
// with nats-server's own parser, as the server would at start, and checks
// that every topology user arrives with its password (from the
// environment) and its declared permissions.
func TestDeployedNATSConfigLoadsTheTopologyUsers(t *testing.T) {
	for _, u := range topology.Users() {
		t.Setenv(topology.PasswordVar(u.Name), "pw-"+u.Name)
	}
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
	}
}
