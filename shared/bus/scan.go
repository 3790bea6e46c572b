package bus

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// ScanStream calls fn on every message of the stream name on subjects
// matching filter, in order, up to the last one stored when the scan
// began, reading one message at a time by sequence (STREAM.MSG.GET, which
// a service user may be granted where it may not create consumers). A
// rebuild after a Redis loss reads its streams this way.
func ScanStream(ctx context.Context, js jetstream.JetStream, name, filter string, fn func(*jetstream.RawStreamMsg) error) error {
	stream, err := js.Stream(ctx, name)
	if err != nil {
		return fmt.Errorf("scan stream %s: %w", name, err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("scan stream %s: %w", name, err)
	}
	last := info.State.LastSeq
	for seq := max(info.State.FirstSeq, 1); seq <= last && info.State.Msgs > 0; {
		msg, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("scan stream %s: message %d: %w", name, seq, err)
		}
		if msg.Sequence > last {
			return nil
		}
		if err := fn(msg); err != nil {
			return err
		}
		seq = msg.Sequence + 1
	}
	return nil
}
