#!/usr/bin/env bash
# What each limiter costs the server per HTTP request, counted in instructions
# instead of timed: the axum server of benches/http_peers.sh (peer-server) runs
# under valgrind's callgrind, wrk drives it, and callgrind's counters are
# zeroed after a warm-up and dumped after a measured run, so the count covers
# exactly the requests wrk reports. Instructions per request in the server's
# user space are then compared with the same server without a limiter and with
# tower_governor, in one run. Unlike requests per second on a shared 2-core VM
# (which move by tens of percent between rounds, see BENCHMARKS.md), these
# counts repeat closely, so a change to the layer can be priced. They leave out
# the kernel (the socket reads and writes, most of the server's CPU in `perf`),
# cache misses and Redis's own work: benches/http_peers.sh measures the whole
# request, benches/lua_instructions.sh Redis's side.
#
#   bash benches/http_instructions.sh          # about 1 minute
#   VARIANTS="none governor tollgate-memory-bare" bash benches/http_instructions.sh
#   BASE=84b6475 bash benches/http_instructions.sh   # also tollgate at a past commit
#
# LINES=1 also counts the cache lines a request touches, as the misses of a
# simulated cache small enough (8 KiB of code, 8 KiB of data) that a line a
# request needs is almost never still there from the request before: a
# server's kernel (sockets, scheduling) evicts much of what user space left
# in the caches between two requests, so these are the lines a request brings
# back from farther away, where fewer instructions alone do not show it.
#
# Environment: VARIANTS (default below), SECONDS_MEASURED [5] (wrk's measured
# run; callgrind runs the server about 50x slower, so a few thousand requests),
# CONNS [16], BASE (a commit: its peer-server, built in a temporary git
# worktree with its own target directory, runs the tollgate variants again as
# base/VARIANT). The open case: 10 000 random client keys, every request admitted.
# The Redis variants count only the server's instructions, with batching as the
# slowed server makes it; Redis runs outside valgrind.
# Needs valgrind (callgrind_annotate, callgrind_control), wrk, curl,
# redis-server and redis-cli, cargo.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
die() { echo "http_instructions.sh: $*" >&2; exit 1; }
for tool in valgrind callgrind_annotate callgrind_control wrk curl redis-server redis-cli cargo; do
  command -v "$tool" >/dev/null || die "$tool not found (apt-get install -y valgrind wrk redis-server)"
done
variants=${VARIANTS-none governor tollgate-memory-bare tollgate-memory trlr tollgate-redis-bare tollgate-redis}
measured=${SECONDS_MEASURED:-5}
conns=${CONNS:-16}

echo "building peer-server (release)..." >&2
cargo build --release --quiet --manifest-path benches/http_peers/Cargo.toml
target_dir=$(cargo metadata --format-version 1 --no-deps --manifest-path benches/http_peers/Cargo.toml |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
bin="$target_dir/release/peer-server"
[ -x "$bin" ] || die "built binary not found at $bin"

work=$(mktemp -d -t http_instructions.XXXXXX)
server_pid=""
redis_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
  if [ -n "$redis_pid" ]; then
    kill "$redis_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$redis_pid" 2>/dev/null || break; sleep 0.1; done
  fi
  wait 2>/dev/null || true
  if [ -d "$work/base-tree" ]; then git worktree remove --force "$work/base-tree" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# The same server at a past commit, for before/after figures in one run.
declare -A bins
for v in $variants; do bins[$v]=$bin; done
order=$variants
if [ -n "${BASE:-}" ]; then
  echo "building peer-server at $BASE (release)..." >&2
  git worktree add --quiet --detach "$work/base-tree" "$BASE"
  CARGO_TARGET_DIR="$target_dir/base" cargo build --release --quiet \
    --manifest-path "$work/base-tree/benches/http_peers/Cargo.toml"
  for v in $variants; do
    case $v in tollgate-*) bins[base/$v]="$target_dir/base/release/peer-server"; order="$order base/$v" ;; esac
  done
fi

# Free loopback ports below the ephemeral range.
port_busy() { ss -Htan "sport = :$1" 2>/dev/null | grep -q .; }
free_port() {
  local p
  for _ in $(seq 200); do
    p=$((10000 + RANDOM % 20000))
    port_busy "$p" || { echo "$p"; return; }
  done
  die "no free port found"
}
redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" \
  --daemonize yes --pidfile "$work/redis.pid" --logfile "$work/redis.log" >/dev/null
for _ in $(seq 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis_pid=$(cat "$work/redis.pid")

wrk_run() { # seconds output
  WRK_KEYS=10000 wrk -t1 -c"$conns" -d"$1"s -s benches/http_peers/wrk.lua "http://127.0.0.1:$port/" >"$2" 2>&1
}

declare -A per_request code_lines data_lines
cache_sim=()
[ "${LINES:-0}" = 1 ] && cache_sim=(--cache-sim=yes --I1=8192,2,64 --D1=8192,2,64 --LL=262144,8,64)
echo "peer-server user-space instructions per request (callgrind; wrk -t1 -c$conns for ${measured}s after a warm-up over every key; open case, 10 000 keys):"
for v in $order; do
  dir="$work/${v//\//-}"
  mkdir -p "$dir"
  port=$(free_port)
  redis-cli -p "$redis_port" flushall >/dev/null
  PORT=$port REDIS_URL="redis://127.0.0.1:$redis_port" valgrind --tool=callgrind \
    --callgrind-out-file="$dir/cg.%p" --dump-instr=no "${cache_sim[@]}" "${bins[$v]}" "${v#base/}" open >"$dir/server.log" 2>&1 &
  server_pid=$!
  up=""
  for _ in $(seq 300); do
    if curl -s -o /dev/null -H 'x-client: c1' "http://127.0.0.1:$port/"; then up=1; break; fi
    sleep 0.1
  done
  [ -n "$up" ] || die "$v did not answer (see $dir/server.log)"
  # Warm-up: every key in order until all 10 000 have been seen (under
  # callgrind a few thousand requests a second), so the measured run finds
  # every client stored, as a server at full speed does within its first
  # tenth of a second. (Random keys for 2 s left about 28 % of the measured
  # requests meeting a new key.)
  seen=0
  for _ in 1 2 3 4 5 6; do
    WRK_SEQ=1 wrk_run 3 "$dir/warmup.txt"
    seen=$((seen + $(sed -n 's/.*RESULT requests=\([0-9]*\).*/\1/p' "$dir/warmup.txt")))
    [ "$seen" -ge 10000 ] && break
  done
  [ "$seen" -ge 10000 ] || die "$v: the warm-up reached only $seen requests"
  callgrind_control -z "$server_pid" >/dev/null 2>&1
  wrk_run "$measured" "$dir/wrk.txt"
  callgrind_control -d "$server_pid" >/dev/null 2>&1
  kill "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
  requests=$(sed -n 's/.*RESULT requests=\([0-9]*\).*/\1/p' "$dir/wrk.txt")
  non2xx=$(sed -n 's/.*non2xx=\([0-9]*\).*/\1/p' "$dir/wrk.txt")
  [ -n "$requests" ] && [ "$requests" -gt 0 ] || die "$v: wrk reported no requests"
  [ "$non2xx" = 0 ] || die "$v: $non2xx non-2xx responses in the open case"
  dump=$(ls "$dir"/cg.*.1 2>/dev/null | head -1)
  [ -n "$dump" ] || die "$v: no callgrind dump"
  ir=$(callgrind_annotate "$dump" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1; exit }')
  per_request[$v]=$((ir / requests))
  printf '  %-27s %7d instructions per request (%d requests)\n' "$v" "${per_request[$v]}" "$requests"
  if [ "${#cache_sim[@]}" -gt 0 ]; then
    # events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw
    read -r i1 d1 < <(awk '/^(summary|totals):/ { print $5, $6 + $7; exit }' "$dump")
    code_lines[$v]=$(awk -v m="$i1" -v n="$requests" 'BEGIN { printf "%.0f", m / n }')
    data_lines[$v]=$(awk -v m="$d1" -v n="$requests" 'BEGIN { printf "%.0f", m / n }')
    printf '  %-27s %7d code lines, %d data lines per request (8 KiB caches missed)\n' "" \
      "${code_lines[$v]}" "${data_lines[$v]}"
  fi
done

has() { [ -n "${per_request[$1]:-}" ]; }
if has none; then
  echo "the limiter's own, over none (${per_request[none]}):"
  for v in $order; do
    [ "$v" = none ] && continue
    printf '  %-27s %7d\n' "$v" $((${per_request[$v]} - ${per_request[none]}))
  done
fi
ratio() { awk -v a="${per_request[$1]}" -v b="${per_request[$2]}" 'BEGIN { printf "%.3f", a / b }'; }
line="ratios (instructions per request, whole server):"
has governor && has tollgate-memory-bare && line="$line tollgate-memory-bare/governor = $(ratio tollgate-memory-bare governor)"
has governor && has tollgate-memory && line="$line, tollgate-memory/governor = $(ratio tollgate-memory governor)"
has governor-headers && has tollgate-memory && line="$line, tollgate-memory/governor-headers = $(ratio tollgate-memory governor-headers)"
has trlr && has tollgate-redis-bare && line="$line, tollgate-redis-bare/trlr = $(ratio tollgate-redis-bare trlr)"
echo "$line"
if [ "${#cache_sim[@]}" -gt 0 ]; then
  lines() { awk -v a="$1" -v b="$2" -v c="$3" -v d="$4" 'BEGIN { printf "code %.3f, data %.3f", a / b, c / d }'; }
  line="ratios (lines per request, whole server):"
  for pair in tollgate-memory-bare/governor tollgate-memory/governor-headers tollgate-redis-bare/trlr; do
    a=${pair%/*} b=${pair#*/}
    has "$a" && has "$b" && line="$line $pair: $(lines "${code_lines[$a]}" "${code_lines[$b]}" "${data_lines[$a]}" "${data_lines[$b]}");"
  done
  echo "${line%;}"
fi
if [ -n "${BASE:-}" ]; then
  line="against $BASE (the limiter's own instructions, now / then):"
  for v in $variants; do
    case $v in tollgate-*)
      has none && line="$line $v $(awk -v a=$((${per_request[$v]} - ${per_request[none]})) -v b=$((${per_request[base/$v]} - ${per_request[none]})) 'BEGIN { printf "%.3f", a / b }')," ;;
    esac
  done
  echo "${line%,}"
fi
