#!/usr/bin/env bash
# Checks the one-way dependency rule of docs/ARCHITECTURE.md and
# docs/CONTRIBUTING.md: cmd -> server -> the protocol fronts (service, rlqs)
# -> limiter -> store; rules, settings and the other leaves import nothing
# of ours.
set -euo pipefail
mod=$(GOWORK=off go list -m)
fail=0
check() { # package, forbidden import prefixes...
  local pkg=$1; shift
  local imports
  imports=$(go list -f '{{join .Imports "\n"}}' "$mod/$pkg" 2>/dev/null || true)
  for bad in "$@"; do
    if grep -q "^$mod/$bad" <<<"$imports"; then
      echo "imports: $pkg must not import $bad"; fail=1
    fi
  done
}
check src/settings src/
check src/rules src/
check src/stats src/
# The RLQS allocation is pure: it knows nothing else of ours.
check src/quota src/
# Following files is a leaf too: its owners (provider, server) say what
# the files are.
check src/filewatch src/
check src/limiter src/store src/service src/server src/provider src/settings src/stats
# The stores' client TLS knows nothing of ours.
check src/store/tlsclient src/
# Every package under src/store (each store, the breaker, and whatever is
# added there), found in the tree.
for d in $(find src/store -mindepth 1 -maxdepth 1 -type d | sort); do
  check "$d" src/service src/rlqs src/server src/provider src/settings
done
check src/service src/server src/settings src/store src/provider src/rlqs
# The listeners' hardening knows its bounds only as server hands them.
check src/server/listen src/server src/service src/rlqs src/settings src/store src/provider src/limiter src/live src/capture
# The two gRPC fronts share only src/wire (the codec's "malformed" mark and
# the request bounds), a leaf; neither imports the other.
check src/wire src/
check src/rlqs src/service src/server src/settings src/store src/provider src/limiter src/live src/capture
# The live view's recorder sits between service (which feeds it) and
# limiter (whose decisions it reads); its HTTP side reads it and the rules
# and is wired by server, so it must not know server, provider or a store.
check src/live src/service src/server src/provider src/settings src/store src/stats
check src/live/web src/service src/server src/provider src/settings src/store src/stats src/limiter
# The capture's recorder and reader know requests as plain data: the service
# fills them, server wires the endpoint, ratelimit-check reads captures.
check src/capture src/service src/server src/provider src/settings src/store src/stats src/limiter src/live
# The replay composes the service on the memory store, as server does for
# a running instance; it reads no settings, files or other stores.
check src/replay src/server src/provider src/settings src/store/redis src/store/memcached src/live
check src/provider src/limiter src/service src/server src/store
if grep -rl --include='*.go' 'go-control-plane/envoy/service/ratelimit' src/limiter src/rules src/store 2>/dev/null; then
  echo "imports: RLS protos must stop at service"; fail=1
fi
# xDS types stay in provider (and, outside src, in the tests' xDS server,
# harness/xds.go).
if bad=$(grep -rl --include='*.go' --exclude='*_test.go' -e 'go-control-plane/ratelimit' -e 'envoy/service/discovery' \
  -e 'go-control-plane/pkg/' src cmd 2>/dev/null | grep -v '^src/provider/'); then
  echo "imports: xDS types must stay in src/provider: $bad"; fail=1
fi
# harness/ starts the processes the tests run against, storetest/ is the
# stores' suite and loadgen/ the load generator of the tools and tests: they
# sit at the root, beside src/, because they are for tests and tools, never
# for the service. The harness knows nothing of the service; the suite knows
# the limiter's contract, not a store; the load generator speaks only the
# wire protocol.
check harness src/
check storetest src/store src/service src/rlqs src/server src/provider src/settings
check loadgen src/
if grep -rl --include='*.go' --exclude='*_test.go' -e 'ratelimit/harness"' -e 'ratelimit/storetest"' -e 'ratelimit/loadgen"' src cmd; then
  echo "imports: harness/, storetest/ and loadgen/ are for tests and tools only"; fail=1
fi
if grep -rl --include='*.go' --exclude='*_test.go' 'src/wire/wiretest' src cmd | grep -v '^src/wire/wiretest/'; then
  echo "imports: wire/wiretest is for tests only"; fail=1
fi
exit $fail
