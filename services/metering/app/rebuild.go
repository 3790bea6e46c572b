package app

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/services/metering/redisstore"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// RebuildResult says what a rebuild did.
type RebuildResult struct {
	// Generation is the aggregate generation now current.
	Generation string
	// Applied counts distinct usage records folded in; Duplicates counts
	// messages whose record id had been folded in already; Invalid counts
	// messages that do not decode or validate (they are skipped, as the
	// live consumer dead-letters them).
	Applied, Duplicates, Invalid int
}

// Rebuild recomputes the usage aggregates from the BILLING stream: it folds
// every usage record into a fresh generation, switches to it, folds in what
// arrived meanwhile (records the live consumer put into the old generation
// only), and drops the old generation. Aggregates are sums of records
// applied once per record id, so the result equals the live aggregates to
// the micro-unit.
func Rebuild(ctx context.Context, conn *bus.Conn, store *redisstore.Store) (RebuildResult, error) {
	stream, err := conn.JetStream().Stream(ctx, topology.StreamBilling)
	if err != nil {
		return RebuildResult{}, fmt.Errorf("rebuild: %w", err)
	}
	old, err := store.Generation(ctx)
	if err != nil {
		return RebuildResult{}, err
	}
	gen, err := store.NewGeneration(ctx)
	if err != nil {
		return RebuildResult{}, err
	}
	res := RebuildResult{Generation: gen}
	info, err := stream.Info(ctx)
	if err != nil {
		return res, fmt.Errorf("rebuild: %w", err)
	}
	next, err := fold(ctx, stream, store, gen, info.State.FirstSeq, info.State.LastSeq, &res)
	if err != nil {
		return res, err
	}
	if err := store.SwitchGeneration(ctx, gen); err != nil {
		return res, err
	}
	if info, err = stream.Info(ctx); err != nil {
		return res, fmt.Errorf("rebuild: %w", err)
	}
	if _, err := fold(ctx, stream, store, gen, next, info.State.LastSeq, &res); err != nil {
		return res, err
	}
	if old != gen {
		if err := store.DropGeneration(ctx, old); err != nil {
			return res, fmt.Errorf("rebuild: drop generation %s: %w", old, err)
		}
	}
	return res, nil
}

func fold(ctx context.Context, stream jetstream.Stream, store *redisstore.Store, gen string, from, to uint64, res *RebuildResult) (uint64, error) {
	if from == 0 {
		from = 1
	}
	for seq := from; seq <= to; seq++ {
		msg, err := stream.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return seq, fmt.Errorf("rebuild: message %d: %w", seq, err)
		}
		if !subject.Matches(subject.UsageRecordedAll, msg.Subject) {
			continue
		}
		var ev shizuv1.UsageRecorded
		if err := proto.Unmarshal(msg.Data, &ev); err != nil || ev.Validate() != nil {
			res.Invalid++
			continue
		}
		applied, err := store.Apply(ctx, gen, &ev)
		if err != nil {
			return seq, err
		}
		if applied.New {
			res.Applied++
		} else {
			res.Duplicates++
		}
	}
	return to + 1, nil
}

// CloseInvoice builds a tenant's invoice for [from, to) (whole UTC days)
// from the aggregates and the commitments, and publishes it on
// invoice.<tenant>.closed under its deterministic id, so closing the same
// period twice publishes one invoice.
func CloseInvoice(ctx context.Context, cfg Config, conn *bus.Conn, store *redisstore.Store, tenant string, from, to time.Time) (ledger.Invoice, error) {
	cat, accounts, err := cfg.load()
	if err != nil {
		return ledger.Invoice{}, err
	}
	if from.UTC() != from.UTC().Truncate(24*time.Hour) || to.UTC() != to.UTC().Truncate(24*time.Hour) {
		return ledger.Invoice{}, fmt.Errorf("invoice period %s..%s must start and end at midnight UTC", from.Format(time.RFC3339), to.Format(time.RFC3339))
	}
	usage, err := store.Usage(ctx, tenant, cat.Currency, from, to)
	if err != nil {
		return ledger.Invoice{}, err
	}
	inv, err := ledger.BuildInvoice(cat, tenant, from, to, usage, accounts.Commitments)
	if err != nil {
		return ledger.Invoice{}, err
	}
	subj, err := subject.Format(subject.InvoiceClosed, tenant)
	if err != nil {
		return ledger.Invoice{}, err
	}
	if _, err := conn.Publish(ctx, subj, inv.Proto(topology.Metering)); err != nil {
		return ledger.Invoice{}, fmt.Errorf("publish invoice: %w", err)
	}
	return inv, nil
}
