package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Retention says when a stream may drop a message.
type Retention int

const (
	// Limits keeps messages until age or size limits: the system of record.
	Limits Retention = iota
	// WorkQueue deletes a message once one consumer acknowledged it.
	WorkQueue
	// Interest deletes a message once every consumer acknowledged it.
	Interest
)

// Stream declares one JetStream stream. Storage is always file.
type Stream struct {
	Name        string
	Description string
	Subjects    []string
	Retention   Retention
	// MaxAge drops older messages; 0 keeps them forever.
	MaxAge time.Duration
	// MaxBytes bounds the stream size; 0 is unlimited.
	MaxBytes int64
	// Duplicates is the Nats-Msg-Id deduplication window (default 2 min).
	Duplicates time.Duration
	// Replicas is 1 on a single server and 3 on a cluster (R3).
	Replicas int
	// AllowMsgTTL enables per-message TTLs (KV heartbeats).
	AllowMsgTTL bool
	// MaxMsgsPerSubject bounds the messages kept per subject (the oldest
	// go first); 0 is unlimited.
	MaxMsgsPerSubject int64
	// MaxMsgSize is the largest message the stream accepts, in bytes; 0
	// is the server's limit.
	MaxMsgSize int32
	// AllowDirect lets readers get messages by subject without a
	// consumer (direct get).
	AllowDirect bool
}

// Validate reports every problem in s.
func (s Stream) Validate() error {
	var errs []error
	if s.Name == "" {
		errs = append(errs, errors.New("stream.name: required"))
	}
	if len(s.Subjects) == 0 {
		errs = append(errs, fmt.Errorf("stream %s: subjects: at least one", s.Name))
	}
	if s.Replicas < 0 || s.Replicas > 5 {
		errs = append(errs, fmt.Errorf("stream %s: replicas: %d is out of range 1..5", s.Name, s.Replicas))
	}
	if s.MaxAge < 0 || s.Duplicates < 0 || s.MaxBytes < 0 || s.MaxMsgsPerSubject < 0 || s.MaxMsgSize < 0 {
		errs = append(errs, fmt.Errorf("stream %s: max_age, duplicates, max_bytes, max_msgs_per_subject and max_msg_size must not be negative", s.Name))
	}
	if s.MaxAge > 0 && s.Duplicates > s.MaxAge {
		errs = append(errs, fmt.Errorf("stream %s: duplicates window %s exceeds max_age %s", s.Name, s.Duplicates, s.MaxAge))
	}
	return errors.Join(errs...)
}

func (s Stream) config() jetstream.StreamConfig {
	cfg := jetstream.StreamConfig{
		Name:        s.Name,
		Description: s.Description,
		Subjects:    s.Subjects,
		Storage:     jetstream.FileStorage,
		MaxAge:      s.MaxAge,
		MaxBytes:    s.MaxBytes,
		Duplicates:  s.Duplicates,
		Replicas:    max(s.Replicas, 1),
		AllowMsgTTL: s.AllowMsgTTL,
		AllowDirect: s.AllowDirect,
		// Limits streams drop their oldest messages when full.
		Discard:           jetstream.DiscardOld,
		MaxMsgsPerSubject: s.MaxMsgsPerSubject,
		MaxMsgSize:        s.MaxMsgSize,
	}
	if cfg.MaxMsgsPerSubject == 0 {
		cfg.MaxMsgsPerSubject = -1
	}
	if cfg.MaxMsgSize == 0 {
		cfg.MaxMsgSize = -1
	}
	if cfg.Duplicates == 0 {
		cfg.Duplicates = 2 * time.Minute
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = -1
	}
	switch s.Retention {
	case WorkQueue:
		cfg.Retention = jetstream.WorkQueuePolicy
	case Interest:
		cfg.Retention = jetstream.InterestPolicy
	default:
		cfg.Retention = jetstream.LimitsPolicy
	}
	return cfg
}

// Consumer declares one durable pull consumer. Replicas of a service share
// it (work sharing): each message goes to one of them.
type Consumer struct {
	Stream  string
	Durable string
	// FilterSubjects selects what the consumer sees; empty means all.
	FilterSubjects []string
	// AckWait is how long a delivery may stay unacknowledged (default 30 s).
	AckWait time.Duration
	// MaxDeliver bounds deliveries; the last failed one is dead-lettered
	// (default 5).
	MaxDeliver int
	// MaxAckPending bounds unacknowledged deliveries across replicas
	// (default 1000).
	MaxAckPending int
	// NewOnly starts a new consumer at the end of the stream instead of the
	// beginning.
	NewOnly bool
}

// Validate reports every problem in c.
func (c Consumer) Validate() error {
	var errs []error
	if c.Stream == "" {
		errs = append(errs, errors.New("consumer.stream: required"))
	}
	if c.Durable == "" {
		errs = append(errs, errors.New("consumer.durable: required"))
	}
	if c.MaxDeliver < 0 || c.MaxAckPending < 0 || c.AckWait < 0 {
		errs = append(errs, fmt.Errorf("consumer %s: max_deliver, max_ack_pending and ack_wait must not be negative", c.Durable))
	}
	return errors.Join(errs...)
}

func (c Consumer) withDefaults() Consumer {
	if c.AckWait == 0 {
		c.AckWait = 30 * time.Second
	}
	if c.MaxDeliver == 0 {
		c.MaxDeliver = 5
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = 1000
	}
	return c
}

func (c Consumer) config() jetstream.ConsumerConfig {
	c = c.withDefaults()
	cfg := jetstream.ConsumerConfig{
		Durable:       c.Durable,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.AckWait,
		MaxDeliver:    c.MaxDeliver,
		MaxAckPending: c.MaxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
	if c.NewOnly {
		cfg.DeliverPolicy = jetstream.DeliverNewPolicy
	}
	// One filter travels in the API subject, which permissions can name;
	// several go in the body.
	if len(c.FilterSubjects) == 1 {
		cfg.FilterSubject = c.FilterSubjects[0]
	} else {
		cfg.FilterSubjects = c.FilterSubjects
	}
	return cfg
}

// EnsureStreams creates each stream or updates it to the declared config.
// Running it again with the same declaration changes nothing.
func (c *Conn) EnsureStreams(ctx context.Context, streams ...Stream) error {
	for _, s := range streams {
		if err := s.Validate(); err != nil {
			return err
		}
		if _, err := c.js.CreateOrUpdateStream(ctx, s.config()); err != nil {
			return fmt.Errorf("ensure stream %s: %w", s.Name, err)
		}
	}
	return nil
}

// EnsureConsumer creates the durable consumer or updates it to the
// declared config, and returns it.
func (c *Conn) EnsureConsumer(ctx context.Context, spec Consumer) (jetstream.Consumer, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	cons, err := c.js.CreateOrUpdateConsumer(ctx, spec.Stream, spec.config())
	if err != nil {
		return nil, fmt.Errorf("ensure consumer %s on %s: %w", spec.Durable, spec.Stream, err)
	}
	return cons, nil
}
