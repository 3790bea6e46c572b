package shizuv1

import (
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/timestamppb"
)

// NewMeta is the EventMeta of an event with id, emitted by source at at
// (UTC), caused by the event causationID (empty for an outside request)
// and grouped under correlationID (usually the rental id).
func NewMeta(id, source, causationID, correlationID string, at time.Time) *EventMeta {
	return &EventMeta{EventId: id, OccurredAt: timestamppb.New(at), Source: source,
		CausationId: causationID, CorrelationId: correlationID}
}

// Truncate cuts s to at most maxBytes bytes without splitting a UTF-8
// sequence, and replaces invalid UTF-8 with U+FFFD first, so the result
// always encodes as a protobuf string field (proto.Marshal refuses
// invalid UTF-8). A workload's last log line, an engine's error message
// and a validation detail all pass through it before they go into an
// event.
func Truncate(s string, maxBytes int) string {
	if maxBytes <= 0 {
		return ""
	}
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if len(s) <= maxBytes {
		return s
	}
	cut := maxBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// ClampStop moves a stopped_at before started_at to started_at and reports
// whether it did. An agent whose wall clock stepped back during a short run
// stamps exactly such a stop, and the run did end: a consumer that must act
// on the end (free the capacity, forget the rental) clamps before it
// validates, and flags the stop, instead of dead-lettering it. Metering has
// its own rule for what to bill (ledger.TrustedStop).
func ClampStop(ev *RentalStopped) bool {
	start, stop := ev.GetStartedAt(), ev.GetStoppedAt()
	if start == nil || stop == nil || start.CheckValid() != nil || stop.CheckValid() != nil ||
		!stop.AsTime().Before(start.AsTime()) {
		return false
	}
	ev.StoppedAt = timestamppb.New(start.AsTime())
	return true
}
