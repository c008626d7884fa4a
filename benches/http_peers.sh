#!/usr/bin/env bash
# HTTP throughput of tollgate against peer limiters, measured in one run on one
# machine, reported as ratios (benches/http_peers/README.md describes each peer's
# algorithm and configuration).
#
#   bash benches/http_peers.sh                          # 3 rounds of 8 s, ~8 minutes
#   ROUNDS=5 DURATION=15 bash benches/http_peers.sh
#   ROUNDS=2 DURATION=4 WARMUP=1 bash benches/http_peers.sh   # quick trial
#
# Environment (defaults in brackets):
#   ROUNDS [3]         interleaved rounds; every variant runs once per round
#   DURATION [8]       seconds of each measured wrk run
#   WARMUP [2]         seconds of wrk before each measured run (not measured)
#   CONNS [64]         wrk connections;  THREADS [2] wrk threads
#   KEYS [10000]       client keys in the open case (x-client: c1..cN, random)
#   VARIANTS           open case  ["none governor trlr tollgate-memory tollgate-memory-bare
#                      tollgate-redis tollgate-redis-bare tollgate-redis-leased
#                      tollgate-redis-leased-bare"]; also governor-headers
#   HOT_VARIANTS       hot case   ["governor trlr tollgate-memory tollgate-redis"] ("" skips it)
#   PORT, REDIS_PORT   fixed ports, failing if busy (default: free ports below the
#                      ephemeral range are picked, and picked again if taken)
#   PIN [1]            1: pin as below; 0: let the scheduler place everything
#   OUT [a temp dir]   where the raw results, logs and wrk outputs are kept
#   CARGO_TARGET_DIR   respected by the build (as cargo itself does)
#
# Cases:
#   open: every request admitted (1 000 000/s per key, or the largest quota a
#         limiter can express, see the README); 10 000 keys chosen at random, so
#         each request costs one decision that admits.
#   hot:  one key ("hot") flooded, quota burst 10 refilled 1 per second: nearly
#         every request is denied (429). Shows the cost of a denial.
#   none: the same server without a limiter, the ceiling.
#   *-bare: tollgate without rate limit headers (HeaderStyle::None). The peers
#         send none on admitted responses, so the -bare variants compare the
#         limiters alone; the others include the cost of tollgate's headers.
#   tollgate-redis-leased[-bare]: as tollgate-redis[-bare], over a RedisStore
#         with leases on (RedisStore::builder().url(..).leases(true), default
#         lease period and keys): a key in steady use is decided in process
#         from tokens Redis holds for this instance, and costs Redis about one
#         call per lease period instead of one per request. On SIGTERM the
#         server logs its lease stats since start-up (warm-up and probe
#         included); the run's line shows local decisions and lease requests.
#         A key is leased from its fourth check on (leases wait for demand),
#         so the warm-up must give every key four: at 10 000 keys and about
#         60 000 req/s, WARMUP=1 leaves about one key in six unleased when
#         the measured run starts, and those go to Redis in it (leased /
#         memory 0.78x with WARMUP=1, 0.91x with WARMUP=4, at 6ff1fb5).
#         The default WARMUP=2 gives each key about 12.
#   governor-headers: tower_governor with use_headers() (x-ratelimit-limit and
#         x-ratelimit-remaining on admitted responses), the peer of
#         tollgate-memory's headers.
#
# Each run: start peer-server (axum 0.8, tokio multi-thread runtime with 2
# workers for every variant; Redis FLUSHALL first for the Redis variants),
# check it answers 200, WARMUP seconds of wrk, then (Redis variants) CONFIG
# RESETSTAT and INFO cpu, DURATION seconds of wrk (-t THREADS -c CONNS,
# benches/http_peers/wrk.lua), then INFO commandstats and INFO cpu, then stop
# the server. Rounds are interleaved and
# the order of the variants rotates each round, so slow drifts in machine load
# hit every variant alike; medians are reported with each variant's min–max,
# and the ratios of the pairs the targets compare also round by round (each
# round's two runs faced about the same load), with their median.
#
# Measures per run: req/s (all responses, 429s included), non-2xx responses
# (wrk counts statuses above 399), latency p50/p99 (wrk's done() hook), and for
# the Redis-backed variants:
#   - Redis commands per HTTP request: commands the *clients* sent. Redis 7's
#     commandstats (and total_commands_processed) also count every command a
#     Lua script runs inside Redis, without telling them apart. Both Redis
#     limiters' scripts run only TIME, GET and SET (read from their Lua sources:
#     lua/token_bucket.lua and tower-rate-limit-redis's scripts/rate_limit.lua),
#     and neither client sends those at top level (EVALSHA, SCRIPT LOAD on
#     NOSCRIPT, connection set-up only). So client commands = all calls minus
#     time/get/set (script-internal) minus info/config (this harness). A check
#     guards that assumption: every script run calls TIME exactly once, so
#     time calls must equal evalsha+eval calls minus their failed calls
#     (NOSCRIPT); the output flags any run where they differ. Expect slightly
#     above 1.000 for one call per request: Redis also sees the up to CONNS
#     requests in flight when wrk stops, which wrk does not count. The leased
#     variants run the same script (lease requests and reports are decisions
#     of it, batched into EVALSHA calls like checks), so the same count and
#     check apply; there it counts the EVALSHA calls the leases still cost.
#   - Redis µs per script call: usec_per_call of EVALSHA (Redis-side time
#     inside the command, script included). It is wall time: with Redis sharing
#     core 0 with the server, a preempted call counts its wait too, so prefer
#     the CPU figure below (and benches/lua_peers.sh for the script alone).
#   - Redis CPU µs per request: delta of used_cpu_user + used_cpu_sys of the
#     redis-server process over the measured run, divided by wrk's requests.
#
# Pinning (PIN=1, needs taskset and 2+ cores): peer-server AND redis-server on
# core 0, wrk on core 1. The load generator then never competes with what is
# measured, and everything a limiter costs per request, in process or in
# Redis, comes out of the same single core: req/s compares the total CPU cost
# per request, and a Redis-backed limiter cannot look fast by using a second,
# idle core for Redis. (With Redis on another machine, app throughput would be
# closer to the memory variants, and the Redis cost would show as Redis CPU
# per request, reported separately.) `none` shows where wrk on one core, or the
# server itself, caps the numbers. PIN=0 lets the scheduler place everything.
set -euo pipefail

start_dir=$PWD
cd "$(dirname "$0")/.."
root=$PWD
crate="$root/benches/http_peers"

rounds=${ROUNDS:-3}
duration=${DURATION:-8}
warmup=${WARMUP:-2}
conns=${CONNS:-64}
threads=${THREADS:-2}
nkeys=${KEYS:-10000}
variants=${VARIANTS-none governor trlr tollgate-memory tollgate-memory-bare tollgate-redis tollgate-redis-bare tollgate-redis-leased tollgate-redis-leased-bare}
hot_variants=${HOT_VARIANTS-governor trlr tollgate-memory tollgate-redis}
pin=${PIN:-1}

die() { echo "http_peers.sh: $*" >&2; exit 1; }
for tool in cargo wrk curl redis-server redis-cli ss timeout; do
  command -v "$tool" >/dev/null || die "$tool not found (redis: apt-get install -y redis-server; wrk: apt-get install -y wrk)"
done
for n in "$rounds" "$duration" "$warmup" "$conns" "$threads" "$nkeys"; do
  [[ $n =~ ^[0-9]+$ && $n -gt 0 ]] || die "ROUNDS, DURATION, WARMUP, CONNS, THREADS and KEYS must be positive integers"
done
for v in $variants $hot_variants; do
  case $v in
    none | governor | governor-headers | trlr | tollgate-memory | tollgate-memory-bare | tollgate-redis | tollgate-redis-bare) ;;
    tollgate-redis-leased | tollgate-redis-leased-bare) ;;
    *) die "unknown variant $v" ;;
  esac
done

pin_server=() pin_client=() placement="unpinned"
if [ "$pin" = 1 ] && command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
  pin_server=(taskset -c 0) pin_client=(taskset -c 1)
  placement="server+redis pinned to core 0, wrk to core 1"
fi

# --- ports -----------------------------------------------------------------
# Picked below the ephemeral range, so no outgoing connection (wrk's, other
# tests') holds them; a port counts as busy if any socket, listening or not, uses it.
port_busy() { ss -Htan "sport = :$1" 2>/dev/null | grep -q .; }
ephemeral_lo=$(awk '{ print $1 }' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
[ "$ephemeral_lo" -gt 12000 ] 2>/dev/null || ephemeral_lo=32768
free_port() {
  local p
  for _ in $(seq 200); do
    p=$((10000 + RANDOM % (ephemeral_lo - 10000)))
    if [ "$p" = "${port:-}" ] || [ "$p" = "${redis_port:-}" ]; then continue; fi
    port_busy "$p" || { echo "$p"; return; }
  done
  die "no free port found"
}
if [ -n "${PORT:-}" ]; then
  port_busy "$PORT" && die "PORT $PORT is busy"
  port=$PORT
else
  port=$(free_port)
fi
if [ -n "${REDIS_PORT:-}" ]; then
  port_busy "$REDIS_PORT" && die "REDIS_PORT $REDIS_PORT is busy"
  redis_port=$REDIS_PORT
else
  redis_port=$(free_port)
fi

# --- build -------------------------------------------------------------------
# A relative CARGO_TARGET_DIR means relative to where the script was started.
if [ -n "${CARGO_TARGET_DIR:-}" ] && [[ $CARGO_TARGET_DIR != /* ]]; then
  export CARGO_TARGET_DIR="$start_dir/$CARGO_TARGET_DIR"
fi
echo "building peer-server (release)..." >&2
cargo build --release --quiet --manifest-path "$crate/Cargo.toml"
target_dir=$(cargo metadata --format-version 1 --no-deps --manifest-path "$crate/Cargo.toml" |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
bin="$target_dir/release/peer-server"
[ -x "$bin" ] || die "built binary not found at $bin"

# --- scratch dir, Redis, clean-up --------------------------------------------
out=${OUT:-$(mktemp -d -t http_peers.XXXXXX)}
mkdir -p "$out"
results="$out/results.txt"
: >"$results"
server_pid=""
redis_pid=""

cli() { timeout 10 redis-cli -h 127.0.0.1 -p "$redis_port" "$@"; }

stop_server() {
  [ -n "$server_pid" ] || return 0
  if kill -0 "$server_pid" 2>/dev/null; then
    kill "$server_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$server_pid" 2>/dev/null || true
  fi
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
}
cleanup() {
  stop_server
  if [ -n "$redis_pid" ]; then
    # SIGTERM: redis-server exits without saving (persistence is off).
    kill "$redis_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$redis_pid" 2>/dev/null || break; sleep 0.1; done
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Ours only if the server on the port is the process our pidfile names: never
# talk to (let alone shut down) a redis-server that someone else started.
start_redis() {
  rm -f "$out/redis.pid"
  : >"$out/redis.log"
  "${pin_server[@]}" redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$out" --daemonize yes --pidfile "$out/redis.pid" --logfile "$out/redis.log" >/dev/null
  local pid
  for _ in $(seq 50); do
    pid=$(cat "$out/redis.pid" 2>/dev/null || true)
    if [ -n "$pid" ] && [ "$(cli info server 2>/dev/null | tr -d '\r' | sed -n 's/^process_id://p')" = "$pid" ]; then
      redis_pid=$pid
      return 0
    fi
    if grep -q aborting "$out/redis.log" 2>/dev/null; then return 1; fi
    sleep 0.1
  done
  return 1
}
# An automatically picked port can be taken between the check and the bind
# (other tests pick ports too): then try another one, a few times.
for attempt in 1 2 3 4 5; do
  if start_redis; then break; fi
  if [ -n "${REDIS_PORT:-}" ] || [ "$attempt" = 5 ]; then
    die "redis-server did not start on port $redis_port (see $out/redis.log)"
  fi
  redis_port=$(free_port)
done
redis_url="redis://127.0.0.1:$redis_port"

# --- one run -----------------------------------------------------------------
is_redis() { [ "$1" = trlr ] || [ "$1" = tollgate-redis ] || [ "$1" = tollgate-redis-bare ] || is_leased "$1"; }
is_leased() { [ "$1" = tollgate-redis-leased ] || [ "$1" = tollgate-redis-leased-bare ]; }

# cmdstat lines and two INFO cpu snapshots -> "cmds_per_req usec_per_call cpu_us_per_req check"
redis_figures() { # stats_file cpu_before cpu_after requests
  awk -v cpu0="$2" -v cpu1="$3" -v n="$4" '
    /^cmdstat_/ {
      name = $1; sub(/^cmdstat_/, "", name); sub(/:.*/, "", name)
      line = $0; sub(/^[^:]*:/, "", line)
      split(line, kv, ",")
      for (i in kv) { split(kv[i], p, "="); f[p[1]] = p[2] }
      calls[name] = f["calls"]; failed[name] = f["failed_calls"]; upc[name] = f["usec_per_call"]
      if (name == "time" || name == "get" || name == "set") internal += f["calls"]
      else if (name == "info" || name ~ /^config/) harness += f["calls"]
      else top += f["calls"]
    }
    END {
      scripts = calls["evalsha"] + calls["eval"] - failed["evalsha"] - failed["eval"]
      check = (calls["time"] + 0 == scripts) ? "ok" : sprintf("time=%d,scripts=%d", calls["time"], scripts)
      printf "%.4f %.2f %.2f %s\n", top / n, upc["evalsha"] + 0, (cpu1 - cpu0) * 1e6 / n, check
    }' "$1"
}
cpu_seconds() { cli info cpu | tr -d '\r' | awk -F: '/^used_cpu_(user|sys):/ { s += $2 } END { printf "%.6f", s }'; }

run_one() { # case variant round
  local case=$1 v=$2 round=$3 keys=$nkeys tag="$1-$2-r$3"
  [ "$case" = hot ] && keys=1
  for _ in $(seq 50); do port_busy "$port" || break; sleep 0.1; done
  if port_busy "$port"; then
    [ -z "${PORT:-}" ] || die "PORT $port is busy (another process took it?)"
    port=$(free_port)
  fi
  if is_redis "$v"; then cli flushall >/dev/null; fi

  PORT=$port REDIS_URL=$redis_url "${pin_server[@]}" "$bin" "$v" "$case" >"$out/$tag.server.log" 2>&1 &
  server_pid=$!
  local up=""
  for _ in $(seq 100); do
    kill -0 "$server_pid" 2>/dev/null || break
    port_busy "$port" && { up=1; break; }
    sleep 0.1
  done
  if [ -z "$up" ] || ! kill -0 "$server_pid" 2>/dev/null; then
    cat "$out/$tag.server.log" >&2
    die "$v did not start listening on $port within 10 s"
  fi
  local code
  code=$(curl -s -o /dev/null -m 5 -w '%{http_code}' -H 'x-client: probe' "http://127.0.0.1:$port/" || true)
  [ "$code" = 200 ] || { cat "$out/$tag.server.log" >&2; die "$v ($case) answered $code to a probe, not 200"; }

  local wrk=("${pin_client[@]}" timeout $((duration + warmup + 30)) wrk -t"$threads" -c"$conns" --timeout 2s
    -s "$crate/wrk.lua" "http://127.0.0.1:$port/")
  WRK_KEYS=$keys "${wrk[@]}" -d"${warmup}s" >/dev/null 2>&1 || die "wrk warm-up failed for $v ($case)"

  local cpu0=0
  if is_redis "$v"; then
    cli config resetstat >/dev/null
    cpu0=$(cpu_seconds)
  fi
  WRK_KEYS=$keys "${wrk[@]}" -d"${duration}s" >"$out/$tag.wrk.txt" 2>&1 || die "wrk failed for $v ($case): see $out/$tag.wrk.txt"
  local redis="- - - -" shown=""
  local line
  line=$(grep '^RESULT ' "$out/$tag.wrk.txt") || die "no RESULT line from wrk for $v ($case)"
  # RESULT requests=N duration_us=N non2xx=N ... -> shell variables r_requests, r_duration_us, ...
  # shellcheck disable=SC2034 # all set by the loop below, not all used
  local r_requests r_duration_us r_non2xx r_connect r_read r_write r_timeout r_p50_us r_p90_us r_p99_us r_max_us kv
  for kv in ${line#RESULT }; do local "r_${kv%%=*}=${kv#*=}"; done
  if is_redis "$v"; then
    cli info commandstats | tr -d '\r' >"$out/$tag.commandstats.txt"
    local cpu1
    cpu1=$(cpu_seconds)
    redis=$(redis_figures "$out/$tag.commandstats.txt" "$cpu0" "$cpu1" "$r_requests")
    local a b c d
    read -r a b c d <<<"$redis"
    shown="  redis: $a cmds/req, $b us/EVALSHA, $c CPU us/req, check $d"
  fi
  kill -0 "$server_pid" 2>/dev/null || { cat "$out/$tag.server.log" >&2; die "$v ($case) died during the run"; }
  stop_server
  if is_leased "$v"; then
    # The stats line the server logs on SIGTERM: since start-up, warm-up included.
    local leases
    leases=$(sed -n 's/^peer-server: leases: //p' "$out/$tag.server.log")
    if [ -n "$leases" ]; then
      shown="$shown$(awk '{ for (i = 1; i <= NF; i++) { split($i, p, "="); s[p[1]] = p[2] }
        printf "  leases since start: %d local decisions, %d lease requests", s["local_decisions"], s["requests"] }' <<<"$leases")"
    else
      shown="$shown  (no lease stats in $out/$tag.server.log)"
    fi
  fi
  local errors=$((r_connect + r_read + r_write + r_timeout))
  local rps
  rps=$(awk -v n="$r_requests" -v us="$r_duration_us" 'BEGIN { printf "%.0f", n / (us / 1e6) }')
  # case variant round rps non2xx socket_errors p50_us p99_us cmds/req usec/call cpu_us/req check
  echo "$case $v $round $rps $r_non2xx $errors $r_p50_us $r_p99_us $redis" >>"$results"
  printf '  %-4s %-26s round %d: %8s req/s  non-2xx %-8s p99 %6.2f ms%s\n' \
    "$case" "$v" "$round" "$rps" "$r_non2xx" "$(awk -v u="$r_p99_us" 'BEGIN { print u / 1000 }')" "$shown" >&2
}

# --- the rounds ----------------------------------------------------------------
# Every (case, variant) pair, rotated by one each round.
pairs=()
for v in $variants; do pairs+=("open $v"); done
for v in $hot_variants; do pairs+=("hot $v"); done
[ ${#pairs[@]} -gt 0 ] || die "nothing to run"
per_run=$((duration + warmup + 2))
echo "http_peers: ${#pairs[@]} runs x $rounds rounds, about $((${#pairs[@]} * rounds * per_run / 60 + 1)) min;" \
  "wrk -t$threads -c$conns ${duration}s (+${warmup}s warm-up), $placement; raw data in $out" >&2
load_start=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo '?')
for round in $(seq "$rounds"); do
  n=${#pairs[@]}
  for i in $(seq 0 $((n - 1))); do
    read -r c v <<<"${pairs[$(((i + round - 1) % n))]}"
    run_one "$c" "$v" "$round"
  done
done

# --- report --------------------------------------------------------------------
load_end=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo '?')
echo
echo "tollgate HTTP peers: $rounds interleaved rounds, wrk -t$threads -c$conns -d${duration}s, $nkeys keys (open) / 1 key (hot)," \
  "$(nproc) cores, $placement"
echo "1-minute load average: $load_start before the runs, $load_end after (this benchmark alone keeps it near $(nproc));" \
  "well above that, other work shared the machine and the figures are noise"
awk -v order="$variants" -v hot_order="$hot_variants" '
  function median(list,    n, xs, i, j, x) {
    n = split(list, xs, " ")
    for (i = 2; i <= n; i++) { x = xs[i] + 0; j = i - 1; while (j > 0 && xs[j] + 0 > x) { xs[j + 1] = xs[j]; j-- } xs[j + 1] = x }
    return (n % 2) ? xs[(n + 1) / 2] : (xs[n / 2] + xs[n / 2 + 1]) / 2
  }
  function minmax(list,    n, xs, i, lo, hi) {
    n = split(list, xs, " "); lo = hi = xs[1] + 0
    for (i = 2; i <= n; i++) { if (xs[i] + 0 < lo) lo = xs[i] + 0; if (xs[i] + 0 > hi) hi = xs[i] + 0 }
    MIN = lo; MAX = hi
  }
  {
    k = $1 " " $2
    rps[k] = rps[k] " " $4; non2xx[k] = non2xx[k] " " $5; errs[k] = errs[k] " " $6
    p99[k] = p99[k] " " $8; p50[k] = p50[k] " " $7
    if ($9 != "-") { cmds[k] = cmds[k] " " $9; upc[k] = upc[k] " " $10; cpu[k] = cpu[k] " " $11 }
    if ($12 != "-" && $12 != "ok") bad[k] = bad[k] " " $12
  }
  function row(c, v,    k, m, spread) {
    k = c " " v
    if (!(k in rps)) return
    m = median(rps[k]); minmax(rps[k]); spread = (m > 0) ? (MAX - MIN) / m * 100 : 0
    MED[k] = m; SPREAD[k] = spread
    printf "%-4s %-26s %9.0f  %8.0f-%-8.0f %5.1f%%  %9s  %6.2f %6.2f", c, v, m, MIN, MAX, spread, median(non2xx[k]), median(p50[k]) / 1000, median(p99[k]) / 1000
    if (k in cmds) {
      CMDS[k] = median(cmds[k]); CPU[k] = median(cpu[k])
      printf "  %9.3f %9.2f %9.2f", CMDS[k], median(upc[k]), CPU[k]
    } else printf "  %9s %9s %9s", "-", "-", "-"
    minmax(errs[k]); if (MAX > 0) printf "  socket errors up to %d", MAX
    if (k in bad) printf "  CHECK FAILED:%s", bad[k]
    printf "\n"
  }
  function rounds(label, a, b,    na, nb, xa, xb, i, list, known, x) {
    if (!(a in rps) || !(b in rps)) return
    na = split(rps[a], xa, " "); nb = split(rps[b], xb, " ")
    if (na != nb) { printf "  %-64s n/a (%d and %d rounds)\n", label, na, nb; return }
    list = ""; known = ""
    for (i = 1; i <= na; i++) {
      if (xb[i] > 0) { x = sprintf("%.3f", xa[i] / xb[i]); list = list " " x; known = known " " x }
      else list = list " n/a"
    }
    if (known == "") { printf "  %-64s %s   (median n/a)\n", label, list; return }
    printf "  %-64s %s   (median %.3f%s)\n", label, list, median(known), (list == known) ? "" : " of the others"
  }
  # target, when given: shown after the figures (the target the issue sets for them)
  function ratio(label, a, b, arr, target,    x) {
    if (!(a in arr) || !(b in arr) || arr[b] == 0) { printf "  %-64s n/a\n", label; return }
    printf "  %-64s %6.3f   (%s vs %s)%s\n", label, arr[a] / arr[b], arr[a], arr[b], (target == "") ? "" : "   target " target
  }
  function figure(label, k, arr, target) {
    if (k in arr) printf "  %-64s %6.3f%s\n", label, arr[k], (target == "") ? "" : "   target " target
  }
  END {
    printf "\nmedians (min-max and spread = (max-min)/median of req/s over the rounds)\n"
    printf "%-4s %-26s %9s  %-17s %6s  %9s  %6s %6s  %9s %9s %9s\n", "case", "variant", "req/s", "min-max", "spread", "non-2xx", "p50ms", "p99ms", "redis/req", "us/EVALSHA", "redisCPU/req"
    n = split(order, vs, " "); for (i = 1; i <= n; i++) row("open", vs[i])
    n = split(hot_order, vs, " "); for (i = 1; i <= n; i++) row("hot", vs[i])
    printf "(redis/req: Redis commands sent by the client per HTTP request; us/EVALSHA: usec_per_call; redisCPU/req: Redis user+sys CPU us per request)\n"

    printf "\nall rounds, req/s (in round order)\n"
    n = split(order, vs, " "); for (i = 1; i <= n; i++) if (("open " vs[i]) in rps) printf "  open %-26s %s\n", vs[i], rps["open " vs[i]]
    n = split(hot_order, vs, " "); for (i = 1; i <= n; i++) if (("hot " vs[i]) in rps) printf "  hot  %-26s %s\n", vs[i], rps["hot " vs[i]]

    printf "\nratios of medians (same run, same machine)\n"
    ratio("open: tollgate-redis / trlr, req/s", "open tollgate-redis", "open trlr", MED)
    ratio("open: tollgate-redis / trlr, Redis CPU per request", "open tollgate-redis", "open trlr", CPU)
    ratio("open: tollgate-redis-bare / trlr, req/s", "open tollgate-redis-bare", "open trlr", MED)
    ratio("open: tollgate-redis-bare / trlr, Redis CPU per req", "open tollgate-redis-bare", "open trlr", CPU)
    ratio("open: tollgate-memory / governor, req/s", "open tollgate-memory", "open governor", MED)
    ratio("open: tollgate-memory-bare / governor, req/s", "open tollgate-memory-bare", "open governor", MED)
    ratio("open: tollgate-memory / governor-headers, req/s", "open tollgate-memory", "open governor-headers", MED)
    ratio("open: tollgate-memory / none, req/s", "open tollgate-memory", "open none", MED)
    ratio("open: tollgate-redis / none, req/s", "open tollgate-redis", "open none", MED)
    ratio("open: tollgate-redis-leased / trlr, req/s", "open tollgate-redis-leased", "open trlr", MED, ">= 1.5")
    ratio("open: tollgate-redis-leased / tollgate-memory, req/s", "open tollgate-redis-leased", "open tollgate-memory", MED, ">= 0.9")
    ratio("open: tollgate-redis-leased-bare / trlr, req/s", "open tollgate-redis-leased-bare", "open trlr", MED)
    ratio("open: tollgate-redis-leased-bare / tollgate-memory-bare, req/s", "open tollgate-redis-leased-bare", "open tollgate-memory-bare", MED)
    ratio("open: tollgate-redis-leased / tollgate-redis, req/s", "open tollgate-redis-leased", "open tollgate-redis", MED)
    figure("open: tollgate-redis-leased Redis commands per request", "open tollgate-redis-leased", CMDS, "<= 0.02")
    figure("open: tollgate-redis-leased-bare Redis commands per request", "open tollgate-redis-leased-bare", CMDS)
    figure("open: tollgate-redis-leased Redis CPU us per request", "open tollgate-redis-leased", CPU)
    ratio("hot: tollgate-redis / tollgate-memory, req/s", "hot tollgate-redis", "hot tollgate-memory", MED)
    ratio("hot: tollgate-redis / trlr, req/s", "hot tollgate-redis", "hot trlr", MED)
    ratio("hot: tollgate-memory / governor, req/s", "hot tollgate-memory", "hot governor", MED)
    figure("hot: tollgate-redis Redis commands per request", "hot tollgate-redis", CMDS)
    figure("hot: trlr Redis commands per request", "hot trlr", CMDS)
    figure("hot: tollgate-redis-leased Redis commands per request", "hot tollgate-redis-leased", CMDS)

    printf "\nround by round (a round runs every variant once; the order rotates each round)\n"
    rounds("open: tollgate-redis / trlr, req/s", "open tollgate-redis", "open trlr")
    rounds("open: tollgate-redis-bare / trlr, req/s", "open tollgate-redis-bare", "open trlr")
    rounds("open: tollgate-memory / governor, req/s", "open tollgate-memory", "open governor")
    rounds("open: tollgate-memory-bare / governor, req/s", "open tollgate-memory-bare", "open governor")
    rounds("open: tollgate-memory / governor-headers, req/s", "open tollgate-memory", "open governor-headers")
    rounds("open: tollgate-redis-leased / trlr, req/s", "open tollgate-redis-leased", "open trlr")
    rounds("open: tollgate-redis-leased / tollgate-memory, req/s", "open tollgate-redis-leased", "open tollgate-memory")
    rounds("open: tollgate-redis-leased-bare / trlr, req/s", "open tollgate-redis-leased-bare", "open trlr")
    rounds("open: tollgate-redis-leased-bare / tollgate-memory-bare, req/s", "open tollgate-redis-leased-bare", "open tollgate-memory-bare")
    rounds("open: none / governor, req/s", "open none", "open governor")
    rounds("hot: tollgate-redis / tollgate-memory, req/s", "hot tollgate-redis", "hot tollgate-memory")

    worst = 0; wk = "one round: no spread to show"
    for (k in SPREAD) if (SPREAD[k] > worst) { worst = SPREAD[k]; wk = k }
    printf "\nnoise: req/s spread across rounds (max-min)/median is at most %.1f%% (%s);", worst, wk
    printf " ratios closer to 1 than that are within the noise.\n"
  }' "$results"
echo "raw results: $results (case variant round req/s non2xx socket_errors p50_us p99_us redis_cmds/req usec/evalsha redis_cpu_us/req check)"
