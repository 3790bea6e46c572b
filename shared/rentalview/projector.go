package rentalview

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Durable is the projector's consumer on RENTALS, shared by every replica.
// It pins one replica at a time (priority group Durable), so events of a
// rental are applied in stream order; another takes over when the pinned
// one stops pulling for pinnedTTL.
const Durable = topology.RentalViewDurable

const (
	fetchBatch  = 512
	maxPending  = 4 * fetchBatch
	pinnedTTL   = 10 * time.Second
	fetchWait   = time.Second
	writeRetry  = 100 * time.Millisecond
	ackWaitTime = 30 * time.Second
	// writers is how many records of a batch are written at once.
	writers = 32
)

// Projector keeps the bucket current from RENTALS.
type Projector struct {
	js    jetstream.JetStream
	store *Store
	log   *slog.Logger
}

// NewProjector returns a projector writing into s.
func NewProjector(js jetstream.JetStream, s *Store, log *slog.Logger) *Projector {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Projector{js: js, store: s, log: log}
}

// change is one decoded rental event.
type change struct {
	key    string
	tenant string
	msg    proto.Message
	seq    uint64
	at     time.Time
}

// decodeEvent reads a RENTALS message: the subject decides the event type
// and the tenant; a body naming another tenant is forged and ignored.
func decodeEvent(subj string, data []byte, seq uint64, stored time.Time) (change, error) {
	name, ok := bus.EventOn(subj)
	if !ok {
		return change{}, fmt.Errorf("subject %s carries no rental event", subj)
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(name))
	if err != nil {
		return change{}, fmt.Errorf("event %s: %w", name, err)
	}
	msg := mt.New().Interface()
	if err := proto.Unmarshal(data, msg); err != nil {
		return change{}, fmt.Errorf("decode %s at %d: %w", name, seq, err)
	}
	ids, ok := msg.(interface {
		GetRentalId() string
		GetTenantId() string
	})
	if !ok || !Folds(msg) {
		return change{}, fmt.Errorf("%s is not a rental event", name)
	}
	toks := strings.Split(subj, ".")
	tenant := toks[1]
	if ids.GetTenantId() != tenant {
		return change{}, fmt.Errorf("%s at %d on %s names tenant %q: ignored", name, seq, subj, shizuv1.Truncate(ids.GetTenantId(), 128))
	}
	if err := checkTokens(tenant, ids.GetRentalId()); err != nil {
		return change{}, fmt.Errorf("%s at %d: %w", name, seq, err)
	}
	at := stored.UTC()
	if m, ok := msg.(interface{ GetMeta() *shizuv1.EventMeta }); ok && m.GetMeta().GetOccurredAt() != nil {
		at = ts(m.GetMeta().GetOccurredAt())
	}
	return change{key: key(tenant, ids.GetRentalId()), tenant: tenant, msg: msg, seq: seq, at: at}, nil
}

// fold applies the changes newer than r (nil: no record yet) in order and
// says whether any was.
func fold(r *Rental, cs []change) (*Rental, bool) {
	applied := false
	for _, c := range cs {
		if r != nil && c.seq <= r.Seq {
			continue // redelivered or replayed
		}
		if r == nil {
			ids := c.msg.(interface{ GetRentalId() string })
			r = &Rental{ID: ids.GetRentalId(), Tenant: c.tenant, State: StateRequested}
		}
		Apply(r, c.msg, c.at)
		r.Seq, applied = c.seq, true
	}
	return r, applied
}

// write folds cs (events of the record k, in stream order) into the
// stored record with compare-and-set on its revision, again on a
// conflict with another writer.
func (s *Store) write(ctx context.Context, k string, cs []change) error {
	for {
		cur, rev, err := s.load(ctx, k)
		if err != nil {
			return err
		}
		r, applied := fold(cur, cs)
		if !applied {
			return nil
		}
		b, err := json.Marshal(r)
		if err != nil {
			return fmt.Errorf("encode rental %s: %w", k, err)
		}
		if err = s.cas(ctx, k, b, rev); !conflict(err) {
			return err
		}
	}
}

// putNewer stores r under k unless the stored record has applied as
// much (compare-and-set, again on a conflict).
func (s *Store) putNewer(ctx context.Context, k string, r *Rental) error {
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode rental %s: %w", k, err)
	}
	for {
		cur, rev, err := s.load(ctx, k)
		if err != nil {
			return err
		}
		if cur != nil && cur.Seq >= r.Seq {
			return nil
		}
		if err = s.cas(ctx, k, b, rev); !conflict(err) {
			return err
		}
	}
}

// cas writes b under k if its revision is still rev (0: absent).
func (s *Store) cas(ctx context.Context, k string, b []byte, rev uint64) error {
	var err error
	if rev == 0 {
		_, err = s.kv.Create(ctx, k, b)
	} else {
		_, err = s.kv.Update(ctx, k, b, rev)
	}
	if err != nil && !conflict(err) {
		return fmt.Errorf("write rental %s: %w", k, err)
	}
	return err
}

// conflict says whether err is a lost compare-and-set.
func conflict(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrKeyExists) ||
		errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// group splits changes by record, keeping stream order within each.
func group(cs []change) (keys []string, by map[string][]change) {
	by = map[string][]change{}
	for _, c := range cs {
		if _, ok := by[c.key]; !ok {
			keys = append(keys, c.key)
		}
		by[c.key] = append(by[c.key], c)
	}
	return keys, by
}

// consumer creates or binds the shared durable.
func (p *Projector) consumer(ctx context.Context) (jetstream.Consumer, error) {
	cons, err := p.js.CreateOrUpdateConsumer(ctx, topology.StreamRentals, jetstream.ConsumerConfig{
		Durable:        Durable,
		Description:    "rental read model projector",
		FilterSubject:  subject.RentalAll,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        ackWaitTime,
		MaxAckPending:  maxPending,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		PriorityPolicy: jetstream.PriorityPolicyPinned,
		PriorityGroups: []string{Durable},
		PinnedTTL:      pinnedTTL,
	})
	if err != nil {
		return nil, fmt.Errorf("projector consumer: %w", err)
	}
	return cons, nil
}

// Run projects RENTALS into the bucket until ctx ends (then it returns
// nil). Each batch is written before it is acknowledged; a write that
// fails is tried again before the next batch, so no event of a rental is
// applied after a later one.
func (p *Projector) Run(ctx context.Context) error {
	cons, err := p.consumer(ctx)
	if err != nil {
		return err
	}
	for ctx.Err() == nil {
		batch, err := cons.Fetch(fetchBatch, jetstream.FetchMaxWait(fetchWait), jetstream.FetchPriorityGroup(Durable))
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			p.log.Warn("rentalview: fetch", "err", err)
			sleep(ctx, writeRetry)
			continue
		}
		if err := p.drain(ctx, batch.Messages()); err != nil {
			return nil // ctx ended
		}
	}
	return nil
}

// drain applies a fetch's messages as they arrive: whenever no more is
// waiting, those read so far are written, then acknowledged, so an event
// is projected without waiting for the fetch to fill or expire. It
// returns ctx's error when ctx ended before the writes.
func (p *Projector) drain(ctx context.Context, in <-chan jetstream.Msg) error {
	var msgs []jetstream.Msg
	var cs []change
	flush := func() error {
		if err := p.apply(ctx, cs); err != nil {
			return err
		}
		for _, m := range msgs {
			if err := m.Ack(); err != nil {
				p.log.Warn("rentalview: ack", "err", err)
			}
		}
		msgs, cs = msgs[:0], cs[:0]
		return nil
	}
	for {
		var m jetstream.Msg
		var ok bool
		select {
		case m, ok = <-in:
		default:
			if len(msgs) > 0 {
				if err := flush(); err != nil {
					return err
				}
			}
			m, ok = <-in
		}
		if !ok {
			return flush()
		}
		msgs = append(msgs, m)
		meta, err := m.Metadata()
		if err != nil {
			continue
		}
		c, err := decodeEvent(m.Subject(), m.Data(), meta.Sequence.Stream, meta.Timestamp)
		if err != nil {
			p.log.Warn("rentalview: event skipped", "err", err)
			continue
		}
		cs = append(cs, c)
	}
}

// apply writes a batch, retrying each failed record until it is written
// or ctx ends (then it returns ctx's error).
func (p *Projector) apply(ctx context.Context, cs []change) error {
	keys, by := group(cs)
	// Records are independent: up to writers of them are written at once,
	// each record's events in stream order by one writer.
	work := make(chan string)
	var wg sync.WaitGroup
	for range min(writers, len(keys)) {
		wg.Go(func() {
			for k := range work {
				p.writeRecord(ctx, k, by[k])
			}
		})
	}
	for _, k := range keys {
		work <- k
	}
	close(work)
	wg.Wait()
	return ctx.Err()
}

// writeRecord writes one record's changes, again after a failure, until
// it is written or ctx ends.
func (p *Projector) writeRecord(ctx context.Context, k string, cs []change) {
	for {
		err := p.store.write(ctx, k, cs)
		if err == nil || ctx.Err() != nil {
			return
		}
		p.log.Warn("rentalview: write", "err", err)
		sleep(ctx, writeRetry)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// Rebuild empties the bucket and folds RENTALS from its first message
// into it again. Records are written with the same compare-and-set as
// Run, so a projector running meanwhile is never set back.
func (p *Projector) Rebuild(ctx context.Context) error {
	kvStream, err := p.js.Stream(ctx, "KV_"+Bucket)
	if err != nil {
		return fmt.Errorf("rebuild: %w", err)
	}
	if err := kvStream.Purge(ctx); err != nil {
		return fmt.Errorf("rebuild: purge %s: %w", Bucket, err)
	}
	recs := map[string]*Rental{}
	var order []string
	_, err = bus.ScanStream(ctx, p.js, topology.StreamRentals, subject.RentalAll, func(m *jetstream.RawStreamMsg) error {
		c, err := decodeEvent(m.Subject, m.Data, m.Sequence, m.Time)
		if err != nil {
			p.log.Warn("rentalview: rebuild: event skipped", "err", err)
			return nil
		}
		if _, ok := recs[c.key]; !ok {
			order = append(order, c.key)
		}
		recs[c.key], _ = fold(recs[c.key], []change{c})
		return nil
	})
	if err != nil {
		return fmt.Errorf("rebuild: %w", err)
	}
	for _, k := range order {
		if err := p.store.putNewer(ctx, k, recs[k]); err != nil {
			return fmt.Errorf("rebuild: %w", err)
		}
	}
	return nil
}
