package app_test

import (
	"encoding/base64"
	"net/http"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/shizu-gpu/shizu/services/gateway/identity"
	"github.com/shizu-gpu/shizu/shared/bus"
)

type deadLetterDoc struct {
	Seq             uint64 `json:"seq"`
	Reason          string `json:"reason"`
	Consumer        string `json:"consumer"`
	OriginalSubject string `json:"original_subject"`
	OriginalSeq     uint64 `json:"original_seq"`
	Payload         string `json:"payload_base64"`
}

// deadLetter stores one dead letter as bus.Consume would.
func (h *harness) deadLetter(n int, reason string) {
	h.t.Helper()
	m := nats.NewMsg("dlq.RENTALS.scheduler")
	m.Data = []byte("payload " + strconv.Itoa(n))
	m.Header.Set(bus.HeaderDLQReason, reason)
	m.Header.Set(bus.HeaderDLQSubject, "rental.acme.requested")
	m.Header.Set(bus.HeaderDLQStream, "RENTALS")
	m.Header.Set(bus.HeaderDLQStreamSeq, strconv.Itoa(40+n))
	m.Header.Set(bus.HeaderDLQConsumer, "scheduler")
	m.Header.Set(bus.HeaderDLQDeliveries, "1")
	if _, err := h.admin.JetStream().PublishMsg(h.t.Context(), m); err != nil {
		h.t.Fatal(err)
	}
}

func TestOperatorsListAndReadDeadLettersAndTenantsCannot(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1, testOptions())
	op := h.key("", identity.Operator)
	tenant := h.tenant("acme", identity.ReadWrite)
	for i := range 3 {
		h.deadLetter(i, "no handler for event X on subject S in this consumer")
	}
	var page struct {
		DeadLetters []deadLetterDoc `json:"dead_letters"`
		NextCursor  string          `json:"next_cursor"`
	}
	var seen []deadLetterDoc
	for cursor := ""; ; {
		path := "/v1/dead-letters?limit=2"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		a := h.do(req{method: "GET", path: path, key: op})
		if a.Status != http.StatusOK {
			t.Fatalf("list: %d %s", a.Status, a.Body)
		}
		page.NextCursor = ""
		a.json(t, &page)
		seen = append(seen, page.DeadLetters...)
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	if len(seen) != 3 || seen[0].Consumer != "scheduler" || seen[0].OriginalSubject != "rental.acme.requested" || seen[2].OriginalSeq != 42 || seen[0].Payload != "" {
		t.Fatalf("pages: %+v", seen)
	}
	a := h.do(req{method: "GET", path: "/v1/dead-letters/" + strconv.FormatUint(seen[1].Seq, 10), key: op})
	var one deadLetterDoc
	a.json(t, &one)
	if p, _ := base64.StdEncoding.DecodeString(one.Payload); a.Status != http.StatusOK || string(p) != "payload 1" || one.Reason == "" {
		t.Fatalf("one: %d %+v", a.Status, one)
	}
	if a := h.do(req{method: "GET", path: "/v1/dead-letters/999", key: op}); a.Status != http.StatusNotFound {
		t.Fatalf("an unknown seq: %d", a.Status)
	}
	for _, path := range []string{"/v1/dead-letters", "/v1/dead-letters/1"} {
		if a := h.do(req{method: "GET", path: path, key: tenant}); a.Status != http.StatusForbidden {
			t.Fatalf("a tenant key on %s: %d, want 403", path, a.Status)
		}
	}
	if a := h.do(req{method: "GET", path: "/v1/dead-letters?cursor=x", key: op}); a.Status != http.StatusBadRequest {
		t.Fatalf("a bad cursor: %d", a.Status)
	}
}
