package bus_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

// A scan reads the messages on its filter in order, up to the last one
// stored when it began; an error from fn ends it with that error.
func TestAScanReadsTheFilteredMessagesInOrder(t *testing.T) {
	t.Parallel()
	_, js := testkit.StartNATS(t).JetStream(t)
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "SCAN", Subjects: []string{"scan.>"}}); err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct{ subj, data string }{{"scan.a", "1"}, {"scan.b", "x"}, {"scan.a", "2"}, {"scan.a", "3"}} {
		if _, err := js.Publish(t.Context(), m.subj, []byte(m.data)); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	err := bus.ScanStream(t.Context(), js, "SCAN", "scan.a", func(msg *jetstream.RawStreamMsg) error {
		got = append(got, string(msg.Data))
		return nil
	})
	if err != nil || !slices.Equal(got, []string{"1", "2", "3"}) {
		t.Fatalf("scanned %v, %v; want 1 2 3", got, err)
	}
	stop := errors.New("stop")
	n := 0
	err = bus.ScanStream(t.Context(), js, "SCAN", "scan.>", func(*jetstream.RawStreamMsg) error { n++; return stop })
	if !errors.Is(err, stop) || n != 1 {
		t.Fatalf("scan after an error: %d calls, %v", n, err)
	}
	if err := bus.ScanStream(t.Context(), js, "NONE", "x", func(*jetstream.RawStreamMsg) error { return nil }); err == nil {
		t.Fatal("a missing stream scanned without an error")
	}
}
