package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// AdvisoryStream is the stream that must capture
// subject.MaxDeliveriesAdvisoryAll for exhausted deliveries to be
// dead-lettered (topology declares it).
const AdvisoryStream = "ADVISORIES"

// ExhaustedDurable names the consumer that forwards the exhausted
// deliveries of durable to the dead letters.
func ExhaustedDurable(durable string) string { return durable + "-exhausted" }

// maxDeliveriesAdvisory is the server's io.nats.jetstream.advisory.v1.max_deliver.
type maxDeliveriesAdvisory struct {
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
}

// forwardExhausted starts a consumer of the server's max-deliveries
// advisories for spec's durable. A handler that fails on the last delivery
// dead-letters the message itself; this catches the rest: deliveries whose
// ack wait ran out every time (a hung handler, a process that died), which
// the server drops with only an advisory. The copy has the same message id
// as a handler's dead letter, so the two paths never store it twice.
func (c *Conn) forwardExhausted(ctx context.Context, spec Consumer) (*Subscription, error) {
	filter, err := subject.Format(subject.MaxDeliveriesAdvisory, spec.Stream, spec.Durable)
	if err != nil {
		return nil, err
	}
	r := NewRouter()
	const event = "io.nats.jetstream.advisory.v1.max_deliver"
	r.EventForSubject(filter, event)
	r.Handle(event, func(ctx context.Context, d Delivery) error {
		var adv maxDeliveriesAdvisory
		if err := json.Unmarshal(d.Data, &adv); err != nil {
			return fault.Invalid("decode max-deliveries advisory: %w", err)
		}
		return c.deadLetterExhausted(ctx, spec, adv)
	})
	fwd := Consumer{Stream: AdvisoryStream, Durable: ExhaustedDurable(spec.Durable), FilterSubjects: []string{filter}, MaxDeliver: 10}
	return c.consume(ctx, fwd, r, ConsumeOptions{}, false)
}

func (c *Conn) deadLetterExhausted(ctx context.Context, spec Consumer, adv maxDeliveriesAdvisory) error {
	reason := fmt.Sprintf("max deliveries (%d) reached without an answer from a handler (ack wait %s expired each time)",
		adv.Deliveries, spec.withDefaults().AckWait)
	st, err := c.js.Stream(ctx, adv.Stream)
	if err != nil {
		return err
	}
	var hdr nats.Header
	var data []byte
	var subj string
	orig, err := st.GetMsg(ctx, adv.StreamSeq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		reason += "; the message itself is no longer in the stream"
	case err != nil:
		return err
	default:
		hdr, data, subj = orig.Header, orig.Data, orig.Subject
	}
	cp, err := deadLetterMsg(adv.Stream, spec.Durable, subj, adv.StreamSeq, adv.Deliveries, hdr, data, reason)
	if err != nil {
		return fault.Invalid("%w", err)
	}
	if err := c.storeDeadLetter(ctx, cp); err != nil {
		return err
	}
	c.log.WarnContext(ctx, "message dead-lettered after exhausting its deliveries", "consumer", spec.Durable,
		"stream", adv.Stream, "stream_seq", adv.StreamSeq, "deliveries", adv.Deliveries)
	return nil
}
