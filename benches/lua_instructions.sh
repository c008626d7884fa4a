#!/usr/bin/env bash
# What one decision costs Redis, counted in instructions instead of timed:
# redis-server runs under valgrind's callgrind, and every script is driven by
# redis-benchmark twice (N1 and N2 calls); the difference of the two runs'
# instruction totals, divided by the decisions in between, is what Redis
# executes in user space per decision: reading and parsing the command, the
# script, its GET and SET, the reply, the event loop. Start-up and shut-down
# cancel out. Unlike CPU time on a shared 2-core VM (which moves by tens of
# percent between runs, see BENCHMARKS.md), these counts repeat to within a
# fraction of a percent, so a change to the script can be priced exactly.
# They leave out the kernel (socket reads and writes, about 10-15% of Redis's
# CPU under load in `perf`) and cache misses, so they are a model of CPU time,
# not a measure of it: benches/http_peers.sh measures the real thing.
#
#   bash benches/lua_instructions.sh                  # about 4 minutes
#   BASE=daa40ef bash benches/lua_instructions.sh     # also a past commit's script
#
# Scripts, all at a quota of 10 per second with a burst of 10, cost 1, over
# 10 000 random client keys (redis-benchmark -r 10000):
#   tollgate/1    lua/token_bucket.lua, one decision per call, 16-deep pipelines
#                 (in the compact form RedisStore sends for checks of one quota;
#                 COMPACT=0 for the long form)
#   tollgate/16   the same script deciding 16 checks per call, as RedisStore's
#                 batching does under load (16 x 10 000 keys)
#   base/1, base/16   the same for the script at commit $BASE, if set
#   trlr          tower-rate-limit-redis 1.0's script (scripts/rate_limit.lua,
#                 read from cargo's registry: the http_peers package depends on
#                 it), capacity 10, emission interval 100 ms; 16-deep pipelines
#   gcra_float, hash_bucket   benches/peers/ (see benches/lua_peers.sh)
# Needs valgrind (apt-get install -y valgrind), redis-server, cargo.
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in valgrind callgrind_annotate redis-server redis-cli redis-benchmark cargo; do
  command -v "$tool" >/dev/null || { echo "$tool not found (apt-get install -y valgrind redis-server)" >&2; exit 1; }
done
n1=${N1:-200}
n2=${N2:-1200}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

manifest=$(cargo metadata --format-version 1 --manifest-path benches/http_peers/Cargo.toml |
  python3 -c 'import json,sys; print(next(p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"] == "tower-rate-limit-redis"))')
trlr="$(dirname "$manifest")/scripts/rate_limit.lua"
[ -f "$trlr" ] || { echo "tower-rate-limit-redis's script not found at $trlr" >&2; exit 1; }
cp lua/token_bucket.lua "$work/tollgate.lua"
if [ -n "${BASE:-}" ]; then git show "$BASE:lua/token_bucket.lua" >"$work/base.lua"; fi

# total SCRIPT CALLS PER-CALL ARGS...: callgrind's instruction total for one
# server that runs CALLS calls of SCRIPT (PER-CALL pipelined calls per batch).
total() {
  local script=$1 calls=$2 pipeline=$3 dir sock pid sha ir
  shift 3
  dir=$(mktemp -d -p "$work")
  sock="$dir/redis.sock"
  valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" redis-server --port 0 --unixsocket "$sock" \
    --save "" --appendonly no --dir "$dir" >/dev/null 2>"$dir/valgrind.log" &
  pid=$!
  for _ in $(seq 300); do redis-cli -s "$sock" ping >/dev/null 2>&1 && break; sleep 0.1; done
  sha=$(redis-cli -s "$sock" script load "$(cat "$script")")
  redis-benchmark -s "$sock" -n "$calls" -c 8 -P "$pipeline" -r 10000 -q EVALSHA "$sha" "$@" >/dev/null 2>&1
  local done_calls
  done_calls=$(redis-cli -s "$sock" info commandstats | tr -d '\r' | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),.*failed_calls=\([0-9]*\).*/\1 \2/p')
  [ "${done_calls% *}" = "$calls" ] && [ "${done_calls#* }" = 0 ] ||
    { echo "$script: expected $calls calls without errors, Redis counted: $done_calls" >&2; exit 1; }
  redis-cli -s "$sock" shutdown nosave >/dev/null 2>&1 || true
  wait "$pid" || true
  ir=$(callgrind_annotate "$dir/cg.out" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1; exit }' || true)
  [ -n "$ir" ] || { echo "no callgrind total for $script" >&2; exit 1; }
  echo "$ir"
}

# per_decision NAME SCRIPT DECISIONS-PER-CALL PIPELINE ARGS...
declare -A result
per_decision() {
  local name=$1 script=$2 per=$3 pipeline=$4 a b
  shift 4
  # The same number of decisions for every script: a batch of 16 takes 16x fewer calls.
  local c1=$((n1 * 16 / per)) c2=$((n2 * 16 / per))
  a=$(total "$script" "$c1" "$pipeline" "$@")
  b=$(total "$script" "$c2" "$pipeline" "$@")
  result[$name]=$(((b - a) / ((c2 - c1) * per)))
  printf '  %-12s %8d instructions per decision\n' "$name" "${result[$name]}"
}

ours() { # name script batch
  local keys=() decisions=() count=$3
  for i in $(seq "$3"); do
    keys+=("tollgate:{u$i:__rand_int__}:10/1s:10")
    decisions+=(1 1 1 0)
  done
  # As RedisStore sends checks of one quota: the compact form (-D, then one
  # cost per decision), where the script has one (COMPACT=0: the long form).
  if [ "${COMPACT:-1}" = 1 ] && grep -q 'if nd < 0 then' "$2"; then
    count=-$3
    decisions=()
    for _ in $(seq "$3"); do decisions+=(1); done
  fi
  local pipeline=16
  [ "$3" -gt 1 ] && pipeline=4
  per_decision "$1" "$2" "$3" "$pipeline" "$3" "${keys[@]}" "" 1 1000000 1 100000 "$count" "${decisions[@]}"
}

echo "redis-server user-space instructions per decision (callgrind; runs of $n1 and $n2 x 16 decisions):"
ours tollgate/1 "$work/tollgate.lua" 1
ours tollgate/16 "$work/tollgate.lua" 16
if [ -n "${BASE:-}" ]; then
  ours "base/1" "$work/base.lua" 1
  ours "base/16" "$work/base.lua" 16
fi
per_decision trlr "$trlr" 1 16 1 'trlr:{user:__rand_int__}' 10 100
per_decision gcra_float benches/peers/gcra_float.lua 1 16 1 'rate:{user:__rand_int__}' 10 10 1 1
per_decision hash_bucket benches/peers/hash_bucket.lua 1 16 1 'hash:{user:__rand_int__}' 10 10 1

ratio() { awk -v a="${result[$1]}" -v b="${result[$2]}" 'BEGIN { printf "%.2f", a / b }'; }
echo "ratios: tollgate/16 / trlr = $(ratio tollgate/16 trlr), tollgate/1 / trlr = $(ratio tollgate/1 trlr)," \
  "tollgate/1 / gcra_float = $(ratio tollgate/1 gcra_float), tollgate/1 / hash_bucket = $(ratio tollgate/1 hash_bucket)"
if [ -n "${BASE:-}" ]; then
  echo "against $BASE: tollgate/1 / base/1 = $(ratio tollgate/1 base/1), tollgate/16 / base/16 = $(ratio tollgate/16 base/16)"
fi
