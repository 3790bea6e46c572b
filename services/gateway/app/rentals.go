package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/rentalview"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// source is the gateway's name in the events it publishes.
const source = "gateway"

func rentalRoutes(g *Gateway) []route {
	return []route{
		{method: http.MethodPost, path: "/v1/rentals", access: tenantWrite, action: "rental_create", handle: g.createRental},
		{method: http.MethodGet, path: "/v1/rentals", access: tenantRead, handle: g.listRentals},
		{method: http.MethodGet, path: "/v1/rentals/{rental_id}", access: tenantRead, handle: g.getRental},
		{method: http.MethodPost, path: "/v1/rentals/{rental_id}/stop", access: tenantWrite, action: "rental_stop", handle: g.stopRental},
		{method: http.MethodGet, path: "/v1/rentals/{rental_id}/events", access: tenantRead, handle: g.followRental},
	}
}

// rentalBody is the API's Rental: the read model's record without its
// stream sequence.
type rentalBody struct {
	ID          string               `json:"rental_id"`
	Tenant      string               `json:"tenant_id"`
	State       string               `json:"state"`
	Why         string               `json:"why,omitempty"`
	Node        string               `json:"node,omitempty"`
	GPUs        []int32              `json:"gpus,omitempty"`
	Model       string               `json:"model,omitempty"`
	Plan        string               `json:"plan,omitempty"`
	Shape       string               `json:"shape,omitempty"`
	GPUCount    int32                `json:"gpu_count,omitempty"`
	MilliGPU    int32                `json:"milli_gpu,omitempty"`
	VRAMMiB     int64                `json:"vram_mib,omitempty"`
	Labels      map[string]string    `json:"labels,omitempty"`
	Attempt     int32                `json:"attempt,omitempty"`
	RequestedAt time.Time            `json:"requested_at,omitzero"`
	UpdatedAt   time.Time            `json:"updated_at,omitzero"`
	Since       time.Time            `json:"since"`
	Segments    []rentalview.Segment `json:"segments,omitempty"`
	Timeline    []rentalview.Step    `json:"timeline"`
}

func toBody(r *rentalview.Rental) rentalBody {
	tl := r.Timeline
	if tl == nil {
		tl = []rentalview.Step{}
	}
	return rentalBody{ID: r.ID, Tenant: r.Tenant, State: r.State, Why: r.Why, Node: r.Node, GPUs: r.GPUs, Model: r.Model,
		Plan: r.Plan, Shape: r.Shape, GPUCount: r.GPUCount, MilliGPU: r.MilliGPU, VRAMMiB: r.VRAMMiB, Labels: r.Labels,
		Attempt: r.Attempt, RequestedAt: r.RequestedAt, UpdatedAt: r.UpdatedAt, Since: r.Since, Segments: r.Segments, Timeline: tl}
}

func newRentalID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "r-" + hex.EncodeToString(b)
}

// createRental publishes RentalRequested for the key's tenant, with a
// rental id and a request time of the gateway's.
func (g *Gateway) createRental(w http.ResponseWriter, r *http.Request, c *call) {
	var body specBody
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		writeProblem(w, r, http.StatusBadRequest, probInvalid, "the body is not a RentalSpec", fieldError{Field: "body", Reason: err.Error()})
		return
	}
	spec, errs := body.proto(int32(g.opts.MaxPriority))
	if len(errs) > 0 {
		writeProblem(w, r, http.StatusBadRequest, probInvalid, errs[0].Field+": "+errs[0].Reason, errs...)
		return
	}
	rid, now := newRentalID(), g.now().UTC()
	c.rentalID = rid
	ev := &shizuv1.RentalRequested{Meta: shizuv1.NewMeta("rental:"+rid+":requested", source, "", rid, now),
		RentalId: rid, TenantId: c.tenant, Spec: spec}
	if err := ev.Validate(); err != nil {
		errs := contractErrors(err)
		writeProblem(w, r, http.StatusBadRequest, probInvalid, errs[0].Field+": "+errs[0].Reason, errs...)
		return
	}
	if !g.publish(w, r, c, subject.RentalRequested, ev) {
		return
	}
	view := &rentalview.Rental{ID: rid, Tenant: c.tenant, State: rentalview.StateRequested}
	rentalview.Apply(view, ev, now)
	w.Header().Set("Location", "/v1/rentals/"+rid)
	writeJSON(w, http.StatusCreated, toBody(view))
}

// publish sends ev on form for the call's tenant; false when it answered
// with a problem.
func (g *Gateway) publish(w http.ResponseWriter, r *http.Request, c *call, form string, ev proto.Message) bool {
	subj, err := subject.Format(form, c.tenant)
	if err != nil {
		c.log.Error("publish: subject", "err", err)
		writeProblem(w, r, http.StatusInternalServerError, probInternal, "the request could not be sent")
		return false
	}
	// Once sent, a request is seen through even if the client leaves: an
	// answer lost half-way would make its retry a second rental.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), requestTimeout)
	defer cancel()
	if _, err := g.bus.Publish(ctx, subj, ev); err != nil {
		c.log.Error("publish", "err", err, "subject", subj)
		writeProblem(w, r, http.StatusInternalServerError, probInternal, "the request could not be sent to the platform; retry later")
		return false
	}
	return true
}

// rentalList is the API's RentalList.
type rentalList struct {
	Rentals    []rentalBody `json:"rentals"`
	NextCursor string       `json:"next_cursor,omitempty"`
}

// listRentals reads a page of the tenant's rentals from the read model.
func (g *Gateway) listRentals(w http.ResponseWriter, r *http.Request, c *call) {
	q := r.URL.Query()
	f := rentalview.Filter{State: q.Get("state"), Plan: q.Get("plan"), Model: q.Get("model")}
	for _, l := range q["label"] {
		k, v, _ := strings.Cut(l, "=")
		if f.Labels == nil {
			f.Labels = map[string]string{}
		}
		f.Labels[k] = v
	}
	limit := 0
	if s := q.Get("limit"); s != "" {
		limit, _ = strconv.Atoi(s) // the document checked it: 1..1000
	}
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	rs, next, err := g.views.List(ctx, c.tenant, f, q.Get("cursor"), limit)
	if fault.IsInvalid(err) {
		writeProblem(w, r, http.StatusBadRequest, probInvalid, "the cursor is not one this API returned",
			fieldError{Field: "query cursor", Reason: "not a next_cursor of this list"})
		return
	}
	if err != nil {
		g.unavailable(w, r, c, err)
		return
	}
	out := rentalList{Rentals: make([]rentalBody, 0, len(rs)), NextCursor: next}
	for _, rr := range rs {
		out.Rentals = append(out.Rentals, toBody(rr))
	}
	writeJSON(w, http.StatusOK, out)
}

// getRental reads one of the tenant's rentals; another tenant's is 404.
func (g *Gateway) getRental(w http.ResponseWriter, r *http.Request, c *call) {
	if rr, ok := g.lookup(w, r, c); ok {
		writeJSON(w, http.StatusOK, toBody(rr))
	}
}

// lookup reads the rental of the path for the call's tenant, answering
// 404 (or 500) itself.
func (g *Gateway) lookup(w http.ResponseWriter, r *http.Request, c *call) (*rentalview.Rental, bool) {
	id := c.params["rental_id"]
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	rr, err := g.views.Get(ctx, c.tenant, id)
	switch {
	case errors.Is(err, rentalview.ErrNotFound) || fault.IsInvalid(err):
		writeProblem(w, r, http.StatusNotFound, probNotFound, "no rental "+id+" (list yours with GET /v1/rentals)")
		return nil, false
	case err != nil:
		g.unavailable(w, r, c, err)
		return nil, false
	}
	return rr, true
}

func (g *Gateway) unavailable(w http.ResponseWriter, r *http.Request, c *call, err error) {
	c.log.Error("read model", "err", err)
	writeProblem(w, r, http.StatusInternalServerError, probInternal, "the rentals could not be read; retry later")
}

// ended says whether a rental is over: nothing more will happen to it.
func ended(r *rentalview.Rental) bool {
	return r.State == rentalview.StateStopped || r.State == rentalview.StateRejected
}

type stopBody struct {
	Reason string `json:"reason"`
}

// stopRental publishes RentalCancelRequested for one of the tenant's
// rentals (the scheduler stops or cancels it); one that ended already is
// answered as it is.
func (g *Gateway) stopRental(w http.ResponseWriter, r *http.Request, c *call) {
	var body stopBody
	if r.ContentLength != 0 {
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&body); err != nil && !errors.Is(err, io.EOF) {
			writeProblem(w, r, http.StatusBadRequest, probInvalid, "the body is not a StopRequest", fieldError{Field: "body", Reason: err.Error()})
			return
		}
	}
	rr, ok := g.lookup(w, r, c)
	if !ok {
		return
	}
	if ended(rr) {
		writeJSON(w, http.StatusOK, toBody(rr))
		return
	}
	now := g.now().UTC()
	ev := &shizuv1.RentalCancelRequested{Meta: shizuv1.NewMeta("rental:"+rr.ID+":cancel_requested", source, "", rr.ID, now),
		RentalId: rr.ID, TenantId: c.tenant, RequestedBy: "key-" + c.key.ID, Reason: shizuv1.Truncate(body.Reason, 256)}
	if err := ev.Validate(); err != nil {
		errs := contractErrors(err)
		writeProblem(w, r, http.StatusBadRequest, probInvalid, errs[0].Field+": "+errs[0].Reason, errs...)
		return
	}
	if !g.publish(w, r, c, subject.RentalCancelRequested, ev) {
		return
	}
	rentalview.Apply(rr, ev, now)
	writeJSON(w, http.StatusAccepted, toBody(rr))
}
