package testkit

import (
	"testing"
	"time"
)

// Eventually polls cond every 10 ms until it returns nil or timeout passes,
// then fails the test with the last error. Use it instead of time.Sleep to
// wait for something to happen.
func Eventually(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s: %v", timeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
