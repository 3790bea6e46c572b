package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// A request that cannot be decoded or whose envelope is unusable cannot be
// decided on, and is dead-lettered with the reason. Its requester still
// hears why whenever its rental id can be read from the body (a JSON body,
// or a protobuf one with a bad field elsewhere): a RentalRejected
// (REJECT_REASON_INVALID_SPEC) goes to the tenant the subject names, the
// only tenant the publisher was allowed to speak for. No outcome is
// recorded (the rental id may be another tenant's).

// rentalIDField is RentalRequested.rental_id's field number.
var rentalIDField = (&shizuv1.RentalRequested{}).ProtoReflect().Descriptor().Fields().ByName("rental_id").Number()

// unusable answers a request the scheduler cannot use: a rejection to the
// subject's tenant when rental (as read from the body) is usable, and in
// every case cause, which dead-letters the delivery. The rejection failing
// to publish redelivers the request instead.
func (s *Scheduler) unusable(ctx context.Context, d bus.Delivery, rental string, cause error) error {
	msg := "the request could not be used: " + cause.Error()
	if looksLikeJSON(d.Data) {
		msg = "the request is JSON, but the bus takes rental requests only as binary protobuf (shizu.v1.RentalRequested); " +
			"send JSON to the gateway's REST API instead"
	}
	answered, err := s.answerUnusable(ctx, d, rental, shizuv1.RejectReason_REJECT_REASON_INVALID_SPEC, msg)
	if err != nil {
		return err
	}
	if answered {
		s.d.Log.WarnContext(ctx, "unusable request rejected and dead-lettered", "rental", rental, "err", cause)
	}
	return cause
}

// answerUnusable publishes the rejection of an unusable delivery d about
// rental to its subject's tenant, recording no outcome; false when the
// subject names no usable tenant or rental is unusable (nobody to tell).
func (s *Scheduler) answerUnusable(ctx context.Context, d bus.Delivery, rental string, reason shizuv1.RejectReason, msg string) (bool, error) {
	tenant, ok := subject.TenantOf(d.Subject)
	if !ok || shizuv1.ValidToken(tenant) != nil || shizuv1.ValidToken(rental) != nil {
		return false, nil
	}
	id := fmt.Sprintf("rental:%s:unusable:%s:%d", rental, tenant, d.StreamSeq)
	return true, s.refuse(ctx, id, tenant, rental, "", reason, msg)
}

// onForged is told of the deliveries the bus dead-letters before any
// handler (bus.BatchOptions.Unusable). A request or cancel whose body
// names another tenant than its subject is also answered, to the tenant
// the subject names (the one its publisher was allowed to speak for), with
// REJECT_REASON_NOT_PERMITTED; the victim's rentals are untouched. The
// answer is best effort: the dead letter keeps the event either way.
func (s *Scheduler) onForged(ctx context.Context, d bus.Delivery, reason error) {
	var ev interface {
		proto.Message
		GetRentalId() string
		GetTenantId() string
	}
	switch d.Event {
	case bus.EventName(&shizuv1.RentalRequested{}):
		ev = &shizuv1.RentalRequested{}
	case bus.EventName(&shizuv1.RentalCancelRequested{}):
		ev = &shizuv1.RentalCancelRequested{}
	default:
		return
	}
	if bus.TenantMismatch(d.Subject, d.Event, d.Data) == nil || proto.Unmarshal(d.Data, ev) != nil {
		return
	}
	tenant, _ := subject.TenantOf(d.Subject)
	msg := fmt.Sprintf("refused: it names tenant %s, but was sent as tenant %s; a tenant may only rent or cancel for itself",
		shizuv1.Truncate(ev.GetTenantId(), 128), tenant)
	if _, err := s.answerUnusable(ctx, d, ev.GetRentalId(), shizuv1.RejectReason_REJECT_REASON_NOT_PERMITTED, msg); err != nil {
		s.d.Log.WarnContext(ctx, "could not answer a forged request; it is dead-lettered", "subject", d.Subject, "err", err, "reason", reason)
	}
}

func looksLikeJSON(data []byte) bool {
	data = bytes.TrimSpace(data)
	return len(data) > 0 && data[0] == '{'
}

// rentalIDOf reads the rental id of a body that does not decode as a
// RentalRequested: a JSON object's rental_id (or rentalId), else the
// rental_id field of the protobuf wire data up to where it stops parsing.
// "" when none can be read.
func rentalIDOf(data []byte) string {
	if looksLikeJSON(data) {
		var body map[string]any
		if json.Unmarshal(data, &body) != nil {
			return ""
		}
		for _, k := range []string{"rental_id", "rentalId"} {
			if v, ok := body[k].(string); ok {
				return v
			}
		}
		return ""
	}
	var got string
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
			break
		}
		data = data[n:]
		if num == rentalIDField && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(data)
			if n < 0 {
				break
			}
			got, data = string(v), data[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, data)
		if n < 0 {
			break
		}
		data = data[n:]
	}
	return got
}
