package rentallogs_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/rentallogs"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

var t0 = time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)

// shipper publishes batches for one rental as a node agent would.
type shipper struct {
	conn                 *bus.Conn
	tenant, rental, node string
	offset               int64
}

// ship publishes lines (and the drops before them) as one batch.
func (s *shipper) ship(t *testing.T, dropped int64, end bool, lines ...string) {
	t.Helper()
	b := &shizuv1.RentalLogBatch{
		Meta:     shizuv1.NewMeta(fmt.Sprintf("log:%s:1:%d", s.rental, s.offset), "node-agent/"+s.node, "", s.rental, t0),
		RentalId: s.rental, TenantId: s.tenant, NodeId: s.node, Attempt: 1, Offset: s.offset,
		DroppedLines: dropped, EndOfOutput: end,
	}
	for _, l := range lines {
		b.Lines = append(b.Lines, &shizuv1.LogLine{ReadAt: timestamppb.New(t0), Text: l})
		s.offset += int64(len(l)) + 1
	}
	if err := b.Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.conn.Publish(t.Context(), "log."+s.tenant+"."+s.rental, b); err != nil {
		t.Fatal(err)
	}
}

func setup(t *testing.T) *bus.Conn {
	t.Helper()
	return testkit.Platform(t).Admin
}

func texts(lines []rentallogs.Line) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = l.String()
	}
	return out
}

func consumers(t *testing.T, conn *bus.Conn) int {
	t.Helper()
	s, err := conn.JetStream().Stream(t.Context(), topology.StreamLogs)
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().State.Consumers
}

func TestTailReturnsTheLastLinesOfOneRentalOnlyAndFollowContinuesWithoutAGap(t *testing.T) {
	t.Parallel()
	conn := setup(t)
	mine := &shipper{conn: conn, tenant: "acme", rental: "r-1", node: "n1"}
	other := &shipper{conn: conn, tenant: "acme", rental: "r-2", node: "n1"}
	stranger := &shipper{conn: conn, tenant: "evil", rental: "r-1", node: "n2"}
	// 700 batches of mine among 2,100 of others: Tail has to widen its
	// window several times to find 1,000 lines.
	for i := range 700 {
		mine.ship(t, 0, false, fmt.Sprintf("line %d.a", i), fmt.Sprintf("line %d.b", i))
		for range 3 {
			other.ship(t, 0, false, "not mine")
		}
		if i%7 == 0 {
			stranger.ship(t, 0, false, "another tenant's rental of the same name")
		}
	}
	mine.ship(t, 42, true, "last words")

	got, cursor, err := rentallogs.Tail(t.Context(), conn.JetStream(), "acme", "r-1", 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1000 {
		t.Fatalf("Tail gave %d entries, want 1000", len(got))
	}
	want := []string{"[42 lines dropped: the rental wrote faster than the log rate limit]", "last words", "[end of the output of run 1 on node n1]"}
	if tail := texts(got[len(got)-3:]); fmt.Sprint(tail) != fmt.Sprint(want) {
		t.Fatalf("Tail ends with %q, want %q", tail, want)
	}
	// 997 lines before the markers: the last 498.5 batches of two lines.
	if got[0].Text != "line 201.b" || got[1].Text != "line 202.a" {
		t.Fatalf("Tail starts with %q, %q; want line 201.b, line 202.a", got[0].Text, got[1].Text)
	}
	for _, l := range got {
		if l.Text == "not mine" || l.NodeID != "n1" {
			t.Fatalf("Tail returned another rental's line %+v", l)
		}
	}

	mine.ship(t, 0, false, "after the tail")
	var followed []string
	err = rentallogs.Follow(t.Context(), conn.JetStream(), "acme", "r-1", cursor, func(l rentallogs.Line) error {
		followed = append(followed, l.Text)
		return rentallogs.ErrStop
	})
	if err != nil || fmt.Sprint(followed) != "[after the tail]" {
		t.Fatalf("Follow from the cursor gave %q, %v; want exactly the line shipped after the tail", followed, err)
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		if n := consumers(t, conn); n != 0 {
			return fmt.Errorf("%d consumers left on LOGS", n)
		}
		return nil
	})
}

func TestFollowDeliversNewLinesAsTheyArriveAndLeavesNoConsumerWhenCancelled(t *testing.T) {
	t.Parallel()
	conn := setup(t)
	s := &shipper{conn: conn, tenant: "acme", rental: "r-3", node: "n1"}
	got, cursor, err := rentallogs.Tail(t.Context(), conn.JetStream(), "acme", "r-3", 10)
	if err != nil || len(got) != 0 {
		t.Fatalf("Tail of a rental without output = %v, %v", got, err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	lines := make(chan string, 16)
	done := make(chan error, 1)
	go func() {
		done <- rentallogs.Follow(ctx, conn.JetStream(), "acme", "r-3", cursor, func(l rentallogs.Line) error {
			lines <- l.Text
			return nil
		})
	}()
	testkit.Eventually(t, 5*time.Second, func() error {
		if n := consumers(t, conn); n != 1 {
			return fmt.Errorf("%d consumers while following, want 1", n)
		}
		return nil
	})
	s.ship(t, 0, false, "one", "two")
	s.ship(t, 0, false, "three")
	for _, want := range []string{"one", "two", "three"} {
		select {
		case l := <-lines:
			if l != want {
				t.Fatalf("followed %q, want %q", l, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no %q followed", want)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Follow returned %v after its context ended, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Follow did not return after its context ended")
	}
	if n := consumers(t, conn); n != 0 {
		t.Fatalf("%d consumers left on LOGS after Follow returned", n)
	}
}

func TestACallbackErrorEndsFollowWithThatErrorAndNoConsumerLeft(t *testing.T) {
	t.Parallel()
	conn := setup(t)
	s := &shipper{conn: conn, tenant: "acme", rental: "r-4", node: "n1"}
	s.ship(t, 0, false, "a")
	boom := errors.New("client went away")
	err := rentallogs.Follow(t.Context(), conn.JetStream(), "acme", "r-4", 1, func(rentallogs.Line) error { return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("Follow = %v, want the callback's error", err)
	}
	if n := consumers(t, conn); n != 0 {
		t.Fatalf("%d consumers left on LOGS", n)
	}
}

func TestABatchWhoseBodyNamesAnotherRentalIsNeverShown(t *testing.T) {
	t.Parallel()
	conn := setup(t)
	forged := &shizuv1.RentalLogBatch{Meta: shizuv1.NewMeta("log:forged", "x", "", "r-9", t0), RentalId: "r-9", TenantId: "victim",
		NodeId: "n1", Attempt: 1, Lines: []*shizuv1.LogLine{{ReadAt: timestamppb.New(t0), Text: "forged"}}}
	if _, err := conn.Publish(t.Context(), "log.acme.r-5", forged); err != nil {
		t.Fatal(err)
	}
	(&shipper{conn: conn, tenant: "acme", rental: "r-5", node: "n1"}).ship(t, 0, false, "genuine")
	got, _, err := rentallogs.Tail(t.Context(), conn.JetStream(), "acme", "r-5", 10)
	if err != nil || fmt.Sprint(texts(got)) != "[genuine]" {
		t.Fatalf("Tail = %q, %v; want only the genuine line", texts(got), err)
	}
}

func TestBadArgumentsAreRefusedNamingWhatIsWrong(t *testing.T) {
	t.Parallel()
	conn := setup(t)
	js := conn.JetStream()
	for name, call := range map[string]func() error{
		"a tenant with a dot": func() error { _, _, err := rentallogs.Tail(t.Context(), js, "a.b", "r-1", 10); return err },
		"a wildcard rental":   func() error { _, _, err := rentallogs.Tail(t.Context(), js, "acme", "*", 10); return err },
		"zero lines":          func() error { _, _, err := rentallogs.Tail(t.Context(), js, "acme", "r-1", 0); return err },
		"too many lines": func() error {
			_, _, err := rentallogs.Tail(t.Context(), js, "acme", "r-1", rentallogs.MaxTail+1)
			return err
		},
		"following a '>' rental": func() error {
			return rentallogs.Follow(t.Context(), js, "acme", ">", 0, func(rentallogs.Line) error { return nil })
		},
	} {
		if err := call(); !fault.IsInvalid(err) {
			t.Errorf("%s: err = %v, want an invalid-input error", name, err)
		}
	}
}

// A service whose topology says ReadsLogs can tail and follow with exactly
// the permissions that gives; one without cannot.
func TestAServiceThatReadsLogsNeedsNoMoreThanItsDeclaredPermissions(t *testing.T) {
	t.Parallel()
	reader := topology.Service{Name: "log-reader", ReadsLogs: true}
	pw := func(u string) string { return "pw-" + u }
	users := append(topology.Users(), topology.User{Name: reader.Name, Permissions: reader.Permissions()})
	n := testkit.StartNATS(t, testkit.WithUsers(users, pw))
	connect := func(user string) *bus.Conn {
		c, err := bus.Connect(t.Context(), bus.Config{URL: n.URL, User: user, Password: pw(user)}, bus.Instruments{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.WithoutCancel(t.Context())) })
		return c
	}
	admin := connect(topology.Admin)
	if err := admin.EnsureStreams(t.Context(), topology.Streams(1)...); err != nil {
		t.Fatal(err)
	}
	s := &shipper{conn: admin, tenant: "acme", rental: "r-6", node: "n1"}
	s.ship(t, 0, false, "one")
	s.ship(t, 0, false, "two")

	js := connect(reader.Name).JetStream()
	got, cursor, err := rentallogs.Tail(t.Context(), js, "acme", "r-6", 10)
	if err != nil || fmt.Sprint(texts(got)) != "[one two]" {
		t.Fatalf("Tail as %s = %q, %v", reader.Name, texts(got), err)
	}
	s.ship(t, 0, false, "three")
	var followed []string
	err = rentallogs.Follow(t.Context(), js, "acme", "r-6", cursor, func(l rentallogs.Line) error {
		followed = append(followed, l.Text)
		return rentallogs.ErrStop
	})
	if err != nil || fmt.Sprint(followed) != "[three]" {
		t.Fatalf("Follow as %s = %q, %v", reader.Name, followed, err)
	}
	if n := consumers(t, admin); n != 0 {
		t.Fatalf("%d consumers left on LOGS by %s", n, reader.Name)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	if _, _, err := rentallogs.Tail(ctx, connect(topology.NodeAgent).JetStream(), "acme", "r-6", 10); err == nil {
		t.Fatal("the node agent, which does not read logs, could tail them")
	}
}
