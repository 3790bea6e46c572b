package app_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/gateway/identity"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

type logLineDoc struct {
	Seq     uint64 `json:"seq"`
	Attempt int32  `json:"attempt"`
	Text    string `json:"text"`
	Dropped int64  `json:"dropped"`
	End     bool   `json:"end"`
}

type logPageDoc struct {
	Lines []logLineDoc `json:"lines"`
	Next  uint64       `json:"next_seq"`
}

// shipLogs publishes one batch of a rental's output on log.<tenant>.<id>
// as a node agent would; the body names tenant too.
func (h *harness) shipLogs(tenant, id string, offset int64, end bool, lines ...string) {
	h.t.Helper()
	b := &shizuv1.RentalLogBatch{Meta: shizuv1.NewMeta(fmt.Sprintf("log:%s:1:%d", id, offset), "node-agent/n1", "", id, time.Now()),
		RentalId: id, TenantId: tenant, NodeId: "n1", Attempt: 1, Offset: offset, EndOfOutput: end}
	for _, l := range lines {
		b.Lines = append(b.Lines, &shizuv1.LogLine{ReadAt: timestamppb.Now(), Text: l})
	}
	if err := b.Validate(); err != nil {
		h.t.Fatal(err)
	}
	if _, err := h.admin.Publish(h.t.Context(), "log."+tenant+"."+id, b); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) logConsumers() int {
	h.t.Helper()
	s, err := h.admin.JetStream().Stream(h.t.Context(), topology.StreamLogs)
	if err != nil {
		h.t.Fatal(err)
	}
	info, err := s.Info(h.t.Context())
	if err != nil {
		h.t.Fatal(err)
	}
	return info.State.Consumers
}

func texts(ls []logLineDoc) string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.Text
	}
	return strings.Join(out, "|")
}

func TestLogsTailTheTenantsRentalOnlyAndAnotherTenantGets404(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1, testOptions())
	a := h.tenant("acme", identity.ReadOnly)
	aw := h.key("acme", identity.ReadWrite)
	b := h.tenant("bravo", identity.ReadWrite)
	id := h.create(aw)
	h.projected(aw, id)
	h.shipLogs("acme", id, 0, false, "one", "two")
	// The same rental id under another tenant's subject is not acme's output.
	h.shipLogs("bravo", id, 0, false, "bravo's line")
	h.shipLogs("acme", id, 8, false, "three")

	var page logPageDoc
	got := h.do(req{method: "GET", path: "/v1/rentals/" + id + "/logs?tail=2", key: a})
	if got.Status != http.StatusOK {
		t.Fatalf("logs: %d %s", got.Status, got.Body)
	}
	got.json(t, &page)
	if texts(page.Lines) != "two|three" || page.Next <= page.Lines[1].Seq {
		t.Fatalf("tail=2: %+v, want two|three and next_seq after the last", page)
	}
	all := h.do(req{method: "GET", path: "/v1/rentals/" + id + "/logs", key: a})
	all.json(t, &page)
	if texts(page.Lines) != "one|two|three" {
		t.Fatalf("default tail: %+v", page)
	}
	for _, path := range []string{"/v1/rentals/" + id + "/logs", "/v1/rentals/" + id + "/logs?follow=true", "/v1/rentals/r-nope/logs"} {
		if got := h.do(req{method: "GET", path: path, key: b}); got.Status != http.StatusNotFound {
			t.Fatalf("bravo's key on %s: %d %s, want 404", path, got.Status, got.Body)
		}
	}
	op := h.key("", identity.Operator)
	if got := h.do(req{method: "GET", path: "/v1/rentals/" + id + "/logs", key: op}); got.Status != http.StatusForbidden {
		t.Fatalf("an operator key: %d, want 403", got.Status)
	}
	bad := h.do(req{method: "GET", path: "/v1/rentals/" + id + "/logs?tail=0", key: a})
	if bad.Status != http.StatusBadRequest || !bad.problem(t).names("query tail") {
		t.Fatalf("tail=0: %d %s, want 400 naming query tail", bad.Status, bad.Body)
	}
}

func TestLogsFollowStreamsTheTailThenNewLinesAndEndsWithTheRentalLeavingNoConsumer(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1, testOptions())
	key := h.tenant("acme", identity.ReadWrite)
	id := h.create(key)
	h.projected(key, id)
	h.shipLogs("acme", id, 0, false, "before")
	hr, err := http.NewRequestWithContext(t.Context(), "GET", h.urls[0]+"/v1/rentals/"+id+"/logs?follow=true&tail=10", nil)
	if err != nil {
		t.Fatal(err)
	}
	hr.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("follow: %d %s", resp.StatusCode, b)
	}
	var raw strings.Builder
	r := bufio.NewReader(io.TeeReader(resp.Body, &raw))
	next := func() (logLineDoc, error) {
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return logLineDoc{}, err
			}
			if data, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), "data: "); ok {
				var v any
				if err := json.Unmarshal([]byte(data), &v); err != nil {
					t.Fatal(err)
				}
				if err := h.doc.Components.Schemas["LogLine"].Value.VisitJSON(v); err != nil {
					t.Fatalf("a log event does not match LogLine: %v\n%s", err, data)
				}
				var l logLineDoc
				answer{Body: []byte(data)}.json(t, &l)
				return l, nil
			}
		}
	}
	if l, err := next(); err != nil || l.Text != "before" {
		t.Fatalf("first event: %+v %v, want the tail", l, err)
	}
	h.shipLogs("acme", id, 7, false, "after")
	if l, err := next(); err != nil || l.Text != "after" {
		t.Fatalf("second event: %+v %v, want the new line", l, err)
	}
	h.publish(subject.RentalRejected, "acme", &shizuv1.RentalRejected{Meta: shizuv1.NewMeta("rental:"+id+":rejected", "scheduler", "", id, time.Now()),
		RentalId: id, TenantId: "acme", Reason: shizuv1.RejectReason_REJECT_REASON_UNSATISFIABLE, Message: "no node"})
	testkit.Eventually(t, 5*time.Second, func() error {
		var d rentalDoc
		h.do(req{method: "GET", path: "/v1/rentals/" + id, key: key}).json(t, &d)
		if d.State != "rejected" {
			return errors.New("not ended yet: " + d.State)
		}
		return nil
	})
	h.shipLogs("acme", id, 13, true)
	for {
		l, err := next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !l.End {
			t.Fatalf("after the end: %+v", l)
		}
	}
	if err := h.validate("GET", "/v1/rentals/"+id+"/logs", answer{Status: resp.StatusCode, Header: resp.Header, Body: []byte(raw.String())}); err != nil {
		t.Fatalf("the event stream does not match the document: %v", err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		if n := h.logConsumers(); n != 0 {
			return fmt.Errorf("%d consumers left on LOGS", n)
		}
		return nil
	})
}
