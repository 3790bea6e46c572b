package bus

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shizu-gpu/shizu/shared/subject"
)

// A scan reads scanWindow messages at a time, scanReaders requests in
// flight: one message per request (STREAM.MSG.GET, which a service user
// may be granted where it may not create consumers on the stream) would
// otherwise cost a round trip each.
const (
	scanWindow  = 1024
	scanReaders = 64
)

// ScanStream calls fn, in stream order, on every message of the stream
// name whose subject matches filter, up to the last one stored when the
// scan began, and returns that last sequence. A rebuild after a Redis
// loss reads its streams this way. An error from fn ends the scan with it.
// A message whose body names another tenant than its subject
// (TenantMismatch) is left out: every consumer dead-letters it, so no
// state rebuilt from history may hold it.
func ScanStream(ctx context.Context, js jetstream.JetStream, name, filter string, fn func(*jetstream.RawStreamMsg) error) (uint64, error) {
	stream, err := js.Stream(ctx, name)
	if err != nil {
		return 0, fmt.Errorf("scan stream %s: %w", name, err)
	}
	state := stream.CachedInfo().State
	if state.Msgs == 0 {
		return state.LastSeq, nil
	}
	for from := max(state.FirstSeq, 1); from <= state.LastSeq; from += scanWindow {
		msgs, err := readWindow(ctx, stream, from, min(state.LastSeq, from+scanWindow-1))
		if err != nil {
			return 0, fmt.Errorf("scan stream %s: %w", name, err)
		}
		for _, m := range msgs {
			if !subject.Matches(filter, m.Subject) || forged(m) {
				continue
			}
			if err := fn(m); err != nil {
				return 0, err
			}
		}
	}
	return state.LastSeq, nil
}

// readWindow reads the messages from..to of stream, in order, leaving out
// the sequences that hold none (deleted, expired).
func readWindow(ctx context.Context, stream jetstream.Stream, from, to uint64) ([]*jetstream.RawStreamMsg, error) {
	msgs := make([]*jetstream.RawStreamMsg, to-from+1)
	errs := make([]error, len(msgs))
	var next atomic.Uint64
	var wg sync.WaitGroup
	for range min(scanReaders, len(msgs)) {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < uint64(len(msgs)); i = next.Add(1) - 1 {
				msgs[i], errs[i] = stream.GetMsg(ctx, from+i)
			}
		})
	}
	wg.Wait()
	out := msgs[:0]
	for i, m := range msgs {
		switch {
		case errors.Is(errs[i], jetstream.ErrMsgNotFound):
		case errs[i] != nil:
			return nil, fmt.Errorf("message %d: %w", from+uint64(i), errs[i])
		default:
			out = append(out, m)
		}
	}
	return out, nil
}

// forged reports whether m is an event whose body names another tenant
// than its subject.
func forged(m *jetstream.RawStreamMsg) bool {
	event, ok := EventOn(m.Subject)
	return ok && TenantMismatch(m.Subject, event, m.Data) != nil
}
