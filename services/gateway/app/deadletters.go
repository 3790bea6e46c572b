package app

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/topology"
)

func deadLetterRoutes(g *Gateway) []route {
	return []route{
		{method: http.MethodGet, path: "/v1/dead-letters", access: operatorOnly, handle: g.listDeadLetters},
		{method: http.MethodGet, path: "/v1/dead-letters/{seq}", access: operatorOnly, handle: g.getDeadLetter},
	}
}

// deadLetterBody is the API's DeadLetter: one message of the DEADLETTER
// stream with the reason headers bus.Consume adds (docs/bus.md).
type deadLetterBody struct {
	Seq             uint64    `json:"seq"`
	Subject         string    `json:"subject"`
	StoredAt        time.Time `json:"stored_at"`
	Reason          string    `json:"reason"`
	Stream          string    `json:"stream,omitempty"`
	Consumer        string    `json:"consumer,omitempty"`
	OriginalSubject string    `json:"original_subject,omitempty"`
	OriginalSeq     uint64    `json:"original_seq,omitempty"`
	Deliveries      uint64    `json:"deliveries,omitempty"`
	Event           string    `json:"event,omitempty"`
	SizeBytes       int       `json:"size_bytes"`
	Payload         string    `json:"payload_base64,omitempty"`
}

func toDeadLetter(m *jetstream.RawStreamMsg, payload bool) deadLetterBody {
	h := m.Header
	num := func(k string) uint64 { n, _ := strconv.ParseUint(h.Get(k), 10, 64); return n }
	d := deadLetterBody{Seq: m.Sequence, Subject: m.Subject, StoredAt: m.Time.UTC(), Reason: h.Get(bus.HeaderDLQReason),
		Stream: h.Get(bus.HeaderDLQStream), Consumer: h.Get(bus.HeaderDLQConsumer), OriginalSubject: h.Get(bus.HeaderDLQSubject),
		OriginalSeq: num(bus.HeaderDLQStreamSeq), Deliveries: num(bus.HeaderDLQDeliveries), Event: h.Get(bus.HeaderEvent), SizeBytes: len(m.Data)}
	if payload && len(m.Data) > 0 {
		d.Payload = base64.StdEncoding.EncodeToString(m.Data)
	}
	return d
}

type deadLetterList struct {
	DeadLetters []deadLetterBody `json:"dead_letters"`
	NextCursor  string           `json:"next_cursor,omitempty"`
}

// listDeadLetters answers a page of dead letters, oldest first, read by
// sequence with direct gets (no consumer); the cursor is the sequence to
// go on from.
func (g *Gateway) listDeadLetters(w http.ResponseWriter, r *http.Request, c *call) {
	q := r.URL.Query()
	limit := 100
	if s := q.Get("limit"); s != "" {
		limit, _ = strconv.Atoi(s) // the document checked it: 1..1000
	}
	from := uint64(1)
	if s := q.Get("cursor"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil || n == 0 {
			writeProblem(w, r, http.StatusBadRequest, probInvalid, "the cursor is not one this API returned",
				fieldError{Field: "query cursor", Reason: "not a next_cursor of this list"})
			return
		}
		from = n
	}
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	out := deadLetterList{DeadLetters: []deadLetterBody{}}
	s, err := g.bus.JetStream().Stream(ctx, topology.StreamDeadLetter)
	for seq := from; err == nil && len(out.DeadLetters) < limit; {
		var m *jetstream.RawStreamMsg
		m, err = s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(">"))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			err = nil
			break
		}
		if err == nil {
			out.DeadLetters = append(out.DeadLetters, toDeadLetter(m, false))
			seq = m.Sequence + 1
			if len(out.DeadLetters) == limit {
				out.NextCursor = strconv.FormatUint(seq, 10)
			}
		}
	}
	if err != nil {
		c.log.Error("read dead letters", "err", err)
		writeProblem(w, r, http.StatusInternalServerError, probInternal, "the dead letters could not be read; retry later")
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// getDeadLetter answers one dead letter with its payload.
func (g *Gateway) getDeadLetter(w http.ResponseWriter, r *http.Request, c *call) {
	seq, _ := strconv.ParseUint(c.params["seq"], 10, 64) // the document checked it: >= 1
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	s, err := g.bus.JetStream().Stream(ctx, topology.StreamDeadLetter)
	var m *jetstream.RawStreamMsg
	if err == nil {
		m, err = s.GetMsg(ctx, seq)
	}
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		writeProblem(w, r, http.StatusNotFound, probNotFound, "no dead letter "+c.params["seq"]+" (list them with GET /v1/dead-letters)")
	case err != nil:
		c.log.Error("read dead letter", "err", err)
		writeProblem(w, r, http.StatusInternalServerError, probInternal, "the dead letter could not be read; retry later")
	default:
		writeJSON(w, http.StatusOK, toDeadLetter(m, true))
	}
}
