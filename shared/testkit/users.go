package testkit

import (
	"github.com/nats-io/nats-server/v2/server"

	"github.com/shizu-gpu/shizu/shared/topology"
)

// WithUsers configures one NATS user per topology user, each with its
// declared permissions and the password password(name).
func WithUsers(users []topology.User, password func(name string) string) func(*server.Options) {
	return func(o *server.Options) {
		for _, u := range users {
			o.Users = append(o.Users, &server.User{
				Username: u.Name,
				Password: password(u.Name),
				Permissions: &server.Permissions{
					Publish:   &server.SubjectPermission{Allow: u.Permissions.Publish},
					Subscribe: &server.SubjectPermission{Allow: u.Permissions.Subscribe},
				},
			})
		}
	}
}
