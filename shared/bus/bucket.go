package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Bucket declares one JetStream key-value bucket (stream KV_<Name>).
// Storage is always file.
type Bucket struct {
	Name        string
	Description string
	// History is how many values of a key are kept (default 1).
	History int
	// TTL drops a value this long after it was written; 0 keeps it.
	TTL time.Duration
	// Replicas is 1 on a single server and 3 on a cluster (R3).
	Replicas int
}

// Validate reports every problem in b.
func (b Bucket) Validate() error {
	var errs []error
	if b.Name == "" {
		errs = append(errs, errors.New("bucket.name: required"))
	}
	if b.History < 0 || b.History > 64 {
		errs = append(errs, fmt.Errorf("bucket %s: history %d is out of range 1..64", b.Name, b.History))
	}
	if b.TTL < 0 {
		errs = append(errs, fmt.Errorf("bucket %s: ttl must not be negative", b.Name))
	}
	if b.Replicas < 0 || b.Replicas > 5 {
		errs = append(errs, fmt.Errorf("bucket %s: replicas: %d is out of range 1..5", b.Name, b.Replicas))
	}
	return errors.Join(errs...)
}

// EnsureBuckets creates each bucket or updates it to the declared config.
// Running it again with the same declaration changes nothing.
func (c *Conn) EnsureBuckets(ctx context.Context, buckets ...Bucket) error {
	for _, b := range buckets {
		if err := b.Validate(); err != nil {
			return err
		}
		_, err := c.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: b.Name, Description: b.Description, History: uint8(max(b.History, 1)),
			TTL: b.TTL, Storage: jetstream.FileStorage, Replicas: max(b.Replicas, 1),
		})
		if err != nil {
			return fmt.Errorf("ensure bucket %s: %w", b.Name, err)
		}
	}
	return nil
}
