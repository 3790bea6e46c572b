package app

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shizu-gpu/shizu/shared/subject"
)

// AuditRecord is one state-changing call, as the AUDIT stream keeps it
// (JSON on audit.<tenant>.<action>).
type AuditRecord struct {
	At        time.Time `json:"at"`
	RequestID string    `json:"request_id"`
	KeyID     string    `json:"key_id"`
	Tenant    string    `json:"tenant_id"`
	Action    string    `json:"action"`
	Method    string    `json:"method"`
	Route     string    `json:"route"`
	Path      string    `json:"path"`
	RentalID  string    `json:"rental_id,omitempty"`
	Status    int       `json:"status"`
	Remote    string    `json:"remote_addr"`
	Forwarded string    `json:"forwarded_for,omitempty"`
	UserAgent string    `json:"user_agent,omitempty"`
}

// audit appends the record of a state-changing call once it has been
// answered. A failure to record is logged: the answer has gone already
// (it is flushed first, so the caller does not wait for the record).
func (g *Gateway) audit(r *http.Request, rt route, c *call, sw *statusWriter) {
	if sw.status != 0 {
		sw.Flush()
	}
	rec := AuditRecord{At: g.now().UTC(), RequestID: requestID(r.Context()), KeyID: c.key.ID, Tenant: c.tenant,
		Action: rt.action, Method: r.Method, Route: rt.path, Path: r.URL.Path, RentalID: c.rentalID,
		Status: sw.status, Remote: r.RemoteAddr, Forwarded: r.Header.Get("X-Forwarded-For"), UserAgent: r.UserAgent()}
	if rec.RentalID == "" {
		rec.RentalID = c.params["rental_id"]
	}
	subj, err := subject.Format(subject.AuditRecorded, c.tenant, rt.action)
	if err != nil {
		c.log.Error("audit: subject", "err", err)
		return
	}
	b, err := json.Marshal(rec)
	if err != nil {
		c.log.Error("audit: encode", "err", err)
		return
	}
	msg := nats.NewMsg(subj)
	msg.Data = b
	msg.Header.Set(jetstream.MsgIDHeader, "audit:"+newRequestID())
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), requestTimeout)
	defer cancel()
	if _, err := g.bus.JetStream().PublishMsg(ctx, msg); err != nil {
		g.metrics.auditLost.Add(ctx, 1)
		c.log.Error("audit: the record was not stored", "err", err, "action", rt.action, "status", sw.status)
	}
}
