// Package benchtest gives a `go test -bench` benchmark its benchkit.Env
// on real servers from shared/testkit: an in-process nats-server with
// JetStream and the platform's users, and a redis-server child, both
// stopped by the benchmark's cleanup.
package benchtest

import (
	"testing"

	"github.com/shizu-gpu/shizu/shared/benchkit"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Env starts fresh servers for one benchmark run and opens an env on them.
func Env(tb testing.TB) *benchkit.Env {
	tb.Helper()
	nats := testkit.StartNATS(tb, testkit.WithUsers(topology.Users(), Password))
	redis := testkit.StartRedis(tb)
	e, err := benchkit.Open(tb.Context(), benchkit.Servers{NATSURL: nats.URL, Password: Password,
		RedisURL: "redis://" + redis.Addr + "/0", Dir: tb.TempDir()})
	if err != nil {
		tb.Fatalf("benchtest: %v", err)
	}
	tb.Cleanup(func() { e.Close(tb.Context()) })
	return e
}

// Password is every platform user's password on the test server.
func Password(user string) string { return "bench-" + user }
