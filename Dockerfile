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
    RUNTIME_SUBDIRECTORY=ratelimit \
    DEBUG_HOST=0.0.0.0
EXPOSE 8080 8081 6070
ENTRYPOINT ["/bin/ratelimit"]
