package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"

	"github.com/shizu-gpu/shizu/services/gateway/api"
	"github.com/shizu-gpu/shizu/services/gateway/identity"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/rentalview"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Gateway is one replica of the tenant API: its Handler serves /v1.
type Gateway struct {
	opts    Options
	log     *slog.Logger
	bus     *bus.Conn
	doc     *openapi3.T
	router  routers.Router
	routes  map[string]route
	dir     *identity.Directory
	views   *rentalview.Store
	idem    jetstream.KeyValue
	hooks   jetstream.KeyValue
	limits  *limiter
	metrics *metrics
	prices  *prices
	now     func() time.Time
}

// Open builds a replica on conn (the gateway's NATS user): it ensures its
// buckets, loads the keys into a watched cache (until ctx ends) and, with
// opts.Projector, starts the rental read model's projector (until ctx
// ends). mp (nil: none) receives its metrics (metrics.go). The returned Gateway serves once Handler is mounted.
func Open(ctx context.Context, conn *bus.Conn, opts Options, log *slog.Logger, mp metric.MeterProvider) (*Gateway, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	doc, err := api.Load(ctx)
	if err != nil {
		return nil, err
	}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("openapi router: %w", err)
	}
	js := conn.JetStream()
	if err := waitProvisioned(ctx, js, log); err != nil {
		return nil, err
	}
	if err := conn.EnsureBuckets(ctx, topology.Buckets(opts.Replicas)...); err != nil {
		return nil, err
	}
	m, err := newMetrics(mp)
	if err != nil {
		return nil, err
	}
	g := &Gateway{opts: opts, log: log, bus: conn, doc: doc, router: router, limits: newLimiter(opts.RatePerSecond, opts.RateBurst),
		metrics: m, now: time.Now}
	if g.prices, err = loadPrices(opts.CataloguePath); err != nil {
		return nil, err
	}
	if g.idem, err = js.KeyValue(ctx, topology.IdempotencyBucket); err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", topology.IdempotencyBucket, err)
	}
	if g.hooks, err = js.KeyValue(ctx, topology.WebhooksBucket); err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", topology.WebhooksBucket, err)
	}
	if g.dir, err = identity.Open(ctx, js); err != nil {
		return nil, err
	}
	if err := g.dir.Watch(ctx); err != nil {
		return nil, err
	}
	if g.views, err = rentalview.Open(ctx, js); err != nil {
		return nil, err
	}
	if opts.Projector {
		p := rentalview.NewProjector(js, g.views, log)
		go func() {
			if err := p.Run(ctx); err != nil {
				log.Error("rental read model projector stopped", "err", err)
			}
		}()
	}
	d, err := newDeliverer(ctx, g, js)
	if err != nil {
		return nil, err
	}
	go d.run(ctx)
	g.routes = map[string]route{}
	for _, set := range routeSets {
		for _, rt := range set(g) {
			g.routes[rt.method+" "+rt.path] = rt
		}
	}
	return g, nil
}

// waitProvisioned waits (until ctx ends) for the streams `shizu provision`
// creates: the gateway publishes to RENTALS and AUDIT (provisioned together,
// RENTALS first) and projects RENTALS, and never creates streams itself.
func waitProvisioned(ctx context.Context, js jetstream.JetStream, log *slog.Logger) error {
	eb := backoff.NewExponentialBackOff(backoff.WithInitialInterval(200*time.Millisecond),
		backoff.WithMaxInterval(5*time.Second), backoff.WithMaxElapsedTime(0))
	return backoff.RetryNotify(func() error {
		_, err := js.Stream(ctx, topology.StreamRentals)
		if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return backoff.Permanent(fmt.Errorf("stream %s: %w", topology.StreamRentals, err))
		}
		return err
	}, backoff.WithContext(eb, ctx), func(_ error, next time.Duration) {
		log.Warn("stream not provisioned yet; run `shizu provision` as admin", "stream", topology.StreamRentals, "retry_in", next)
	})
}

// access is who may call a route.
type access int

const (
	public access = iota
	// tenantRead: any key of a tenant.
	tenantRead
	// tenantWrite: a read-write key of a tenant.
	tenantWrite
	// operatorOnly: an operator key.
	operatorOnly
)

// route is one operation of the OpenAPI document and its handler.
type route struct {
	method string
	// path is the document's path template, e.g. /v1/rentals/{rental_id}.
	path   string
	access access
	// action names a state-changing call in the audit log
	// (audit.<tenant>.<action>); empty for a read.
	action string
	handle func(w http.ResponseWriter, r *http.Request, c *call)
}

// routeSets are the files' routes; a new file of endpoints adds its
// function here and its paths to api/openapi.json.
var routeSets = []func(*Gateway) []route{docRoutes, rentalRoutes, moneyRoutes, webhookRoutes, logRoutes, poolRoutes, modelRoutes, deadLetterRoutes}

func docRoutes(*Gateway) []route {
	return []route{{method: http.MethodGet, path: "/v1/openapi.json", access: public,
		handle: func(w http.ResponseWriter, _ *http.Request, _ *call) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(api.Document)
		}}}
}
