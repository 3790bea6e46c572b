# syntax=docker/dockerfile:1
#
# One image recipe for every Shizu service:
#
#   docker build --build-arg SERVICE=scheduler -t shizu/scheduler:dev .
#
# SERVICE is one of scheduler, metering, autoscaler, failover, gateway, node-agent (built from
# ./services/$SERVICE/cmd/$SERVICE) or shizu (the CLI, ./cmd/shizu, used by compose's
# one-shot `provision` container), in workspace mode (go.work), and installed as
# /usr/local/bin/$SERVICE. docker-compose.yml passes SERVICE per service.
# Needs BuildKit (the default builder since Docker 23) for the cache mounts.

ARG GO_IMAGE=golang:1.26-bookworm
# Runtime base, for all five services: debian:bookworm-slim.
# - node-agent is built with cgo (github.com/NVIDIA/go-nvml) and dlopens
#   libnvidia-ml.so.1, which the NVIDIA Container Toolkit mounts in from the host
#   driver; that library needs glibc, so node-agent cannot use a static/musl base.
# - The other four are static (CGO_ENABLED=0) and would also run on
#   gcr.io/distroless/static. We use one base for all: one base layer to pull and
#   patch, and the same debugging shell everywhere. The cost is a larger image and
#   more packages to scan; switching the static services to distroless only needs a
#   second runtime stage.
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${GO_IMAGE} AS build
ARG SERVICE
WORKDIR /src
# The module cache and build cache live in BuildKit cache mounts, so copying the
# whole tree first costs no re-download when only sources change.
# node-agent needs cgo (go-nvml does not build without it); CGO_CFLAGS silences
# the NVML 13 deprecation warnings. The other services are static.
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    set -eu; \
    pkg="./services/${SERVICE:-}/cmd/${SERVICE:-}"; \
    case "${SERVICE:-}" in \
      scheduler|metering|autoscaler|failover|gateway) \
        export CGO_ENABLED=0 ;; \
      node-agent) \
        export CGO_ENABLED=1 CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" ;; \
      shizu) \
        pkg=./cmd/shizu; export CGO_ENABLED=1 CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" ;; \
      *) \
        echo "SERVICE must be one of scheduler metering autoscaler failover gateway node-agent shizu, got '${SERVICE:-}'" >&2; \
        exit 1 ;; \
    esac; \
    go build -trimpath -buildvcs=false -ldflags="-s -w" -o "/out/${SERVICE}" "$pkg"

FROM ${RUNTIME_IMAGE}
ARG SERVICE
# ca-certificates: TLS to an OTLP endpoint or a NATS server with a public CA.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 shizu \
 && useradd --system --uid 10001 --gid shizu --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin shizu
COPY --from=build "/out/${SERVICE}" "/usr/local/bin/${SERVICE}"
# A fixed entrypoint name, since ENTRYPOINT cannot expand build args.
RUN ln -s "/usr/local/bin/${SERVICE}" /usr/local/bin/shizu-service
ENV SHIZU_HTTP_ADDR=:9090
EXPOSE 9090
USER 10001:10001
# Compose and Kubernetes define the health checks (`<service> -healthcheck`, or
# HTTP probes on /readyz and /healthz).
ENTRYPOINT ["/usr/local/bin/shizu-service"]
