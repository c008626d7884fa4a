#!/usr/bin/env bash
# Redis time per call of tollgate's script against two common peer scripts
# (benches/peers/), measured in one run on one redis-server of its own.
#
#   bash benches/lua_peers.sh            # 5 interleaved rounds, about 1 minute
#   ROUNDS=9 N=300000 bash benches/lua_peers.sh
#   COMPACT=0 bash benches/lua_peers.sh  # tollgate's long form of the arguments
#
# Each round runs redis-benchmark (50 clients, 16-deep pipelines, 10 000 random
# client keys, a 10/s quota) once per script and reads `usec_per_call` of
# EVALSHA from INFO commandstats. Rounds are interleaved so that load from other
# processes hits every script alike; the medians and their ratios are printed.
# With taskset, redis-server and redis-benchmark are pinned to different cores:
# otherwise they fight over the CPU and usec_per_call (wall time) swings ±50%.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=${ROUNDS:-5}
requests=${N:-200000}
for tool in redis-server redis-cli redis-benchmark; do
  command -v "$tool" >/dev/null || { echo "$tool not found: apt-get install -y redis-server" >&2; exit 1; }
done

pin_server=() pin_client=()
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
  pin_server=(taskset -c 0) pin_client=(taskset -c 1)
fi

dir=$(mktemp -d)
sock="$dir/redis.sock"
"${pin_server[@]}" redis-server --port 0 --unixsocket "$sock" --save "" --appendonly no --dir "$dir" --daemonize yes \
  --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" >/dev/null
trap 'redis-cli -s "$sock" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
for _ in $(seq 50); do redis-cli -s "$sock" ping >/dev/null 2>&1 && break; sleep 0.1; done

cli() { redis-cli -s "$sock" "$@"; }
ours=$(cli script load "$(cat lua/token_bucket.lua)")
gcra=$(cli script load "$(cat benches/peers/gcra_float.lua)")
hash=$(cli script load "$(cat benches/peers/hash_bucket.lua)")

# One script's usec_per_call for one round.
run() {
  cli flushall >/dev/null
  cli config resetstat >/dev/null
  "${pin_client[@]}" redis-benchmark -s "$sock" -n "$requests" -c 50 -P 16 -r 10000 -q "$@" >/dev/null 2>&1
  cli info commandstats | sed -n 's/^cmdstat_evalsha:.*usec_per_call=\([0-9.]*\).*/\1/p'
}

load() { cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown; }
load_start=$(load)
results="$dir/results"
decision=(-1 1)
[ "${COMPACT:-1}" = 1 ] || decision=(1 1 1 1 0)
for round in $(seq "$rounds"); do
  # tollgate: Redis TIME; one quota: full 10 x 100000 units, 1/100000 token per
  # microsecond (10/s); one decision of cost 1 on quota 1, no debt, in the
  # compact form RedisStore sends for it (-1, then the cost; COMPACT=0: the
  # long form, 1 decision of 1 quota: cost 1, quota 1, debt 0)
  echo "tollgate $(run EVALSHA "$ours" 1 'tollgate:{user:__rand_int__}:10/1s:10' "" 1 1000000 1 100000 "${decision[@]}")" >>"$results"
  # GCRA: burst 10, rate 10 per 1 s, cost 1
  echo "gcra_float $(run EVALSHA "$gcra" 1 'rate:{user:__rand_int__}' 10 10 1 1)" >>"$results"
  # hash bucket: capacity 10, 10 tokens/s, cost 1
  echo "hash_bucket $(run EVALSHA "$hash" 1 'hash:{user:__rand_int__}' 10 10 1)" >>"$results"
  echo "round $round of $rounds done" >&2
done

echo "load average at start: $load_start; at end: $(load)"
echo "Redis usec_per_call of EVALSHA, median of $rounds interleaved rounds ($requests calls each, -c 50 -P 16${pin_server:+, pinned}):"
awk '
  { v[$1] = v[$1] " " $2 }
  END {
    for (name in v) {
      n = split(v[name], xs, " ")
      # insertion sort, then the median
      for (i = 2; i <= n; i++) { x = xs[i]; j = i - 1; while (j > 0 && xs[j] > x) { xs[j + 1] = xs[j]; j-- } xs[j + 1] = x }
      m = (n % 2) ? xs[(n + 1) / 2] : (xs[n / 2] + xs[n / 2 + 1]) / 2
      med[name] = m
      printf "  %-12s %6.2f us   (all: %s)\n", name, m, v[name]
    }
    printf "ratios: tollgate/gcra_float = %.2f, tollgate/hash_bucket = %.2f\n", med["tollgate"] / med["gcra_float"], med["tollgate"] / med["hash_bucket"]
  }' "$results"
