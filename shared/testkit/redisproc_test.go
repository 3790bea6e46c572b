package testkit_test

import (
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/shizu-gpu/shizu/shared/testkit"
)

// A redis-server process killed -9 and started again keeps every
// acknowledged write with its AOF and starts empty without one.
func TestARedisProcessKilledAndStartedAgainKeepsItsAOF(t *testing.T) {
	t.Parallel()
	for _, persistent := range []bool{true, false} {
		r := testkit.StartRedisProcess(t, t.TempDir(), persistent)
		rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
		t.Cleanup(func() { _ = rdb.Close() })
		if err := rdb.Set(t.Context(), "k", "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		r.Kill(t)
		if r.Running() {
			t.Fatal("running after Kill")
		}
		r.Start(t)
		got, err := rdb.Get(t.Context(), "k").Result()
		switch {
		case persistent && (err != nil || got != "v"):
			t.Fatalf("with an AOF, after the kill: %q, %v", got, err)
		case !persistent && !errors.Is(err, redis.Nil):
			t.Fatalf("without persistence, after the kill: %q, %v; want nothing", got, err)
		}
	}
}
