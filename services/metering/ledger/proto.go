package ledger

import (
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
)

// Proto is the record as the UsageRecorded event metering publishes;
// occurred_at is the record's end, so the event is as deterministic as the
// record.
func (r Record) Proto(source string) *shizuv1.UsageRecorded {
	return &shizuv1.UsageRecorded{
		Meta:     shizuv1.NewMeta(r.ID, source, "", r.RentalID, r.End),
		RentalId: r.RentalID, TenantId: r.TenantID, NodeId: r.NodeID, Plan: r.Plan, Model: r.Model,
		IntervalStart: timestamppb.New(r.Start), IntervalEnd: timestamppb.New(r.End),
		Seconds: r.Seconds, MilliGpu: r.MilliGPU, GpuCount: r.GPUCount,
		UnitPricePerGpuHour: r.UnitPrice.Proto(), Amount: r.Amount.Proto(), Labels: r.Labels,
	}
}

// Proto is the invoice as the InvoiceClosed event metering publishes.
func (inv Invoice) Proto(source string) *shizuv1.InvoiceClosed {
	ev := &shizuv1.InvoiceClosed{
		Meta:      shizuv1.NewMeta(inv.ID, source, "", inv.ID, inv.PeriodEnd),
		InvoiceId: inv.ID, TenantId: inv.TenantID,
		PeriodStart: timestamppb.New(inv.PeriodStart), PeriodEnd: timestamppb.New(inv.PeriodEnd),
		Total: inv.Total.Proto(),
	}
	for _, l := range inv.Lines {
		ev.LineItems = append(ev.LineItems, &shizuv1.InvoiceLineItem{Plan: l.Plan, Model: l.Model,
			MilliGpuSeconds: l.MilliGPUSeconds, Amount: l.Amount.Proto()})
	}
	return ev
}
