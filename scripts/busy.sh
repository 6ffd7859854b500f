#!/usr/bin/env bash
# Runs a command on a busy machine: BUSY_PROCS (2) processes that do nothing
# but spin beside it, as on a CI runner shared with other jobs or a
# developer's laptop compiling something else. The project's tests must
# pass so (issue 27): their time bounds are relative to what the machine
# does, never absolute.
#   scripts/busy.sh make test
set -euo pipefail
n=${BUSY_PROCS:-2}
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT INT TERM
for _ in $(seq "$n"); do
  sh -c 'while :; do :; done' &
  pids+=($!)
done
echo "busy.sh: $n spinning processes beside: $*" >&2
"$@"
