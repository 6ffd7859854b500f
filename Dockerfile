# Build: make docker, or docker build --build-arg VERSION=v1.2.3 -t ratelimit .
FROM golang:1.26-bookworm AS build
# VERSION is what `ratelimit -version` prints; the Makefile passes git's.
ARG VERSION=dev
WORKDIR /src
# The service's module alone: the modules of the tests, examples and tools
# (go.work, not in the build context) are not downloaded.
ENV GOWORK=off
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The Makefile's BUILDFLAGS (a test checks that they agree): a static binary
# (no cgo), so that it runs on distroless/static with no libc.
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/ ./cmd/ratelimit ./cmd/ratelimit-check ./cmd/ratelimit-client

# No shell, no package manager: only the binaries, CA certificates and tzdata.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /bin/
# The anchor's layout, so existing deployments keep their volume mounts:
# rules in /srv/runtime_data/current/<RUNTIME_SUBDIRECTORY>/config/*.yaml.
# The default rules are there so that `docker run` serves at once; a volume
# mounted there replaces them. Nothing is written at run time, so the root
# filesystem can be read-only, and every file is world-readable, so any uid
# works (OpenShift's random ones, 65534).
COPY config/ /srv/runtime_data/current/ratelimit/config/
ENV RUNTIME_ROOT=/srv/runtime_data/current \
    RUNTIME_SUBDIRECTORY=ratelimit
# Numeric, so that Kubernetes' runAsNonRoot can verify it.
USER 65532:65532
# gRPC (8081) and HTTP (8080: /healthcheck, /json). The debug listener
# (DEBUG_PORT 6070: pprof, /rlconfig, /stats) keeps its default DEBUG_HOST,
# 127.0.0.1, so it is reachable only from inside the container, which
# includes `kubectl port-forward <pod> 6070`. To publish it deliberately,
# on a trusted network only: docker run -e DEBUG_HOST=0.0.0.0
# -p 127.0.0.1:6070:6070 ratelimit.
EXPOSE 8080 8081
# No shell in the image: the binary probes its own /healthcheck.
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["/bin/ratelimit", "-healthcheck"]
ENTRYPOINT ["/bin/ratelimit"]
