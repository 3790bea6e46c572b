// Package embednats runs a nats-server inside the process, with JetStream
// and the users the topology declares. `shizu dev` and the test kit use it;
// production runs a real nats-server with deploy/nats/nats.conf.
package embednats

import (
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/shizu-gpu/shizu/shared/topology"
)

// Users converts topology users to server users with their declared
// permissions, each with the password password(name).
func Users(users []topology.User, password func(name string) string) []*server.User {
	out := make([]*server.User, 0, len(users))
	for _, u := range users {
		perms := &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: u.Permissions.Publish},
			Subscribe: &server.SubjectPermission{Allow: u.Permissions.Subscribe},
		}
		if u.Permissions.Responses {
			// As allow_responses: true in deploy/nats/users.conf.
			perms.Response = &server.ResponsePermission{MaxMsgs: server.DEFAULT_ALLOW_RESPONSE_MAX_MSGS,
				Expires: server.DEFAULT_ALLOW_RESPONSE_EXPIRATION}
		}
		out = append(out, &server.User{Username: u.Name, Password: password(u.Name), Permissions: perms})
	}
	return out
}

// Start starts a server with opts and waits until it accepts clients.
func Start(opts *server.Options, timeout time.Duration) (*server.Server, error) {
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("configure nats-server: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(timeout) {
		ns.Shutdown()
		return nil, fmt.Errorf("nats-server on %s:%d not ready within %s", opts.Host, opts.Port, timeout)
	}
	return ns, nil
}
