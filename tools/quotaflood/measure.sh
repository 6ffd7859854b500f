#!/usr/bin/env bash
# measure.sh: ShouldRateLimit's throughput on Redis with and without a
# misbehaving quota client beside it (issue 35; REQUEST_TIMEOUT=20ms, so
# that calls the store holds up count as errors), in alternating runs on a
# fresh redis-server and service each time, so that the ratio is taken in
# one sitting. Prints one line per run and the medians.
#
#   tools/quotaflood/measure.sh [rounds] [flood flags...]
#   tools/quotaflood/measure.sh 3 -streams 2 -buckets 10000
#
# RATELIMIT_BIN runs that binary as the service instead of one built from
# this tree. BEFORE_BIN adds that binary's two runs to each round (four
# runs a round, in an order that rotates), so that a before/after
# comparison is paired in one sitting too.
set -uo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-3}
shift || true
flood=("$@")
[ ${#flood[@]} -eq 0 ] && flood=(-streams 2 -buckets 10000)
dir=$(mktemp -d)
trap 'rm -rf "$dir"; pkill -P $$ 2>/dev/null' EXIT
go build -o "$dir/" ./cmd/ratelimit ./tools/ratelimit-bench ./tools/quotaflood || exit 1
svcbin=${RATELIMIT_BIN:-$dir/ratelimit}
mkdir -p "$dir/rules/config"
cat > "$dir/rules/config/rules.yaml" <<'YAML'
domain: bench
descriptors:
  - key: user_id
    rate_limit: {unit: second, requests_per_unit: 1000000}
YAML
cat > "$dir/rules/config/quota.yaml" <<'YAML'
domain: web
quota_buckets:
  - bucket: {tenant: "*"}
    rate_limit: {unit: second, requests_per_unit: 20}
YAML
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
one() { # one run: $1 = base | flood, $2 = the service's binary, $3 = its label; prints req/s and errors
	local rport gport svcbin=$2
	rport=$(free_port); gport=$(free_port)
	redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no >/dev/null &
	local redis=$! fl=
	sleep 0.3
	RUNTIME_ROOT="$dir" RUNTIME_SUBDIRECTORY=rules BACKEND_TYPE=redis REDIS_SOCKET_TYPE=tcp \
		REDIS_URL=127.0.0.1:$rport REQUEST_TIMEOUT=20ms PORT=0 GRPC_PORT=$gport DEBUG_PORT=0 LOG_LEVEL=error \
		"$svcbin" >"$dir/service.log" 2>&1 &
	local svc=$!
	sleep 1.5
	if [ "$1" = flood ]; then
		"$dir/quotaflood" -addr 127.0.0.1:$gport "${flood[@]}" -d 14s >"$dir/flood.log" 2>&1 &
		fl=$!
		sleep 4
	fi
	"$dir/ratelimit-bench" -addr 127.0.0.1:$gport -domain bench -c 64 -d 8s \
		-descriptors 'user_id=user-{0..9999}' >"$dir/bench.log" 2>&1
	local rps errs
	rps=$(sed -n 's/.*= \([0-9]*\) req\/s.*/\1/p' "$dir/bench.log")
	errs=$(awk '/^errors/{print $2}' "$dir/bench.log")
	echo "$1${3:-} ${rps:-0} ${errs:-?}"
	[ -n "$fl" ] && wait "$fl"
	kill "$svc" "$redis" 2>/dev/null
	wait "$svc" "$redis" 2>/dev/null
}
runs=("base $svcbin" "flood $svcbin")
[ -n "${BEFORE_BIN:-}" ] && runs+=("base $BEFORE_BIN -before" "flood $BEFORE_BIN -before")
for r in $(seq "$rounds"); do
	for i in $(seq 0 $((${#runs[@]} - 1))); do
		# shellcheck disable=SC2086
		one ${runs[$(((i + r) % ${#runs[@]}))]}
	done
done | tee "$dir/runs"
median() { sort -n | awk '{a[NR]=$1} END{print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
for label in "" -before; do
	grep -q "^base$label " "$dir/runs" || continue
	b=$(awk -v k="base$label" '$1==k{print $2}' "$dir/runs" | median)
	f=$(awk -v k="flood$label" '$1==k{print $2}' "$dir/runs" | median)
	echo "median req/s${label:+ (before)}: without $b, with the quota client $f (ratio $(awk -v b="$b" -v f="$f" 'BEGIN{printf "%.2f", f/b}'))"
done
