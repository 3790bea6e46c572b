package app

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

func poolRoutes(g *Gateway) []route {
	return []route{
		{method: http.MethodPost, path: "/v1/pools", access: tenantWrite, action: "pool_declare", handle: g.declarePool},
		{method: http.MethodGet, path: "/v1/pools", access: tenantRead, handle: g.listPools},
		{method: http.MethodDelete, path: "/v1/pools/{pool}", access: tenantWrite, action: "pool_withdraw", handle: g.withdrawPool},
		{method: http.MethodPost, path: "/v1/pools/{pool}/traffic", access: tenantWrite, action: "pool_traffic", handle: g.poolTraffic},
	}
}

// poolID is the autoscaler's id of the tenant's pool: "<tenant>_<pool>".
// Tenant ids have no '_', so the id names one tenant's pool only; the
// autoscaler refuses a declaration of a pool another tenant owns.
func poolID(tenant, pool string) string { return tenant + "_" + pool }

// poolBody is the API's Pool.
type poolBody struct {
	Pool      string         `json:"pool"`
	PoolID    string         `json:"pool_id"`
	State     string         `json:"state"`
	Policy    map[string]any `json:"policy,omitempty"`
	Replicas  *int32         `json:"replicas,omitempty"`
	Decisions []decision     `json:"decisions"`
}

type decision struct {
	At        time.Time `json:"at"`
	From      int32     `json:"from_replicas"`
	To        int32     `json:"to_replicas"`
	Rule      string    `json:"rule,omitempty"`
	Metric    string    `json:"metric,omitempty"`
	Observed  float64   `json:"observed"`
	Threshold float64   `json:"threshold"`
	Reason    string    `json:"reason,omitempty"`
}

// declarePool publishes PoolDeclared for the key's tenant: the body is one
// pool of the autoscaler's policy format (docs/autoscaler.md) with "pool"
// for its name and without id and tenant, which the gateway sets. The
// autoscaler checks the policy again and answers a refusal with a dead
// letter, so the answer is 202.
func (g *Gateway) declarePool(w http.ResponseWriter, r *http.Request, c *call) {
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		writeProblem(w, r, http.StatusBadRequest, probInvalid, "the body is not a PoolDeclaration", fieldError{Field: "body", Reason: err.Error()})
		return
	}
	pool, _ := body["pool"].(string) // the document checked it
	delete(body, "pool")
	id := poolID(c.tenant, pool)
	policy := map[string]any{"id": id, "tenant": c.tenant}
	for k, v := range body {
		policy[k] = v
	}
	data, _ := json.Marshal(policy) // decoded JSON: never fails
	now := g.now().UTC()
	ev := &shizuv1.PoolDeclared{Meta: shizuv1.NewMeta("pool:"+id+":declared:"+now.Format(time.RFC3339Nano), source, "", id, now),
		PoolId: id, TenantId: c.tenant, PolicyJson: data}
	if !g.publishPool(w, r, c, subject.ScalePoolDeclared, id, ev) {
		return
	}
	writeJSON(w, http.StatusAccepted, poolBody{Pool: pool, PoolID: id, State: "declared", Policy: body, Decisions: []decision{}})
}

// withdrawPool publishes the withdrawal of one of the tenant's declared
// pools; a pool the tenant has not declared (or withdrew) is 404.
func (g *Gateway) withdrawPool(w http.ResponseWriter, r *http.Request, c *call) {
	pool := c.params["pool"]
	id := poolID(c.tenant, pool)
	if _, ok := g.declared(w, r, c, pool); !ok {
		return
	}
	now := g.now().UTC()
	ev := &shizuv1.PoolDeclared{Meta: shizuv1.NewMeta("pool:"+id+":withdrawn:"+now.Format(time.RFC3339Nano), source, "", id, now),
		PoolId: id, TenantId: c.tenant, Withdrawn: true}
	if !g.publishPool(w, r, c, subject.ScalePoolDeclared, id, ev) {
		return
	}
	writeJSON(w, http.StatusAccepted, poolBody{Pool: pool, PoolID: id, State: "withdrawn", Decisions: []decision{}})
}

// trafficBody is the API's TrafficSample.
type trafficBody struct {
	RPS        float64 `json:"requests_per_second"`
	Concurrent int64   `json:"concurrent_requests"`
	P99        string  `json:"p99_latency,omitempty"`
	Window     string  `json:"window,omitempty"`
}

// poolTraffic publishes a traffic sample of one of the tenant's declared
// pools, as a load balancer would, for the autoscaler's rules.
func (g *Gateway) poolTraffic(w http.ResponseWriter, r *http.Request, c *call) {
	var body trafficBody
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		writeProblem(w, r, http.StatusBadRequest, probInvalid, "the body is not a TrafficSample", fieldError{Field: "body", Reason: err.Error()})
		return
	}
	window, p99 := 10*time.Second, time.Duration(0)
	var errs []fieldError
	if body.Window != "" {
		if d, err := time.ParseDuration(body.Window); err != nil || d <= 0 {
			errs = append(errs, fieldError{Field: "window", Reason: "want a positive duration such as 10s"})
		} else {
			window = d
		}
	}
	if body.P99 != "" {
		if d, err := time.ParseDuration(body.P99); err != nil || d <= 0 {
			errs = append(errs, fieldError{Field: "p99_latency", Reason: "want a positive duration such as 85ms"})
		} else {
			p99 = d
		}
	}
	if len(errs) > 0 {
		writeProblem(w, r, http.StatusBadRequest, probInvalid, errs[0].Field+": "+errs[0].Reason, errs...)
		return
	}
	pool := c.params["pool"]
	if _, ok := g.declared(w, r, c, pool); !ok {
		return
	}
	id, now := poolID(c.tenant, pool), g.now().UTC()
	ev := &shizuv1.TrafficSampled{Meta: shizuv1.NewMeta("traffic:"+id+":"+now.Format(time.RFC3339Nano), source, "", id, now),
		PoolId: id, ConcurrentRequests: body.Concurrent, RequestsPerSecond: body.RPS, Window: durationpb.New(window)}
	if p99 > 0 {
		ev.P99Latency = durationpb.New(p99)
	}
	if !g.publishPool(w, r, c, subject.TrafficSample, id, ev) {
		return
	}
	body.Window = window.String()
	writeJSON(w, http.StatusAccepted, body)
}

// publishPool validates ev and publishes it on form for the pool id.
func (g *Gateway) publishPool(w http.ResponseWriter, r *http.Request, c *call, form, id string, ev interface {
	proto.Message
	Validate() error
}) bool {
	if err := ev.Validate(); err != nil {
		errs := contractErrors(err)
		writeProblem(w, r, http.StatusBadRequest, probInvalid, errs[0].Field+": "+errs[0].Reason, errs...)
		return false
	}
	subj, err := subject.Format(form, id)
	if err != nil {
		writeProblem(w, r, http.StatusBadRequest, probInvalid, "pool: "+err.Error(), fieldError{Field: "pool", Reason: err.Error()})
		return false
	}
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	if _, err := g.bus.Publish(ctx, subj, ev); err != nil {
		c.log.Error("publish", "err", err, "subject", subj)
		writeProblem(w, r, http.StatusInternalServerError, probInternal, "the request could not be sent to the platform; retry later")
		return false
	}
	return true
}

// declared reads the tenant's pool's last declaration; a pool never
// declared or withdrawn is answered 404.
func (g *Gateway) declared(w http.ResponseWriter, r *http.Request, c *call, pool string) (poolBody, bool) {
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	s, err := g.bus.JetStream().Stream(ctx, topology.StreamScaling)
	if err == nil {
		var p poolBody
		var found bool
		if p, found, err = readPool(ctx, s, c.tenant, pool); err == nil && found {
			return p, true
		}
	}
	if err != nil {
		c.log.Error("read pools", "err", err)
		writeProblem(w, r, http.StatusInternalServerError, probInternal, "the pools could not be read; retry later")
		return poolBody{}, false
	}
	writeProblem(w, r, http.StatusNotFound, probNotFound, "no pool "+pool+" (list yours with GET /v1/pools)")
	return poolBody{}, false
}

// readPool is the tenant's pool as its last declaration and last scaling
// decision say; found is false when it is not declared (or withdrawn).
func readPool(ctx context.Context, s jetstream.Stream, tenant, pool string) (poolBody, bool, error) {
	id := poolID(tenant, pool)
	m, err := s.GetLastMsgForSubject(ctx, "scale."+id+".declared")
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return poolBody{}, false, nil
	}
	if err != nil {
		return poolBody{}, false, err
	}
	var ev shizuv1.PoolDeclared
	if proto.Unmarshal(m.Data, &ev) != nil || ev.GetTenantId() != tenant || ev.GetWithdrawn() {
		return poolBody{}, false, nil
	}
	p := poolBody{Pool: pool, PoolID: id, State: "declared", Decisions: []decision{}}
	if err := json.Unmarshal(ev.GetPolicyJson(), &p.Policy); err == nil {
		delete(p.Policy, "id")
		delete(p.Policy, "tenant")
	}
	d, err := s.GetLastMsgForSubject(ctx, "scale."+id+".decided")
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return p, true, nil
	}
	if err != nil {
		return poolBody{}, false, err
	}
	var sd shizuv1.ScalingDecided
	if proto.Unmarshal(d.Data, &sd) == nil {
		to := sd.GetToReplicas()
		p.Replicas = &to
		p.Decisions = append(p.Decisions, decision{At: sd.GetMeta().GetOccurredAt().AsTime().UTC(), From: sd.GetFromReplicas(), To: to,
			Rule: sd.GetRule(), Metric: sd.GetMetric(), Observed: sd.GetObservedValue(), Threshold: sd.GetThreshold(), Reason: sd.GetReason()})
	}
	return p, true, nil
}

// poolList is the API's PoolList.
type poolList struct {
	Pools []poolBody `json:"pools"`
}

// listPools lists the tenant's declared pools: the SCALING stream's
// declaration subjects of the tenant's pool ids, each with its last
// declaration and last decision.
func (g *Gateway) listPools(w http.ResponseWriter, r *http.Request, c *call) {
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	out := poolList{Pools: []poolBody{}}
	err := func() error {
		s, err := g.bus.JetStream().Stream(ctx, topology.StreamScaling)
		if err != nil {
			return err
		}
		// A wildcard is a whole token: list every pool's declaration
		// subject (names and counts only) and keep the tenant's ids.
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject.ScalePoolDeclaredAll))
		if err != nil {
			return err
		}
		var names []string
		for subj := range info.State.Subjects {
			id := strings.TrimSuffix(strings.TrimPrefix(subj, "scale."), ".declared")
			if n, ok := strings.CutPrefix(id, c.tenant+"_"); ok {
				names = append(names, n)
			}
		}
		sort.Strings(names)
		for _, n := range names {
			p, ok, err := readPool(ctx, s, c.tenant, n)
			if err != nil {
				return err
			}
			if ok {
				out.Pools = append(out.Pools, p)
			}
		}
		return nil
	}()
	if err != nil {
		c.log.Error("list pools", "err", err)
		writeProblem(w, r, http.StatusInternalServerError, probInternal, "the pools could not be read; retry later")
		return
	}
	writeJSON(w, http.StatusOK, out)
}
