# ratelimit — run `make help` for the targets.
GO       ?= go
BIN      ?= bin
PKGS     ?= ./...
FUZZTIME ?= 30s

.PHONY: help build run test race unit lint imports check bench bench-tuning bench-go fuzz docker servers clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  %-10s %s\n", $$1, $$2}'

build: ## build every command into ./bin
	$(GO) build -o $(BIN)/ ./cmd/...

run: ## serve ./config/*.yaml on the memory store
	$(GO) run ./cmd/ratelimit

servers: ## install redis-server, memcached and nutcracker (twemproxy) if they are missing
	@./scripts/ensure-servers.sh

test: servers ## the whole suite with the race detector (installs missing servers)
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -timeout 12m $(PKGS)

race: test ## same as test: the suite always runs with -race

unit: ## fast tests only, without the race detector
	$(GO) test -short -count=1 $(PKGS)

lint: ## gofmt, go vet and staticcheck
	@test -z "$$(gofmt -s -l $$(git ls-files '*.go'))" || (gofmt -s -l $$(git ls-files '*.go'); echo "gofmt -s needed"; exit 1)
	$(GO) vet $(PKGS)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@2025.1.1 $(PKGS)

imports: ## check that packages import only downwards (DESIGN.md)
	@./scripts/check-imports.sh

check: lint imports test ## everything CI checks

bench-go: ## Go micro-benchmarks of the hot path
	$(GO) test -run '^$$' -bench . -benchmem -count 3 ./src/...

bench: servers ## the service-level scenarios, written to docs/BENCHMARKS.md and docs/SCALING.md
	$(GO) run ./tools/benchrun -out docs/BENCHMARKS.md

bench-tuning: servers ## the gRPC and GC defaults against their alternatives, written to docs/BENCHMARKS.md
	$(GO) run ./tools/benchrun -out docs/BENCHMARKS.md -stores memory,redis -runs 5 -variants \
	  'default; no-workers: GRPC_NUM_STREAM_WORKERS=0; no-gc-headroom: GC_HEADROOM_BYTES=0; grpc-go-defaults: GRPC_NUM_STREAM_WORKERS=0 GC_HEADROOM_BYTES=0; shared-write-buffer: GRPC_SHARED_WRITE_BUFFER=true'

fuzz: ## run one fuzz target: make fuzz FUZZ=FuzzParse PKG=./src/rules
	$(GO) test -run '^$$' -fuzz '$(FUZZ)' -fuzztime $(FUZZTIME) $(PKG)

docker: ## build the container image (needs a Docker engine)
	docker build -t ratelimit:dev .

clean: ## remove build output
	rm -rf $(BIN)
