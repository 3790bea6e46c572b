package bus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// HeaderDLQOriginal prefixes, on a dead letter, each original header the
// server would act on when the copy is published (every Nats-* header:
// Nats-Expected-Stream, Nats-Expected-Last-*, Nats-Msg-Id, Nats-TTL,
// Nats-Rollup, Nats-Incr, Nats-Schedule*, Nats-Batch-*, ...). Kept that way
// they stay readable and do nothing: a copy that kept them would be
// refused (an expectation the DEADLETTER stream does not meet) or act on
// the dead letters (a rollup purging them).
const HeaderDLQOriginal = "Shizu-Dlq-Original-"

// serverHeader reports whether the server may interpret header k on
// publish: the whole Nats- namespace, in any case, so a directive added by
// a later server is covered too.
func serverHeader(k string) bool {
	return len(k) >= 5 && strings.EqualFold(k[:5], "Nats-")
}

// deadLetterMsg builds the copy of an unusable message for
// dlq.<stream>.<durable>: its payload and headers, the server's directives
// renamed (HeaderDLQOriginal), and the Shizu-Dlq-* headers. Its id is
// derived from the stream position, so the handler's dead letter and the
// exhausted-delivery forwarder's of the same message are stored once.
func deadLetterMsg(stream, durable, subj string, seq, deliveries uint64, orig nats.Header, data []byte, reason string) (*nats.Msg, error) {
	dlqSubject, err := subject.Format(subject.DeadLetter, stream, durable)
	if err != nil {
		return nil, fmt.Errorf("dead-letter subject: %w", err)
	}
	cp := nats.NewMsg(dlqSubject)
	cp.Data = data
	for k, vs := range orig {
		if serverHeader(k) {
			k = HeaderDLQOriginal + k
		}
		cp.Header[k] = append(cp.Header[k], vs...)
	}
	cp.Header.Set(HeaderMsgID, fmt.Sprintf("dlq:%s:%s:%d", stream, durable, seq))
	cp.Header.Set(HeaderDLQReason, reason)
	if subj != "" {
		cp.Header.Set(HeaderDLQSubject, subj)
	}
	cp.Header.Set(HeaderDLQStream, stream)
	cp.Header.Set(HeaderDLQStreamSeq, strconv.FormatUint(seq, 10))
	cp.Header.Set(HeaderDLQConsumer, durable)
	cp.Header.Set(HeaderDLQDeliveries, strconv.FormatUint(deliveries, 10))
	return cp, nil
}

// storeDeadLetter publishes cp. When the stream refuses it as it is (too
// large for the dead letters, say), a bare copy is stored instead: the
// Shizu-Dlq-* headers and the event name, no payload, the reason saying
// why; the original stays in its own stream at the position named.
func (c *Conn) storeDeadLetter(ctx context.Context, cp *nats.Msg) error {
	_, err := c.PublishMsg(ctx, cp)
	var apiErr *jetstream.APIError
	if err == nil || !errors.As(err, &apiErr) && !errors.Is(err, nats.ErrMaxPayload) {
		return err
	}
	bare := nats.NewMsg(cp.Subject)
	for _, k := range []string{HeaderMsgID, HeaderDLQSubject, HeaderDLQStream, HeaderDLQStreamSeq, HeaderDLQConsumer, HeaderDLQDeliveries} {
		if v := cp.Header.Get(k); v != "" {
			bare.Header.Set(k, v)
		}
	}
	if ev := cp.Header.Get(HeaderEvent); ev != "" {
		bare.Header.Set(HeaderEvent, shizuv1.Truncate(ev, 128))
	}
	bare.Header.Set(HeaderDLQReason, fmt.Sprintf("%s; the copy with its payload (%d bytes) and headers was refused (%v), so only this record is kept",
		shizuv1.Truncate(cp.Header.Get(HeaderDLQReason), 1024), len(cp.Data), apiErrOr(err)))
	if _, berr := c.PublishMsg(ctx, bare); berr != nil {
		return fmt.Errorf("%w; without its payload: %w", err, berr)
	}
	c.log.WarnContext(ctx, "dead letter stored without its payload: the full copy was refused",
		"subject", cp.Subject, "stream_seq", cp.Header.Get(HeaderDLQStreamSeq), "err", err)
	return nil
}

// apiErrOr names the stream's refusal briefly.
func apiErrOr(err error) string {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.Description
	}
	return err.Error()
}

// deadLetter copies the message to dlq.<stream>.<consumer> with the reason,
// then terminates it. When no copy can be stored the message is redelivered
// to try again, and on its last allowed delivery terminated without a copy
// (logged as an error and counted): the consumer moves on and the message
// stays in its stream, where the log says it is.
func (w *worker) deadLetter(ctx context.Context, m jetstream.Msg, d Delivery, reason string) {
	md, _ := m.Metadata()
	stream := w.spec.Stream
	if md != nil {
		stream = md.Stream
	}
	cp, err := deadLetterMsg(stream, w.spec.Durable, d.Subject, d.StreamSeq, d.Delivered, d.Header, d.Data, reason)
	if err == nil {
		if claim := cp.Header.Values(HeaderEvent); d.Event == unusableEvent && len(claim) > 0 {
			// A type the subject contradicts stays readable, but is not
			// the copy's event (nor an unbounded metric label).
			cp.Header[HeaderDLQOriginal+HeaderEvent] = claim
			cp.Header.Del(HeaderEvent)
		}
		err = w.c.storeDeadLetter(ctx, cp)
	}
	if err == nil {
		w.c.log.WarnContext(ctx, "message dead-lettered", "consumer", w.spec.Durable, "event", d.Event,
			"msg_id", d.MsgID, "subject", d.Subject, "reason", reason)
		w.count(ctx, outcomeDeadLetter, d.Event)
		w.term(ctx, m, reason)
		return
	}
	w.count(ctx, outcomeDeadLetterFailed, d.Event)
	if int(d.Delivered) < w.spec.MaxDeliver {
		w.c.log.ErrorContext(ctx, "dead-letter copy failed; redelivering to try again", "consumer", w.spec.Durable,
			"msg_id", d.MsgID, "stream", stream, "stream_seq", d.StreamSeq, "delivered", d.Delivered, "reason", reason, "err", err)
		_ = m.NakWithDelay(w.opts.RetryDelay(d.Delivered))
		return
	}
	w.c.log.ErrorContext(ctx, "dead-letter copy failed on the last delivery; terminated without a copy, the message stays in its stream",
		"consumer", w.spec.Durable, "msg_id", d.MsgID, "stream", stream, "stream_seq", d.StreamSeq, "subject", d.Subject,
		"reason", reason, "err", err)
	w.count(ctx, outcomeTerminated, d.Event)
	w.term(ctx, m, "no dead-letter copy could be stored: "+reason)
}

func (w *worker) term(ctx context.Context, m jetstream.Msg, reason string) {
	if err := m.TermWithReason(shizuv1.Truncate(reason, 256)); err != nil {
		w.c.log.ErrorContext(ctx, "term failed", "consumer", w.spec.Durable, "err", err)
	}
}
