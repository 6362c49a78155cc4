# syntax=docker/dockerfile:1

# The worker, built from source in a Go image and shipped alone in a distroless image that runs as
# an unprivileged user (65532). Build: docker build -t inboxworker .
# Run:   docker run --rm -e DATABASE_URL=... -e KAFKA_BROKERS=... -p 8080:8080 inboxworker

FROM golang:1.26-bookworm AS build
WORKDIR /src
# Dependencies first, so that a code change does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/worker ./cmd/worker

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/worker /usr/local/bin/worker
USER nonroot:nonroot
# /metrics, /healthz, /readyz (HTTP_ADDR).
EXPOSE 8080
# The worker exits 0 within SHUTDOWN_TIMEOUT (30s) of a SIGTERM: give it that long before a SIGKILL.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/worker"]
CMD ["run"]
