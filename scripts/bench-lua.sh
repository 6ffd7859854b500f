#!/usr/bin/env bash
# Redis's own CPU per decision of each algorithm's script against the fixed
# window's INCRBY + EXPIRE, on a redis-server of its own (docs/BENCHMARKS.md,
# "Lua algorithms, round two"). Variants run in turn, ROUNDS times, each on
# an emptied Redis; the CPU is redis-server's utime+stime from /proc.
#   scripts/bench-lua.sh [OLD_DECIDE_LUA]
# OLD_DECIDE_LUA: a decideLua of an earlier build (its six-ARGV-per-op
# calling convention), measured as "old" rows.
set -euo pipefail
N=${N:-300000}; ROUNDS=${ROUNDS:-3}; PORT=${PORT:-16479}
dir=$(mktemp -d); trap 'redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
go test -count=1 -run TestWriteScripts ./src/store/redis/ -args -scripts-dir="$dir" >/dev/null
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
  --pidfile "$dir/r.pid" --logfile "$dir/r.log" --dir "$dir"
for _ in $(seq 50); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
R="redis-cli -p $PORT"; PID=$(cat "$dir/r.pid")
load() { $R script load "$(cat "$1")"; }
SW=$(load "$dir/sliding_window.lua"); SL=$(load "$dir/sliding_log.lua"); TB=$(load "$dir/token_bucket.lua")
OLD=""; [ $# -gt 0 ] && OLD=$(load "$1")
W=3600000000 # an hour in µs; limit 10,000; token bucket T = 360,000 µs
HZ=$(getconf CLK_TCK)
cpu() { awk '{print $14+$15}' "/proc/$PID/stat"; }
B() { redis-benchmark -p "$PORT" -q -n "$N" -r 10000 -c 20 -P 16 "$@" >/dev/null 2>&1; }
v_fixed() { B incrby fw:__rand_int__ 1; B expire fw:__rand_int__ 3600; }
v_sliding_window() { B evalsha "$SW" 1 sw:__rand_int__ "" 10000 $W 1; }
v_sliding_log() { B evalsha "$SL" 1 sl:__rand_int__ "" 10000 $W 1; }
v_token_bucket() { B evalsha "$TB" 1 tb:__rand_int__ "" 10000 360000 1; }
v_old_sliding_window() { B evalsha "$OLD" 1 osw:__rand_int__ "" 0 1 10000 10000 $W 1 3600; }
v_old_sliding_log() { B evalsha "$OLD" 1 osl:__rand_int__ "" 0 2 10000 10000 $W 1 3600; }
v_old_token_bucket() { B evalsha "$OLD" 1 otb:__rand_int__ "" 0 3 10000 10000 $W 1 3600; }
variants="fixed sliding_window sliding_log token_bucket"
[ -n "$OLD" ] && variants="$variants old_sliding_window old_sliding_log old_token_bucket"
echo "round variant redis_cpu_us_per_decision ratio_to_fixed"
for round in $(seq "$ROUNDS"); do
  fixed=""
  for v in $variants; do
    $R flushall >/dev/null; a=$(cpu); "v_$v"; b=$(cpu)
    us=$(echo "($b - $a) * 1000000 / $HZ / $N" | bc -l)
    [ -z "$fixed" ] && fixed=$us
    printf '%s %s %.2f %.2f\n' "$round" "$v" "$us" "$(echo "$us / $fixed" | bc -l)"
  done
done
