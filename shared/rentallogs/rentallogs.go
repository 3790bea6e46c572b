// Package rentallogs reads a rental's output from the LOGS stream: the last
// lines (Tail) and what follows (Follow). Both read only the rental's own
// subject, log.<tenant>.<rental>, so a reader never sees, or pays for,
// another rental's output; Tail uses direct gets (no consumer) and Follow
// an ordered consumer that it deletes before it returns.
package rentallogs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// MaxTail is the most lines one Tail returns.
const MaxTail = 100_000

// Line is one entry of a rental's output: a line the workload wrote, or a
// marker (Dropped lines the node agent held back, or the End of a run).
type Line struct {
	// Seq is the stream sequence of the batch the line came in; Follow
	// from Seq+1 continues after the batch.
	Seq     uint64
	Attempt int32
	NodeID  string
	// At is when the node agent read the line (zero for a marker).
	At        time.Time
	Text      string
	Truncated bool
	// Dropped, when > 0, marks that many lines the node agent dropped
	// here (its rate limit); Text is then empty.
	Dropped int64
	// End marks the end of run Attempt's output; Text is then empty.
	End bool
}

// String is the line as people read it: the text, or what the marker
// says.
func (l Line) String() string {
	switch {
	case l.Dropped == 1:
		return "[1 line dropped: the rental wrote faster than the log rate limit]"
	case l.Dropped > 0:
		return fmt.Sprintf("[%d lines dropped: the rental wrote faster than the log rate limit]", l.Dropped)
	case l.End:
		return fmt.Sprintf("[end of the output of run %d on node %s]", l.Attempt, l.NodeID)
	case l.Truncated:
		return l.Text + " [line cut]"
	}
	return l.Text
}

// Subject is the subject of a rental's output, checking both keys.
func Subject(tenant, rental string) (string, error) {
	s, err := subject.Format(subject.Log, tenant, rental)
	if err != nil {
		return "", fault.Invalid("rental logs of tenant %q, rental %q: %w", tenant, rental, err)
	}
	return s, nil
}

// Lines unpacks one batch into entries: a drop marker first (the drops
// came before the batch's lines), the lines, and the end marker last.
func Lines(seq uint64, b *shizuv1.RentalLogBatch) []Line {
	base := Line{Seq: seq, Attempt: b.GetAttempt(), NodeID: b.GetNodeId()}
	out := make([]Line, 0, len(b.GetLines())+2)
	if n := b.GetDroppedLines(); n > 0 {
		l := base
		l.Dropped = n
		out = append(out, l)
	}
	for _, ll := range b.GetLines() {
		l := base
		l.At, l.Text, l.Truncated = ll.GetReadAt().AsTime(), ll.GetText(), ll.GetTruncated()
		out = append(out, l)
	}
	if b.GetEndOfOutput() {
		l := base
		l.End = true
		out = append(out, l)
	}
	return out
}

// decode reads one stored batch and checks that it belongs where it is
// stored: a batch whose body names another tenant or rental than its
// subject is skipped, never shown.
func decode(data []byte, tenant, rental string) (*shizuv1.RentalLogBatch, bool) {
	var b shizuv1.RentalLogBatch
	if err := proto.Unmarshal(data, &b); err != nil {
		return nil, false
	}
	if b.GetTenantId() != tenant || b.GetRentalId() != rental {
		return nil, false
	}
	return &b, true
}

// Tail returns the last n entries (1..MaxTail) of the rental's output,
// oldest first, and the cursor to Follow from to get what comes after
// them with nothing missed. A rental without output yields no entries.
//
// It walks back from the rental's newest batch in windows of stream
// sequences that grow fourfold, reading each window forward with direct
// gets by subject, so its cost follows the lines asked for, not the
// stream's size, and it leaves no consumer behind.
func Tail(ctx context.Context, js jetstream.JetStream, tenant, rental string, n int) ([]Line, uint64, error) {
	subj, err := Subject(tenant, rental)
	if err != nil {
		return nil, 0, err
	}
	if n < 1 || n > MaxTail {
		return nil, 0, fault.Invalid("tail: %d lines asked, want 1..%d", n, MaxTail)
	}
	s, err := js.Stream(ctx, topology.StreamLogs)
	if err != nil {
		return nil, 0, fmt.Errorf("rental logs: %w", err)
	}
	st := s.CachedInfo().State
	last, err := s.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, st.LastSeq + 1, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("rental logs: %w", err)
	}
	var got []Line
	if b, ok := decode(last.Data, tenant, rental); ok {
		got = Lines(last.Sequence, b)
	}
	end, window := last.Sequence, uint64(256)
	for len(got) < n && end > st.FirstSeq {
		start := st.FirstSeq
		if end-st.FirstSeq > window {
			start = end - window
		}
		older, err := readRange(ctx, s, subj, tenant, rental, start, end)
		if err != nil {
			return nil, 0, err
		}
		got = append(older, got...)
		end, window = start, window*4
	}
	if len(got) > n {
		got = got[len(got)-n:]
	}
	return got, last.Sequence + 1, nil
}

// readRange returns the entries of the rental's batches with sequences in
// [from, to), oldest first.
func readRange(ctx context.Context, s jetstream.Stream, subj, tenant, rental string, from, to uint64) ([]Line, error) {
	var out []Line
	for seq := from; seq < to; {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("rental logs: %w", err)
		}
		if m.Sequence >= to {
			return out, nil
		}
		if b, ok := decode(m.Data, tenant, rental); ok {
			out = append(out, Lines(m.Sequence, b)...)
		}
		seq = m.Sequence + 1
	}
	return out, nil
}

// ErrStop, returned by a Follow callback, ends Follow without an error.
var ErrStop = errors.New("stop following")

// Follow calls fn with every entry of the rental's output stored from
// stream sequence from on (0: only what is stored from now on), in order,
// until ctx ends (it returns nil), fn returns ErrStop (nil) or another
// error (that error), or the stream fails. Its consumer is deleted before
// it returns.
func Follow(ctx context.Context, js jetstream.JetStream, tenant, rental string, from uint64, fn func(Line) error) error {
	subj, err := Subject(tenant, rental)
	if err != nil {
		return err
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{subj}, DeliverPolicy: jetstream.DeliverNewPolicy,
		// A follower that vanishes (killed) leaves its consumer for this
		// long at most.
		InactiveThreshold: 30 * time.Second}
	if from > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	}
	cons, err := js.OrderedConsumer(ctx, topology.StreamLogs, cfg)
	if err != nil {
		return fmt.Errorf("follow rental logs: %w", err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("follow rental logs: %w", err)
	}
	defer removeConsumer(ctx, js, cons, it)
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return fmt.Errorf("follow rental logs: %w", err)
		}
		md, err := m.Metadata()
		if err != nil {
			continue
		}
		b, ok := decode(m.Data(), tenant, rental)
		if !ok {
			continue
		}
		for _, l := range Lines(md.Sequence.Stream, b) {
			if err := fn(l); errors.Is(err, ErrStop) {
				return nil
			} else if err != nil {
				return err
			}
		}
	}
}

// removeConsumer stops the iterator and deletes the ordered consumer's
// current server-side consumer, so a reader leaves nothing behind (the
// client library would leave it for its inactivity threshold).
func removeConsumer(ctx context.Context, js jetstream.JetStream, cons jetstream.Consumer, it jetstream.MessagesContext) {
	it.Stop()
	info := cons.CachedInfo()
	if info == nil {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = js.DeleteConsumer(dctx, topology.StreamLogs, info.Name)
}
