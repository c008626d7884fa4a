#!/usr/bin/env bash
# Batching and leases against a far Redis and a near one: tollgate-redis
# against tower-rate-limit-redis (trlr), and tollgate-redis-leased (leases on)
# against the same server without a limiter (none), all as benches/http_peers
# builds them, with Redis behind a proxy that holds every chunk DELAY_MS each
# way ("far") and on loopback ("near"). The proxy is `peer-server delay-proxy`
# (benches/http_peers/src/main.rs, `mod delay_proxy`): the test harness's
# delay line on plain threads, a reader per direction stamping each chunk with
# its due time and a writer passing chunks on in order at their time
# (std::thread::sleep), TCP_NODELAY on both sockets. A round trip through it
# takes about 2 x DELAY_MS plus the threads' wake-ups; the script measures it
# with redis-cli --latency and prints it with the results.
#
#   bash benches/far_redis.sh                        # 2 rounds of 8 s, ~12 minutes
#   ROUNDS=1 DURATION=4 WARMUP=1 bash benches/far_redis.sh   # quick trial
#
# Environment (defaults in brackets):
#   ROUNDS [2]        interleaved rounds; every run once per round
#   DURATION [8]      seconds of each measured wrk run;  WARMUP [2] before it
#   CONNS ["1 4 16"]  wrk connections (wrk -t1)
#   KEYS [1000]       client keys, chosen at random per request, all admitted
#   DELAY_MS [0.5]    the proxy's hold per chunk and direction, in ms (decimals
#                     allowed; passed to the proxy in whole microseconds)
#   MODES ["far near"]
#   OUT [a temp dir]  raw results, logs and wrk outputs
#
# Variants: tollgate-redis, trlr, tollgate-redis-leased (as tollgate-redis,
# over a RedisStore with leases on: a key in steady use is decided in
# process from tokens Redis holds for this instance, lease requests and
# reports go to Redis in the background) and none (no limiter, so no Redis:
# its far and near runs are the same server, run in both modes so that each
# row has its own baseline from the same rounds).
#
# Each run: FLUSHALL, start peer-server VARIANT open with REDIS_URL at the
# proxy (far) or at Redis (near), probe it, WARMUP s of wrk, CONFIG RESETSTAT,
# DURATION s of wrk -t1 -cN (benches/http_peers/wrk.lua), INFO commandstats.
# Nothing is pinned: the far case is bound by the round trip, not by CPU.
# Reported per run: p50 (wrk), req/s, and script calls per request
# ((EVALSHA + EVAL calls) / wrk's requests; slightly above the truth, as
# Redis also sees the requests in flight when wrk stops; for the leased
# variant, the calls its lease requests and reports took), and for the
# leased variant the lease stats its server logs when stopped (since
# start-up, warm-up included). Ratios are tollgate-redis / trlr of the
# medians over the rounds; the latency a limiter adds to an admitted request
# is p50(variant) - p50(none) of the medians, for tollgate-redis and
# tollgate-redis-leased (target for the leased one: at most 0.05 ms).
set -euo pipefail

cd "$(dirname "$0")/.."
root=$PWD
crate="$root/benches/http_peers"

rounds=${ROUNDS:-2}
duration=${DURATION:-8}
warmup=${WARMUP:-2}
conns_list=${CONNS:-1 4 16}
nkeys=${KEYS:-1000}
delay_ms=${DELAY_MS:-0.5}
modes=${MODES:-far near}
variants="tollgate-redis trlr tollgate-redis-leased none"

die() { echo "far_redis.sh: $*" >&2; exit 1; }
for tool in cargo wrk curl redis-server redis-cli ss timeout; do
  command -v "$tool" >/dev/null || die "$tool not found"
done
[[ $delay_ms =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "DELAY_MS=$delay_ms: a number of milliseconds"
delay_us=$(awk -v ms="$delay_ms" 'BEGIN { printf "%.0f", ms * 1000 }')

port_busy() { ss -Htan "sport = :$1" 2>/dev/null | grep -q .; }
free_port() {
  local p
  for _ in $(seq 200); do
    p=$((10000 + RANDOM % 20000))
    port_busy "$p" || { echo "$p"; return; }
  done
  die "no free port found"
}

echo "building peer-server (release)..." >&2
cargo build --release --quiet --manifest-path "$crate/Cargo.toml"
target_dir=$(cargo metadata --format-version 1 --no-deps --manifest-path "$crate/Cargo.toml" |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
bin="$target_dir/release/peer-server"
[ -x "$bin" ] || die "built binary not found at $bin"

out=${OUT:-$(mktemp -d -t far_redis.XXXXXX)}
mkdir -p "$out"
results="$out/results.txt"
: >"$results"
server_pid="" redis_pid="" proxy_pid=""

redis_port=$(free_port)
proxy_port=$(free_port)
cli() { timeout 10 redis-cli -h 127.0.0.1 -p "$redis_port" "$@"; }

stop_pid() {
  [ -n "$1" ] || return 0
  kill "$1" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
cleanup() {
  stop_pid "$server_pid"
  stop_pid "$proxy_pid"
  [ -z "$redis_pid" ] || kill "$redis_pid" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$out" --daemonize yes --pidfile "$out/redis.pid" --logfile "$out/redis.log" >/dev/null
for _ in $(seq 50); do cli ping >/dev/null 2>&1 && break; sleep 0.1; done
redis_pid=$(cat "$out/redis.pid")
"$bin" delay-proxy "$proxy_port" "$redis_port" "$delay_us" 2>"$out/proxy.log" &
proxy_pid=$!
for _ in $(seq 50); do port_busy "$proxy_port" && break; sleep 0.1; done
port_busy "$proxy_port" || { cat "$out/proxy.log" >&2; die "the delay proxy did not start"; }

# redis-cli --latency, stopped after 5 s: "min max avg samples" in ms.
latency() { timeout -s INT 5 redis-cli -h 127.0.0.1 -p "$1" --latency 2>/dev/null | tail -1 || true; }
far_latency=$(latency "$proxy_port")
near_latency=$(latency "$redis_port")

run_one() { # mode variant conns round
  local mode=$1 v=$2 c=$3 round=$4 tag="$1-$2-c$3-r$4" url port
  url="redis://127.0.0.1:$redis_port"
  [ "$mode" = far ] && url="redis://127.0.0.1:$proxy_port"
  port=$(free_port)
  cli flushall >/dev/null
  PORT=$port REDIS_URL=$url "$bin" "$v" open >"$out/$tag.server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 100); do port_busy "$port" && break; sleep 0.1; done
  local code
  code=$(curl -s -o /dev/null -m 5 -w '%{http_code}' -H 'x-client: probe' "http://127.0.0.1:$port/" || true)
  [ "$code" = 200 ] || { cat "$out/$tag.server.log" >&2; die "$v answered $code to a probe"; }
  local wrk=(timeout $((duration + warmup + 30)) wrk -t1 -c"$c" --timeout 2s -s "$crate/wrk.lua" "http://127.0.0.1:$port/")
  WRK_KEYS=$nkeys "${wrk[@]}" -d"${warmup}s" >/dev/null 2>&1 || die "wrk warm-up failed ($tag)"
  cli config resetstat >/dev/null
  WRK_KEYS=$nkeys "${wrk[@]}" -d"${duration}s" >"$out/$tag.wrk.txt" 2>&1 || die "wrk failed ($tag)"
  cli info commandstats | tr -d '\r' >"$out/$tag.commandstats.txt"
  stop_pid "$server_pid"
  server_pid=""
  # The lease stats line peer-server logs on SIGTERM (leased variant only).
  local leases
  leases=$(sed -n 's/^peer-server: leases: //p' "$out/$tag.server.log" |
    awk '{ for (i = 1; i <= NF; i++) { split($i, p, "="); s[p[1]] = p[2] }
      printf "  leases since start: %d local decisions, %d lease requests", s["local_decisions"], s["requests"] }')
  local line kv r_requests=0 r_duration_us=1 r_non2xx=0 r_p50_us=0
  line=$(grep '^RESULT ' "$out/$tag.wrk.txt") || die "no RESULT line ($tag)"
  for kv in ${line#RESULT }; do
    case ${kv%%=*} in requests | duration_us | non2xx | p50_us) local "r_${kv%%=*}=${kv#*=}" ;; esac
  done
  local scripts
  scripts=$(awk -F'[:,=]' '/^cmdstat_(evalsha|eval):/ { s += $3 } END { print s + 0 }' "$out/$tag.commandstats.txt")
  local rps per_req
  rps=$(awk -v n="$r_requests" -v us="$r_duration_us" 'BEGIN { printf "%.0f", n / (us / 1e6) }')
  per_req=$(awk -v s="$scripts" -v n="$r_requests" 'BEGIN { printf "%.3f", (n > 0) ? s / n : 0 }')
  echo "$mode $c $v $round $r_p50_us $rps $per_req $r_non2xx" >>"$results"
  printf '  %-4s c=%-3s %-21s round %d: p50 %7.3f ms  %7s req/s  %s script calls/req  non-2xx %s%s\n' \
    "$mode" "$c" "$v" "$round" "$(awk -v u="$r_p50_us" 'BEGIN { print u / 1000 }')" "$rps" "$per_req" "$r_non2xx" "$leases" >&2
}

runs=()
for m in $modes; do for c in $conns_list; do for v in $variants; do runs+=("$m $c $v"); done; done; done
echo "far_redis: ${#runs[@]} runs x $rounds rounds, wrk -t1 ${duration}s (+${warmup}s warm-up), $nkeys keys; raw data in $out" >&2
load_start=$(cut -d' ' -f1 /proc/loadavg)
for round in $(seq "$rounds"); do
  n=${#runs[@]}
  for i in $(seq 0 $((n - 1))); do
    # Rotated each round, so slow drifts in machine load hit every run alike.
    read -r m c v <<<"${runs[$(((i + round - 1) % n))]}"
    run_one "$m" "$v" "$c" "$round"
  done
done
load_end=$(cut -d' ' -f1 /proc/loadavg)

echo
echo "far_redis: $rounds rounds, wrk -t1 -d${duration}s, $nkeys keys all admitted, $(nproc) cores, nothing pinned"
echo "round trip by redis-cli --latency (min max avg samples, ms): far (proxy, ${delay_ms} ms a chunk each way) $far_latency; near $near_latency"
echo "1-minute load average: $load_start before, $load_end after"
awk '
  function median(list,    n, xs, i, j, x) {
    n = split(list, xs, " ")
    for (i = 2; i <= n; i++) { x = xs[i] + 0; j = i - 1; while (j > 0 && xs[j] + 0 > x) { xs[j + 1] = xs[j]; j-- } xs[j + 1] = x }
    return (n % 2) ? xs[(n + 1) / 2] : (xs[n / 2] + xs[n / 2 + 1]) / 2
  }
  {
    k = $1 " " $2 " " $3
    if (!(($1 " " $2) in seen)) { seen[$1 " " $2] = 1; order[++n] = $1 " " $2 }
    p50[k] = p50[k] " " $5; rps[k] = rps[k] " " $6; per[k] = per[k] " " $7
  }
  END {
    printf "\n%-4s %5s | %-28s | %-28s | %s\n", "", "", "tollgate-redis", "trlr", "tollgate / trlr"
    printf "%-4s %5s | %8s %8s %10s | %8s %8s %10s | %7s %7s\n", "mode", "conns", "p50 ms", "req/s", "calls/req", "p50 ms", "req/s", "calls/req", "p50", "req/s"
    for (i = 1; i <= n; i++) {
      split(order[i], mc, " "); t = order[i] " tollgate-redis"; r = order[i] " trlr"
      tp = median(p50[t]) / 1000; rp = median(p50[r]) / 1000; tr = median(rps[t]); rr = median(rps[r])
      printf "%-4s %5s | %8.2f %8.0f %10.3f | %8.2f %8.0f %10.3f | %7.2f %7.2f\n", mc[1], mc[2], tp, tr, median(per[t]), rp, rr, median(per[r]), (rp > 0) ? tp / rp : 0, (rr > 0) ? tr / rr : 0
    }

    printf "\nlatency a limiter adds to an admitted request: p50(variant) - p50(none), ms (target for leases: <= 0.05 ms)\n"
    printf "%-4s %5s | %-28s | %-17s | %s\n", "", "", "tollgate-redis-leased", "none", "added p50, ms"
    printf "%-4s %5s | %8s %8s %10s | %8s %8s | %14s %14s\n", "mode", "conns", "p50 ms", "req/s", "calls/req", "p50 ms", "req/s", "tollgate-redis", "leased"
    for (i = 1; i <= n; i++) {
      split(order[i], mc, " "); l = order[i] " tollgate-redis-leased"; z = order[i] " none"; t = order[i] " tollgate-redis"
      lp = median(p50[l]) / 1000; zp = median(p50[z]) / 1000; tp = median(p50[t]) / 1000
      printf "%-4s %5s | %8.3f %8.0f %10.3f | %8.3f %8.0f | %14.3f %14.3f\n", mc[1], mc[2], lp, median(rps[l]), median(per[l]), zp, median(rps[z]), tp - zp, lp - zp
    }
    printf "(medians over the rounds; every run in %s)\n", FILENAME
  }' "$results"
