package testkit

import (
	"github.com/nats-io/nats-server/v2/server"

	"github.com/shizu-gpu/shizu/shared/embednats"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// WithUsers configures one NATS user per topology user, each with its
// declared permissions and the password password(name).
func WithUsers(users []topology.User, password func(name string) string) func(*server.Options) {
	return func(o *server.Options) {
		o.Users = append(o.Users, embednats.Users(users, password)...)
	}
}
