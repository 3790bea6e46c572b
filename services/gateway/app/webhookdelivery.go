package app

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shizu-gpu/shizu/shared/rentalview"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Delivery: every replica pulls the read model's own stream (each record
// written is a message of KV_RENTAL_VIEW) on one shared durable pinned to
// one replica at a time, as the projector does, so each change is handled
// by one replica, in order. A change of a rental's state becomes one
// event, queued for each of its tenant's webhooks that wants the state;
// each webhook has its own queue and sender, so a slow or failing
// receiver delays only its own deliveries.

const (
	hookQueueLen    = 1024
	hookAttemptWait = 10 * time.Second
	hookFetchWait   = time.Second
	hookPinnedTTL   = 10 * time.Second
	hookRemembered  = 100_000
)

// hookEvent is the body POSTed to a webhook.
type hookEvent struct {
	ID         string     `json:"id"`
	Type       string     `json:"type"`
	Tenant     string     `json:"tenant"`
	Rental     rentalBody `json:"rental"`
	OccurredAt time.Time  `json:"occurred_at"`
}

type hookJob struct {
	hook       *webhook
	deliveryID string
	body       []byte
}

// deliverer sends the events of the replica it runs in.
type deliverer struct {
	g      *Gateway
	cons   jetstream.Consumer
	client *http.Client
	mu     sync.Mutex
	queues map[string]chan hookJob
	// last is each rental's state last handled (by this replica while it
	// was pinned; at most hookRemembered): a record written without a
	// change of state is no event.
	last map[string]string
}

// newDeliverer creates or binds the shared durable (at once, so changes
// after Open returns are delivered).
func newDeliverer(ctx context.Context, g *Gateway, js jetstream.JetStream) (*deliverer, error) {
	cons, err := js.CreateOrUpdateConsumer(ctx, "KV_"+topology.RentalViewBucket, jetstream.ConsumerConfig{
		Durable: topology.WebhooksDurable, Description: "tenant webhook deliveries", AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: 30 * time.Second, DeliverPolicy: jetstream.DeliverNewPolicy, MaxAckPending: 1024,
		PriorityPolicy: jetstream.PriorityPolicyPinned, PriorityGroups: []string{topology.WebhooksDurable}, PinnedTTL: hookPinnedTTL,
	})
	if err != nil {
		return nil, fmt.Errorf("webhook consumer: %w", err)
	}
	dialer := &net.Dialer{Timeout: hookAttemptWait, Control: hookDialGuard(g.opts.WebhookLoopback)}
	transport := &http.Transport{DialContext: dialer.DialContext, TLSHandshakeTimeout: hookAttemptWait, ForceAttemptHTTP2: true}
	client := &http.Client{Timeout: hookAttemptWait, Transport: transport, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse // a delivery is not redirected elsewhere
	}}
	return &deliverer{g: g, cons: cons, client: client, queues: map[string]chan hookJob{}, last: map[string]string{}}, nil
}

// run pulls changes until ctx ends.
func (d *deliverer) run(ctx context.Context) {
	for ctx.Err() == nil {
		batch, err := d.cons.Fetch(256, jetstream.FetchMaxWait(hookFetchWait), jetstream.FetchPriorityGroup(topology.WebhooksDurable))
		if err != nil {
			if ctx.Err() == nil {
				d.g.log.Warn("webhooks: fetch", "err", err)
				sleepCtx(ctx, 100*time.Millisecond)
			}
			continue
		}
		for m := range batch.Messages() {
			d.handle(ctx, m)
			if err := m.Ack(); err != nil {
				d.g.log.Warn("webhooks: ack", "err", err)
			}
		}
	}
}

// handle queues the deliveries of one record written, if its state changed.
func (d *deliverer) handle(ctx context.Context, m jetstream.Msg) {
	if op := m.Headers().Get("KV-Operation"); op != "" {
		return // a delete or a purge
	}
	r, err := decodeRental(m.Data())
	if err != nil || d.last[r.Tenant+"."+r.ID] == r.State {
		return
	}
	if len(d.last) >= hookRemembered {
		clear(d.last) // bounded memory; a record rewritten later in the same state is then delivered again
	}
	d.last[r.Tenant+"."+r.ID] = r.State
	meta, err := m.Metadata()
	if err != nil {
		return
	}
	hooks, err := d.g.tenantWebhooks(ctx, r.Tenant)
	if err != nil {
		d.g.log.Warn("webhooks: read the tenant's webhooks", "tenant", r.Tenant, "err", err)
		return
	}
	at := r.Since
	if at.IsZero() {
		at = meta.Timestamp.UTC()
	}
	ev := hookEvent{ID: "evt-" + strconv.FormatUint(meta.Sequence.Stream, 10), Type: "rental." + r.State, Tenant: r.Tenant,
		Rental: toBody(r), OccurredAt: at}
	body, err := json.Marshal(ev)
	if err != nil {
		return
	}
	for _, h := range hooks {
		if h.Tenant != r.Tenant || !h.wants(r.State) {
			continue
		}
		d.enqueue(ctx, hookJob{hook: h, deliveryID: ev.ID + "." + h.ID, body: body})
	}
}

func decodeRental(b []byte) (*rentalview.Rental, error) {
	var r rentalview.Rental
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	if r.Tenant == "" || r.ID == "" {
		return nil, errors.New("a record without tenant or id")
	}
	return &r, nil
}

// enqueue puts j on its webhook's queue, starting the webhook's sender;
// a full queue drops the delivery (counted) rather than hold up others.
func (d *deliverer) enqueue(ctx context.Context, j hookJob) {
	d.mu.Lock()
	q, ok := d.queues[j.hook.ID]
	if !ok {
		q = make(chan hookJob, hookQueueLen)
		d.queues[j.hook.ID] = q
		go d.send(ctx, q)
	}
	d.mu.Unlock()
	select {
	case q <- j:
	default:
		d.g.metrics.hooksFailed.Add(ctx, 1)
		d.g.log.Warn("webhooks: queue full, delivery dropped", "webhook", j.hook.ID, "delivery", j.deliveryID)
	}
}

// send delivers one webhook's queue in order until ctx ends.
func (d *deliverer) send(ctx context.Context, q <-chan hookJob) {
	for {
		select {
		case <-ctx.Done():
			return
		case j := <-q:
			if err := d.deliver(ctx, j); err != nil && ctx.Err() == nil {
				d.g.metrics.hooksFailed.Add(ctx, 1)
				d.g.log.Warn("webhooks: delivery given up", "webhook", j.hook.ID, "delivery", j.deliveryID, "err", err)
			} else if err == nil {
				d.g.metrics.hooksDelivered.Add(ctx, 1)
			}
		}
	}
}

// errHookGone ends the retries of a webhook deleted meanwhile.
var errHookGone = errors.New("the webhook was deleted")

// deliver POSTs j, retrying with exponential backoff on a failure to
// connect, a timeout, 429 or 5xx, for the configured time.
func (d *deliverer) deliver(ctx context.Context, j hookJob) error {
	eb := backoff.NewExponentialBackOff(backoff.WithInitialInterval(d.g.opts.WebhookRetryInitial),
		backoff.WithMaxInterval(time.Minute), backoff.WithMaxElapsedTime(d.g.opts.WebhookRetryFor))
	err := backoff.Retry(func() error {
		if _, err := d.g.hooks.Get(ctx, webhookKey(j.hook.Tenant, j.hook.ID)); errors.Is(err, jetstream.ErrKeyNotFound) {
			return backoff.Permanent(errHookGone)
		}
		return d.attempt(ctx, j)
	}, backoff.WithContext(eb, ctx))
	if errors.Is(err, errHookGone) {
		return nil
	}
	return err
}

func (d *deliverer) attempt(ctx context.Context, j hookJob) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, j.hook.URL, bytes.NewReader(j.body))
	if err != nil {
		return backoff.Permanent(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "shizu-webhooks/1")
	req.Header.Set("Shizu-Delivery-Id", j.deliveryID)
	req.Header.Set("Shizu-Signature", sign(j.hook.Secret, d.g.now(), j.body))
	resp, err := d.client.Do(req)
	if err != nil {
		return err // connection refused, timeout: retried
	}
	_ = resp.Body.Close()
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return nil
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		return fmt.Errorf("receiver answered %d", resp.StatusCode)
	default:
		return backoff.Permanent(fmt.Errorf("receiver answered %d", resp.StatusCode))
	}
}

// sign is the Shizu-Signature of body at t: t=<unix>,v1=<hex HMAC-SHA256
// of "<unix>.<body>" with the secret>.
func sign(secret string, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts + "."))
	mac.Write(body)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac.Sum(nil))
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// hookDialGuard refuses a webhook connection to an address inside the
// platform's network: private, loopback (unless allowLoopback, for shizu dev
// and tests), link-local (cloud metadata services), unspecified or
// multicast. It sees the resolved address, so a name that resolves to one
// (or is re-pointed to one after the webhook was registered) is refused too.
func hookDialGuard(allowLoopback bool) func(network, address string, _ syscall.RawConn) error {
	return func(_, address string, _ syscall.RawConn) error {
		host, _, err := net.SplitHostPort(address)
		if err != nil {
			return fmt.Errorf("webhook address %q: %w", address, err)
		}
		ip, err := netip.ParseAddr(host)
		if err != nil {
			return fmt.Errorf("webhook address %q: %w", address, err)
		}
		ip = ip.Unmap()
		switch {
		case ip.IsLoopback() && allowLoopback:
			return nil
		case ip.IsLoopback(), ip.IsPrivate(), ip.IsLinkLocalUnicast(), ip.IsLinkLocalMulticast(),
			ip.IsUnspecified(), ip.IsMulticast(), ip.IsInterfaceLocalMulticast():
			return fmt.Errorf("webhook address %s is not a public address: refused", ip)
		}
		return nil
	}
}
