package main

import (
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/rentalview"
)

// The tests' fold of rental events into the CLI's views (the verbs read
// the gateway's read model, which folds with the same rentalview.Apply).

// rentals folds rental events into one view per rental, in order of first
// appearance, with what the events say in people's words.
func rentals(events []event) []*rentalView {
	byID := map[string]*rentalView{}
	var order []*rentalView
	for _, e := range events {
		m, ok := e.Msg.(interface {
			GetRentalId() string
			GetTenantId() string
		})
		if !ok {
			continue
		}
		r := byID[m.GetRentalId()]
		if r == nil {
			if !rentalview.Folds(e.Msg) {
				continue
			}
			r = &rentalView{ID: m.GetRentalId(), Tenant: m.GetTenantId(), State: stateRequested}
			byID[r.ID] = r
			order = append(order, r)
		}
		rentalview.Apply((*rentalview.Rental)(r), e.Msg, ts(metaOf(e.Msg).GetOccurredAt()))
	}
	for _, r := range order {
		r.inPeoplesWords()
	}
	return order
}

// metaOf returns an event's envelope.
func metaOf(m proto.Message) *shizuv1.EventMeta {
	if g, ok := m.(interface{ GetMeta() *shizuv1.EventMeta }); ok {
		return g.GetMeta()
	}
	return nil
}
