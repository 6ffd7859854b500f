# Build: docker build -t ratelimit .
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/ ./cmd/ratelimit ./cmd/ratelimit-check ./cmd/ratelimit-client

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /bin/
# The anchor's layout, so existing deployments keep their volume mounts:
# rules in /srv/runtime_data/current/<RUNTIME_SUBDIRECTORY>/config/*.yaml.
ENV RUNTIME_ROOT=/srv/runtime_data/current \
    RUNTIME_SUBDIRECTORY=ratelimit
# gRPC (8081) and HTTP (8080: /healthcheck, /json). The debug listener
# (DEBUG_PORT 6070: pprof, /rlconfig, /stats) keeps its default DEBUG_HOST,
# 127.0.0.1, so it is reachable only from inside the container, which
# includes `kubectl port-forward <pod> 6070`. To publish it deliberately,
# on a trusted network only: docker run -e DEBUG_HOST=0.0.0.0
# -p 127.0.0.1:6070:6070 ratelimit.
EXPOSE 8080 8081
ENTRYPOINT ["/bin/ratelimit"]
