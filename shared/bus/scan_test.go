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
	last, err := bus.ScanStream(t.Context(), js, "SCAN", "scan.a", func(msg *jetstream.RawStreamMsg) error {
		got = append(got, string(msg.Data))
		return nil
	})
	if err != nil || !slices.Equal(got, []string{"1", "2", "3"}) || last != 4 {
		t.Fatalf("scanned %v up to %d, %v; want 1 2 3 up to 4", got, last, err)
	}
	stop := errors.New("stop")
	n := 0
	_, err = bus.ScanStream(t.Context(), js, "SCAN", "scan.>", func(*jetstream.RawStreamMsg) error { n++; return stop })
	if !errors.Is(err, stop) || n != 1 {
		t.Fatalf("scan after an error: %d calls, %v", n, err)
	}
	if _, err := bus.ScanStream(t.Context(), js, "NONE", "x", func(*jetstream.RawStreamMsg) error { return nil }); err == nil {
		t.Fatal("a missing stream scanned without an error")
	}
}

// A scan longer than one window keeps the order across windows and skips
// the sequences whose message was deleted.
func TestAScanAcrossWindowsSkipsDeletedMessages(t *testing.T) {
	t.Parallel()
	_, js := testkit.StartNATS(t).JetStream(t)
	st, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "LONG", Subjects: []string{"long.>"}})
	if err != nil {
		t.Fatal(err)
	}
	const n = 2500
	for i := range n {
		if _, err := js.PublishAsync("long.x", []byte{byte(i % 256)}); err != nil {
			t.Fatal(err)
		}
	}
	<-js.PublishAsyncComplete()
	if err := st.DeleteMsg(t.Context(), 1500); err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	last, err := bus.ScanStream(t.Context(), js, "LONG", ">", func(m *jetstream.RawStreamMsg) error {
		seqs = append(seqs, m.Sequence)
		return nil
	})
	if err != nil || last != n || len(seqs) != n-1 || !slices.IsSorted(seqs) || slices.Contains(seqs, 1500) {
		t.Fatalf("scanned %d messages up to %d (sorted %v, 1500 read %v), %v", len(seqs), last, slices.IsSorted(seqs), slices.Contains(seqs, 1500), err)
	}
}
