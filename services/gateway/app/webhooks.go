package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shizu-gpu/shizu/shared/topology"
)

// Webhooks: a tenant registers URLs to which the gateway POSTs its
// rentals' state changes (webhookdelivery.go). They are kept in the
// WEBHOOKS bucket under "<tenant>.<webhook id>"; the signing secret is
// answered once, at creation.

func webhookRoutes(g *Gateway) []route {
	return []route{
		{method: http.MethodPost, path: "/v1/webhooks", access: tenantWrite, action: "webhook_create", handle: g.createWebhook},
		{method: http.MethodGet, path: "/v1/webhooks", access: tenantRead, handle: g.listWebhooks},
		{method: http.MethodDelete, path: "/v1/webhooks/{webhook_id}", access: tenantWrite, action: "webhook_delete", handle: g.deleteWebhook},
	}
}

// webhook is one stored webhook.
type webhook struct {
	ID        string    `json:"webhook_id"`
	Tenant    string    `json:"tenant_id"`
	URL       string    `json:"url"`
	Events    []string  `json:"events"`
	Secret    string    `json:"secret"`
	CreatedAt time.Time `json:"created_at"`
}

// webhookBody is the API's Webhook (WebhookCreated with Secret).
type webhookBody struct {
	ID        string    `json:"webhook_id"`
	URL       string    `json:"url"`
	Events    []string  `json:"events"`
	CreatedAt time.Time `json:"created_at"`
	Secret    string    `json:"secret,omitempty"`
}

func (h *webhook) body() webhookBody {
	return webhookBody{ID: h.ID, URL: h.URL, Events: h.Events, CreatedAt: h.CreatedAt}
}

// wants says whether the webhook takes changes to state.
func (h *webhook) wants(state string) bool {
	return len(h.Events) == 0 || slices.Contains(h.Events, state)
}

func webhookKey(tenant, id string) string { return tenant + "." + id }

// checkWebhookURL says what is wrong with raw as a webhook's URL: https,
// or http to a loopback address when allowLoopback.
func checkWebhookURL(raw string, allowLoopback bool) error {
	u, err := url.Parse(raw)
	if err != nil || !u.IsAbs() || u.Host == "" {
		return errors.New("not an absolute URL such as https://example.com/hooks/shizu")
	}
	if u.User != nil {
		return errors.New("credentials in the URL are not kept; authenticate deliveries by their signature")
	}
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		ip := net.ParseIP(u.Hostname())
		if allowLoopback && (u.Hostname() == "localhost" || ip != nil && ip.IsLoopback()) {
			return nil
		}
		if allowLoopback {
			return errors.New("http is only for a loopback address (127.0.0.1, ::1, localhost); use https")
		}
		return errors.New("must be https")
	}
	return fmt.Errorf("scheme %q: must be https", u.Scheme)
}

// createWebhook stores a webhook for the key's tenant with a new secret.
func (g *Gateway) createWebhook(w http.ResponseWriter, r *http.Request, c *call) {
	var in struct {
		URL    string   `json:"url"`
		Events []string `json:"events"`
	}
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		writeProblem(w, r, http.StatusBadRequest, probInvalid, "the body is not a WebhookRequest", fieldError{Field: "body", Reason: err.Error()})
		return
	}
	if err := checkWebhookURL(in.URL, g.opts.WebhookLoopback); err != nil {
		writeProblem(w, r, http.StatusBadRequest, probInvalid, "url: "+err.Error(), fieldError{Field: "url", Reason: err.Error()})
		return
	}
	if in.Events == nil {
		in.Events = []string{}
	}
	hook := &webhook{ID: "wh-" + randomHex(8), Tenant: c.tenant, URL: in.URL, Events: in.Events,
		Secret: "whsec_" + randomHex(24), CreatedAt: g.now().UTC().Truncate(time.Second)}
	b, _ := json.Marshal(hook) // strings and a time: never fails
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	if _, err := g.hooks.Create(ctx, webhookKey(c.tenant, hook.ID), b); err != nil {
		c.log.Error("store webhook", "err", err)
		writeProblem(w, r, http.StatusInternalServerError, probInternal, "the webhook could not be stored; retry later")
		return
	}
	out := hook.body()
	out.Secret = hook.Secret
	w.Header().Set("Location", "/v1/webhooks/"+hook.ID)
	writeJSON(w, http.StatusCreated, out)
}

// listWebhooks answers the tenant's webhooks, without secrets.
func (g *Gateway) listWebhooks(w http.ResponseWriter, r *http.Request, c *call) {
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	hooks, err := g.tenantWebhooks(ctx, c.tenant)
	if err != nil {
		c.log.Error("list webhooks", "err", err)
		writeProblem(w, r, http.StatusInternalServerError, probInternal, "the webhooks could not be read; retry later")
		return
	}
	out := struct {
		Webhooks []webhookBody `json:"webhooks"`
	}{Webhooks: []webhookBody{}}
	for _, h := range hooks {
		out.Webhooks = append(out.Webhooks, h.body())
	}
	writeJSON(w, http.StatusOK, out)
}

// deleteWebhook deletes one of the tenant's webhooks; another tenant's
// is 404 like an unknown one (the key names the tenant).
func (g *Gateway) deleteWebhook(w http.ResponseWriter, r *http.Request, c *call) {
	id := c.params["webhook_id"]
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	k := webhookKey(c.tenant, id)
	if _, err := g.hooks.Get(ctx, k); err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			writeProblem(w, r, http.StatusNotFound, probNotFound, "no webhook "+id+" (list yours with GET /v1/webhooks)")
			return
		}
		c.log.Error("read webhook", "err", err)
		writeProblem(w, r, http.StatusInternalServerError, probInternal, "the webhook could not be deleted; retry later")
		return
	}
	if err := g.hooks.Purge(ctx, k); err != nil {
		c.log.Error("delete webhook", "err", err)
		writeProblem(w, r, http.StatusInternalServerError, probInternal, "the webhook could not be deleted; retry later")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// tenantWebhooks reads the tenant's webhooks, in id order.
func (g *Gateway) tenantWebhooks(ctx context.Context, tenant string) ([]*webhook, error) {
	kl, err := g.hooks.ListKeysFiltered(ctx, tenant+".*")
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", topology.WebhooksBucket, err)
	}
	var keys []string
	for k := range kl.Keys() {
		keys = append(keys, k)
	}
	_ = kl.Stop()
	slices.Sort(keys)
	var out []*webhook
	for _, k := range keys {
		e, err := g.hooks.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read webhook %s: %w", k, err)
		}
		var h webhook
		if err := json.Unmarshal(e.Value(), &h); err != nil || h.Tenant != tenant {
			continue
		}
		out = append(out, &h)
	}
	return out, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
