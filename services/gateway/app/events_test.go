package app_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/gateway/identity"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// stream is an open event stream of one rental.
type stream struct {
	resp *http.Response
	r    *bufio.Reader
	raw  strings.Builder
}

func (h *harness) follow(ctx context.Context, key, id string) *stream {
	h.t.Helper()
	hr, err := http.NewRequestWithContext(ctx, "GET", h.urls[0]+"/v1/rentals/"+id+"/events", nil)
	if err != nil {
		h.t.Fatal(err)
	}
	hr.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = resp.Body.Close() })
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		b, _ := io.ReadAll(resp.Body)
		h.t.Fatalf("events: %d %s", resp.StatusCode, b)
	}
	return &stream{resp: resp, r: bufio.NewReader(resp.Body)}
}

// next reads one event and returns its data, checked against the Rental
// schema; io.EOF when the stream ended.
func (s *stream) next(h *harness) (rentalDoc, error) {
	h.t.Helper()
	var data string
	for {
		line, err := s.r.ReadString('\n')
		s.raw.WriteString(line)
		if err != nil {
			return rentalDoc{}, err
		}
		line = strings.TrimRight(line, "\n")
		switch {
		case strings.HasPrefix(line, "data: "):
			data = strings.TrimPrefix(line, "data: ")
		case line == "" && data != "":
			if err := h.validRental([]byte(data)); err != nil {
				h.t.Fatalf("an event's rental does not match the document: %v\n%s", err, data)
			}
			var r rentalDoc
			answer{Body: []byte(data)}.json(h.t, &r)
			return r, nil
		}
	}
}

// viewConsumers counts the watches' consumers on the read model's stream.
func (h *harness) viewConsumers() int {
	h.t.Helper()
	s, err := h.admin.JetStream().Stream(h.t.Context(), "KV_"+topology.RentalViewBucket)
	if err != nil {
		h.t.Fatal(err)
	}
	n := 0
	names := s.ConsumerNames(h.t.Context())
	for name := range names.Name() {
		if name != topology.WebhooksDurable { // the webhook deliveries' durable stays
			n++
		}
	}
	if err := names.Err(); err != nil {
		h.t.Fatal(err)
	}
	return n
}

func TestEventsFollowARentalUntilItEndsAndLeaveNoConsumer(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1, testOptions())
	key := h.tenant("acme", identity.ReadWrite)
	id := h.create(key)
	h.projected(key, id)
	s := h.follow(t.Context(), key, id)
	first, err := s.next(h)
	if err != nil || first.ID != id || first.State != "requested" {
		t.Fatalf("first event: %+v, %v", first, err)
	}
	h.publish(subject.RentalRejected, "acme", &shizuv1.RentalRejected{
		Meta:     shizuv1.NewMeta("rental:"+id+":rejected", "scheduler", "", id, time.Now()),
		RentalId: id, TenantId: "acme", Reason: shizuv1.RejectReason_REJECT_REASON_UNSATISFIABLE, Message: "no node has 9 GPUs"})
	var last rentalDoc
	for {
		r, err := s.next(h)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		last = r
	}
	if last.State != "rejected" {
		t.Fatalf("the stream ended at %+v, want the rejection", last)
	}
	if err := h.validate("GET", "/v1/rentals/"+id+"/events",
		answer{Status: s.resp.StatusCode, Header: s.resp.Header, Body: []byte(s.raw.String())}); err != nil {
		t.Fatalf("the event stream does not match the document: %v", err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		if n := h.viewConsumers(); n != 0 {
			return fmt.Errorf("%d consumers left on the read model", n)
		}
		return nil
	})
}

func TestEventsEndWhenTheClientLeavesAndLeaveNoConsumer(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1, testOptions())
	key := h.tenant("acme", identity.ReadWrite)
	id := h.create(key)
	h.projected(key, id)
	ctx, leave := context.WithCancel(t.Context())
	s := h.follow(ctx, key, id)
	if _, err := s.next(h); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		if h.viewConsumers() == 0 {
			return errors.New("the stream watches nothing")
		}
		return nil
	})
	leave()
	testkit.Eventually(t, 10*time.Second, func() error {
		if n := h.viewConsumers(); n != 0 {
			return fmt.Errorf("%d consumers left after the client left", n)
		}
		return nil
	})
}

func TestListPagesAndFilters(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1, testOptions())
	key := h.tenant("acme", identity.ReadWrite)
	for i := range 3 {
		a := h.do(req{method: "POST", path: "/v1/rentals", key: key,
			body: map[string]any{"plan": []string{"spot", "on-demand", "spot"}[i], "labels": map[string]string{"i": fmt.Sprint(i)}}})
		if a.Status != http.StatusCreated {
			t.Fatalf("create %d: %d %s", i, a.Status, a.Body)
		}
	}
	type page struct {
		Rentals    []rentalDoc
		NextCursor string `json:"next_cursor"`
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		var p page
		h.do(req{method: "GET", path: "/v1/rentals", key: key}).json(t, &p)
		if len(p.Rentals) != 3 {
			return fmt.Errorf("%d rentals listed", len(p.Rentals))
		}
		return nil
	})
	var p1, p2 page
	h.do(req{method: "GET", path: "/v1/rentals?limit=2", key: key}).json(t, &p1)
	h.do(req{method: "GET", path: "/v1/rentals?limit=2&cursor=" + p1.NextCursor, key: key}).json(t, &p2)
	if len(p1.Rentals) != 2 || p1.NextCursor == "" || len(p2.Rentals) != 1 || p2.NextCursor != "" || p2.Rentals[0].ID <= p1.Rentals[1].ID {
		t.Fatalf("pages %+v then %+v", p1, p2)
	}
	var spot, labelled page
	h.do(req{method: "GET", path: "/v1/rentals?plan=spot&state=requested", key: key}).json(t, &spot)
	h.do(req{method: "GET", path: "/v1/rentals?label=i%3D1", key: key}).json(t, &labelled)
	if len(spot.Rentals) != 2 || len(labelled.Rentals) != 1 || labelled.Rentals[0].Plan != "on-demand" {
		t.Fatalf("plan=spot: %+v; label i=1: %+v", spot.Rentals, labelled.Rentals)
	}
}

func TestStoppingAnEndedRentalRequestsNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1, testOptions())
	key := h.tenant("acme", identity.ReadWrite)
	id := h.create(key)
	h.publish(subject.RentalRejected, "acme", &shizuv1.RentalRejected{
		Meta:     shizuv1.NewMeta("rental:"+id+":rejected", "scheduler", "", id, time.Now()),
		RentalId: id, TenantId: "acme", Reason: shizuv1.RejectReason_REJECT_REASON_PENDING_TIMEOUT})
	testkit.Eventually(t, 5*time.Second, func() error {
		var r rentalDoc
		a := h.do(req{method: "GET", path: "/v1/rentals/" + id, key: key})
		if a.Status == http.StatusOK {
			a.json(t, &r)
		}
		if r.State != "rejected" {
			return fmt.Errorf("state %q", r.State)
		}
		return nil
	})
	a := h.do(req{method: "POST", path: "/v1/rentals/" + id + "/stop", key: key})
	if a.Status != http.StatusOK {
		t.Fatalf("stop of a rejected rental: %d %s", a.Status, a.Body)
	}
	if n := h.count("RENTALS", "rental.acme.cancel_requested"); n != 0 {
		t.Fatalf("%d cancel requests for an ended rental", n)
	}
}
