#!/usr/bin/env bash
# Redis outages under load: an axum server behind tollgate (RedisStore, 300 ms
# store timeout, default circuit breaker) under wrk, while this script freezes
# and kills its own redis-server. Issue 8, item 8; the targets it checks are the
# issue's.
#
#   bash benches/outage.sh                                   # about 5 minutes
#   POLICIES="allow fallback" HOT_POLICIES=fallback bash benches/outage.sh
#   FAULTS=kill POLICIES=fallback HOT_POLICIES= DEFAULT_CONNS= bash benches/outage.sh   # one scenario
#   CONTROL=0 FAULTS= HOT_POLICIES= bash benches/outage.sh   # the default configuration only
#   LEASES=1 KEYS=10 CONTROL=0 FAULTS=freeze POLICIES=fallback HOT_POLICIES= DEFAULT_CONNS= \
#     TIMELINE_SVG=benches/outage_leases_timeline.svg bash benches/outage.sh   # leases through a freeze
#
# Environment (defaults in brackets):
#   CONTROL [1]                   1: first a control scenario without a fault
#                                 (fault "none", policy allow): the same windows,
#                                 to show how much the ratios and p99 move by
#                                 themselves on this machine in this run
#   FAULTS [freeze kill]          faults injected in the open case (or none)
#   POLICIES [allow fallback deny]  store-error policies (OnStoreError::Allow,
#                                 ::Fallback(Fallback::memory()), ::Deny), open case
#   HOT_FAULTS [kill]             faults injected in the hot case
#   HOT_POLICIES [fallback allow deny]  policies in the hot case ("" skips it)
#   DEFAULT_CONNS [32 64]         the default configuration frozen, once per
#                                 wrk connection count ("" skips it): see below
#   BEFORE [4]  seconds measured before the fault
#   OUTAGE [6]  seconds the fault lasts (wrk runs SKIP + (OUTAGE - SKIP) of them)
#   SKIP [1]    seconds after the fault starts that "during" leaves out
#   AFTER [4]   seconds measured after the fault ends
#   WARMUP [2]  seconds of wrk before "before" (not measured)
#   CONNS [64], THREADS [2]  wrk connections and threads
#   KEYS [100]  client keys in the open case (x-client: c1..cN, random)
#   PIN [1]     1: server + redis-server on core 0, wrk and this script on core 1
#   NICE [0]    a nice value for everything the script starts after the build
#               (negative needs root): NICE=-10 lets the measured processes
#               run ahead of other work on a shared machine, at that work's
#               expense. With autogroup scheduling (Linux's default for
#               desktop-style kernels) a process's nice only counts inside its
#               session's group, so the session's autogroup gets NICE too, and
#               its old value back on exit
#   PORT, REDIS_PORT  fixed ports, failing if busy (default: free ones are picked)
#   OUT [a temp dir]  raw wrk outputs, server timelines, Redis polls, logs
#   BREAKER_FIRST_PROBE_MS, BREAKER_MAX_COOLDOWN_MS, CONNECT_TIMEOUT_MS
#               (unset: tollgate's defaults) change the store's circuit breaker
#               and connect timeout, for experiments; the report names them
#   TRACE [0]   1: build peer-server with tollgate's tracing events (breaker
#               transitions, store errors, fallback start/end) in the server
#               logs under OUT, for diagnosis; figures then include that cost
#   TIMELINE_SVG [unset]  a path: the last scenario's timeline drawn there
#               (every scenario's is drawn as OUT/TAG.timeline.svg by
#               benches/outage_timeline.py: answers/s per 100 ms window by who
#               decided them (with LEASES=1 also: in process from a lease),
#               the server's p99, the fault's start and end; its unix ms in OUT/TAG.fault.txt)
#   LEASES [0]  1: the server's RedisStore with leases on (.leases(true),
#               .lease_period(LEASE_PERIOD_MS); 0: .leases(false). The
#               dflt-cN rows ignore it: leases on, tollgate's default): a
#               check with room to spare is decided in process from tokens
#               held for the instance, and in an outage held tokens keep being
#               spent until the holds' local expiry (two lease periods less a
#               tenth from when the lease was asked for: 3.6 s at 2000 ms;
#               64 periods less a tenth while a key's bucket is 3/4 free),
#               then checks go to Redis, the breaker and the policy. The
#               timeline then counts those decisions apart ("lease"; sampled
#               from the store's lease stats every 10 ms) and the report adds
#               a section on them. Leases form for keys with room to spare:
#               in the open case, keys whose demand fills a lease (KEYS=10 at
#               tens of thousands of req/s)
#   LEASE_PERIOD_MS [2000]  the lease period with LEASES=1 (10 to 60000;
#               tollgate's default is 1000, this default makes the holds'
#               3.6 s easy to see in the timeline)
#   CARGO_TARGET_DIR  respected by the build
#
# The default configuration (policy "default" in the tables): the store is
# built with the URL and the 300 ms timeout only (default circuit breaker,
# default connect timeout, leases on with the default period; LEASES, BREAKER_* and
# CONNECT_TIMEOUT_MS are ignored) and
# the layer gets no store-error policy (the default, OnStoreError::Allow); the
# open case with KEYS client keys, Redis frozen, wrk with each of
# DEFAULT_CONNS connections (CONNS is ignored). "During" then runs as 1-s wrk
# runs, so the report shows the p99 of each 1-s window from SKIP s into the
# freeze, and with it the answers the server took 250 ms or more for in that
# window (from its timeline: requests that waited on the store).
#
# Cases (benches/http_peers/src/main.rs, variant `tollgate-redis-outage`):
#   open: quota 1 000 000/s per key, so every request is admitted while Redis
#         decides: any non-2xx is the store-error policy's doing (Deny's 503s).
#   hot:  one key ("hot") flooded, quota burst 10 refilled 1 per second: shows
#         whether a flooded key stays limited while Redis is down.
#
# Faults, on the redis-server this script started (never any other):
#   freeze: SIGSTOP, SIGCONT after OUTAGE s (a hung primary, a blackholed route);
#   kill:   SIGKILL, then a new redis-server on the same port after OUTAGE s,
#           empty (persistence off; tollgate's script must be loaded again).
#
# One scenario (case, fault, policy), with a fresh peer-server and a flushed
# Redis: WARMUP s of wrk, BEFORE s measured, the fault, SKIP s of wrk (kept in
# the raw data as "onset", not reported), OUTAGE-SKIP s measured ("during"),
# the fault ends (SIGCONT, or the restart is started), AFTER s measured
# ("after", started just before the fault ends, so it covers the recovery).
# wrk runs back to back (its latency percentiles come from done(), see
# benches/http_peers/wrk.lua); each run reconnects, a few ms between runs.
#
# Measured per window: req/s (all answers, 429 and 503 included), p99 latency,
# socket errors (connect, read, write, timeout; wrk --timeout 2s) and non-2xx
# answers (wrk counts statuses above 399). wrk's latencies are corrected for
# coordinated omission (its stats_correct: an answer that took L adds samples
# L - k * interval, interval = run time / (requests / connections)), so one
# answer that waited the 300 ms store timeout weighs about 0.3 s x req/s /
# connections samples: at 32 connections and 50 000 req/s, about 1% of a
# second's, enough to set that second's p99 on its own.
#
# Resume time, two ways:
#   server: peer-server counts every answer per 10 ms slot by who decided it
#     (Redis; the fallback, Decision::is_fallback; or nobody, a StoreFailure
#     without a fallback decision), read from the response extensions outside
#     the limiter, and serves the counts at GET /timeline (with LEASES=1 a
#     check decided in process from a lease is a plain decision and counts as
#     Redis's here; the timeline also counts those apart, see LEASES). Resume = end of the
#     last slot after Redis returned that still holds an answer not decided by
#     Redis, minus the time Redis returned (0 when none). "Returned" is the
#     SIGCONT for a freeze, the restarted server's first PONG (polled every
#     ~5 ms) for a kill. This counts every answer, also those between wrk runs.
#   redis: from the return, INFO commandstats polled every ~20 ms: the first
#     poll at which the decisions Redis made grew, since the previous poll, at
#     half the pre-fault request rate or more. Decisions are counted by the
#     script's SET calls (one per admitted bucket: in the open case every
#     request is admitted), not by EVALSHA calls, which batching makes fewer
#     than decisions. A cross-check with ~20 ms resolution
#     (calls queued in a frozen Redis's sockets run at SIGCONT: a handful, far
#     below that rate). The polls, and the PING every ~5 ms that finds the
#     restarted server's first PONG, go over one bash /dev/tcp connection: no
#     fork per poll on wrk's core.
#
# Hot case: from the server's counts, the answers not decided by Redis (all of
# them fall in the outage) by status, and the span between the first and last
# fallback decision; the fallback's quota for that span is 10 + floor(span s)
# admitted (the bucket starts full, 1 token a second).
#
# Conditions, per window (the benchmark may run on a shared machine, so it
# says what it ran under):
#   - server p99: the 99th percentile of the time the server took, from a
#     middleware outside the limiter receiving the request to the response
#     (peer-server's /timeline buckets: 1 2 5 10 20 50 100 250 ms), and the
#     answers that took 250 ms or more (waits on the 300 ms store timeout): what
#     tollgate adds, apart from the kernel and the client;
#   - CPU: peer-server + redis-server's share of core 0 and wrk's of core 1
#     (/proc/PID/stat, wrk's through bash's `time`), the share other work took
#     on each core (/proc/stat, minus idle and ours), core 0's steal time;
#   - the longest silence in the server's answers (no answer at all; either side
#     may cause it), and the longest stall of core 0 seen by a stall meter (a
#     bash loop pinned to core 0, waking every 5 ms, logging wake-ups more than
#     30 ms late; about 1% of core 0).
#
# Pinning (PIN=1, needs taskset and 2+ cores): peer-server, redis-server and
# the stall meter on core 0; wrk, curl, the Redis polls and this script on
# core 1, as in benches/http_peers.sh: the load generator never competes with
# what is measured (other work on the machine still may: see the conditions). While Redis is frozen or dead the server has core 0 to itself, so
# "during" may beat "before": the targets compare against the pre-fault rate
# of the same run, as the issue states them.
set -euo pipefail

start_dir=$PWD
cd "$(dirname "$0")/.."
root=$PWD
crate="$root/benches/http_peers"

control=${CONTROL:-1}
faults=${FAULTS-freeze kill}
policies=${POLICIES-allow fallback deny}
hot_faults=${HOT_FAULTS-kill}
hot_policies=${HOT_POLICIES-fallback allow deny}
default_conns=${DEFAULT_CONNS-32 64}
before=${BEFORE:-4}
outage=${OUTAGE:-6}
skip=${SKIP:-1}
after=${AFTER:-4}
warmup=${WARMUP:-2}
conns=${CONNS:-64}
threads=${THREADS:-2}
nkeys=${KEYS:-100}
pin=${PIN:-1}
leases=${LEASES:-0}
lease_period=${LEASE_PERIOD_MS:-2000}

die() { echo "outage.sh: $*" >&2; exit 1; }
for tool in cargo wrk curl redis-server redis-cli ss timeout; do
  command -v "$tool" >/dev/null || die "$tool not found (redis: apt-get install -y redis-server; wrk: apt-get install -y wrk)"
done
for n in "$before" "$outage" "$skip" "$after" "$warmup" "$conns" "$threads" "$nkeys" $default_conns; do
  [[ $n =~ ^[0-9]+$ && $n -gt 0 ]] || die "BEFORE, OUTAGE, SKIP, AFTER, WARMUP, CONNS, THREADS, KEYS and DEFAULT_CONNS must be positive integers"
done
[ "$outage" -gt "$skip" ] || die "OUTAGE ($outage) must be longer than SKIP ($skip)"
case $leases in 0 | 1) ;; *) die "LEASES must be 0 or 1" ;; esac
[[ $lease_period =~ ^[0-9]+$ && $lease_period -ge 10 && $lease_period -le 60000 ]] ||
  die "LEASE_PERIOD_MS must be an integer from 10 to 60000"
for f in $faults $hot_faults; do
  case $f in none | freeze | kill) ;; *) die "unknown fault $f (none, freeze, kill)" ;; esac
done
for p in $policies $hot_policies; do
  case $p in allow | deny | fallback) ;; *) die "unknown policy $p (allow, deny, fallback)" ;; esac
done

# Wall clock in ms without a fork (bash 5), comparable with `date +%s%3N` and
# with peer-server's SystemTime: the result is in REPLY.
now_ms() { local t=${EPOCHREALTIME/[.,]/}; REPLY=$((t / 1000)); }

cores=$(nproc)
pin_server=() placement="unpinned"
if [ "$pin" = 1 ] && command -v taskset >/dev/null && [ "$cores" -ge 2 ]; then
  pin_server=(taskset -c 0)
  placement="peer-server+redis-server pinned to core 0, wrk and the script to core 1"
fi

# --- ports (as in benches/http_peers.sh) ---------------------------------------
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
if [ -n "${TIMELINE_SVG:-}" ] && [[ $TIMELINE_SVG != /* ]]; then
  TIMELINE_SVG="$start_dir/$TIMELINE_SVG"
fi
if [ -n "${CARGO_TARGET_DIR:-}" ] && [[ $CARGO_TARGET_DIR != /* ]]; then
  export CARGO_TARGET_DIR="$start_dir/$CARGO_TARGET_DIR"
fi
echo "building peer-server (release)..." >&2
features=()
[ "${TRACE:-0}" = 1 ] && features=(--features trace)
cargo build --release --quiet --manifest-path "$crate/Cargo.toml" "${features[@]}"
target_dir=$(cargo metadata --format-version 1 --no-deps --manifest-path "$crate/Cargo.toml" |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
bin="$target_dir/release/peer-server"
[ -x "$bin" ] || die "built binary not found at $bin"

# From here on, everything this script starts runs on core 1 unless started
# through pin_server (core 0); at the nice value NICE (below).
if [ ${#pin_server[@]} -gt 0 ]; then
  taskset -p -c 1 $$ >/dev/null || die "taskset -p failed"
fi

# --- scratch dir, Redis, clean-up --------------------------------------------
out=${OUT:-$(mktemp -d -t outage.XXXXXX)}
mkdir -p "$out"
results="$out/results.txt"
: >"$results"
server_pid=""
redis_pid=""
launched_pid=""
redis_frozen=""
bg_pids=()
meter_pid=""

cli() { timeout 10 redis-cli -h 127.0.0.1 -p "$redis_port" "$@"; }

# Dead, or a zombie not reaped yet (`kill -0` succeeds on a zombie).
is_dead() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) }
  [ "${stat%% *}" = Z ]
}

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
stop_bg() {
  local p
  for p in "${bg_pids[@]}"; do
    kill "$p" 2>/dev/null || true
  done
  for p in "${bg_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  bg_pids=()
}
cleanup() {
  if [ -n "${autogroup_nice:-}" ]; then echo "$autogroup_nice" >"/proc/$$/autogroup" 2>/dev/null || true; fi
  # A frozen Redis first: nothing else may be left waiting on it.
  if [ -n "$redis_frozen" ] && [ -n "$redis_pid" ]; then kill -CONT "$redis_pid" 2>/dev/null || true; fi
  stop_bg
  stop_server
  if [ -n "$meter_pid" ]; then kill "$meter_pid" 2>/dev/null || true; wait "$meter_pid" 2>/dev/null || true; fi
  # Our child: the running one, or one restarted and not yet adopted.
  local pid=${redis_pid:-$launched_pid}
  if [ -n "$pid" ]; then
    # SIGTERM: redis-server exits without saving (persistence is off).
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do is_dead "$pid" && break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# A write to a Redis connection that closed fails (EPIPE) instead of killing
# the script; a handled signal is reset for the commands it starts.
trap ':' PIPE
nice_value=${NICE:-0}
[[ $nice_value =~ ^-?[0-9]+$ ]] || die "NICE must be an integer"
autogroup_nice=""
if [ "$nice_value" != 0 ]; then
  renice -n "$nice_value" -p $$ >/dev/null || die "renice -n $nice_value failed (negative values need root)"
  if [ "$(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null)" = 1 ] && [ -w "/proc/$$/autogroup" ]; then
    autogroup_nice=$(sed -n 's/.* nice //p' "/proc/$$/autogroup")
    echo "$nice_value" >"/proc/$$/autogroup" || die "cannot set the session's autogroup nice to $nice_value"
  fi
fi

# redis-server runs as a child of this script, not daemonized: a daemon calls
# setsid(), which would put it in an autogroup of its own (see NICE), apart
# from peer-server; a child is also reaped at once when killed.
launch_redis() {
  "${pin_server[@]}" redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$out" --daemonize no --logfile "$out/redis.log" >/dev/null 2>&1 &
  launched_pid=$!
}
# Ours only if the server on the port is the process we started.
adopt_redis() { # waits (bounded) until our redis-server answers; sets redis_pid
  for _ in $(seq 100); do
    if [ "$(cli info server 2>/dev/null | tr -d '\r' | sed -n 's/^process_id://p')" = "$launched_pid" ]; then
      redis_pid=$launched_pid
      return 0
    fi
    is_dead "$launched_pid" && break
    sleep 0.05
  done
  return 1
}
for attempt in 1 2 3 4 5; do
  : >"$out/redis.log"
  launch_redis
  if adopt_redis; then break; fi
  kill "$launched_pid" 2>/dev/null || true
  wait "$launched_pid" 2>/dev/null || true
  if [ -n "${REDIS_PORT:-}" ] || [ "$attempt" = 5 ]; then
    die "redis-server did not start on port $redis_port (see $out/redis.log)"
  fi
  redis_port=$(free_port)
done
redis_url="redis://127.0.0.1:$redis_port"

# The stall meter: a bash loop on core 0 (with peer-server and redis-server)
# that wakes every 5 ms and logs "ms late_ms" whenever it woke more than 30 ms
# late. A process that sleeps nearly all the time runs first when it wakes, so
# a late wake-up means core 0 ran nobody of ours at all for that long (the
# hypervisor, or other work, held it): if peer-server is silent at the same
# time, the machine stalled it, not tollgate.
rm -f "$out/stall.fifo"
mkfifo "$out/stall.fifo"
# shellcheck disable=SC2016 # the loop expands its own variables
"${pin_server[@]}" bash -c '
  exec {fd}<>"$1"
  prev=${EPOCHREALTIME/[.,]/}
  while :; do
    read -r -t 0.005 -u "$fd" _
    now=${EPOCHREALTIME/[.,]/}
    late=$(((now - prev) / 1000 - 5))
    [ "$late" -gt 30 ] && echo "$((now / 1000)) $late"
    prev=$now
  done' stall-meter "$out/stall.fifo" >"$out/stall.txt" 2>/dev/null &
meter_pid=$!

# --- faults ------------------------------------------------------------------
# Redis is talked to from here through bash's /dev/tcp (RESP inline commands
# on one connection, no fork per call): polling every few ms then costs next
# to nothing on wrk's core.
rfd=""
redis_open() { # quietly fails when nothing listens
  redis_close
  { exec {rfd}<>"/dev/tcp/127.0.0.1/$redis_port"; } 2>/dev/null || { rfd=""; return 1; }
}
redis_close() {
  if [ -n "$rfd" ]; then exec {rfd}>&-; fi
  rfd=""
}
redis_cmd() { # inline command -> RTEXT (a status line or a bulk string), within 1 s
  local line len
  [ -n "$rfd" ] || return 1
  { printf '%s\r\n' "$1" 1>&"$rfd"; } 2>/dev/null || return 1
  IFS= read -r -t 1 line <&"$rfd" || return 1
  line=${line%$'\r'}
  case $line in
    '$'*)
      len=${line#\$}
      IFS= read -r -t 1 -N $((len + 2)) RTEXT <&"$rfd" || return 1
      ;;
    *) RTEXT=$line ;;
  esac
}

# inject FAULT: REPLY = the time it took effect (ms)
inject() {
  case $1 in
    none) ;;
    freeze)
      redis_frozen=1
      kill -STOP "$redis_pid"
      ;;
    kill)
      kill -KILL "$redis_pid"
      killed_pid=$redis_pid
      redis_pid=""
      ;;
  esac
  now_ms
}
# end FAULT: REPLY = the time Redis was back (SIGCONT, or the first PONG)
end_fault() {
  case $1 in
    none) now_ms ;;
    freeze)
      kill -CONT "$redis_pid"
      redis_frozen=""
      now_ms
      ;;
    kill)
      local dead=""
      for _ in $(seq 300); do is_dead "$killed_pid" && { dead=1; break; }; sleep 0.01; done
      [ -n "$dead" ] || die "redis-server $killed_pid survived SIGKILL for 3 s"
      wait "$killed_pid" 2>/dev/null || true
      launch_redis
      local pong=""
      for _ in $(seq 2000); do # ~10 s at most
        if redis_open && redis_cmd PING && [ "$RTEXT" = +PONG ]; then
          pong=1
          break
        fi
        sleep 0.005
      done
      [ -n "$pong" ] || die "restarted redis-server never answered PING (see $out/redis.log)"
      now_ms
      local back=$REPLY
      adopt_redis || die "the server answering on $redis_port is not the redis-server we restarted"
      REPLY=$back
      ;;
  esac
}
# poll_redis SECONDS RATE: INFO commandstats every ~20 ms, lines "ms
# set_calls" (the script's writes: one per admitted decision), until SECONDS
# have passed or 0.5 s after they grew at RATE/2 per second or more.
poll_redis() {
  local deadline t calls pt="" pc="" n
  now_ms
  deadline=$((REPLY + $1 * 1000))
  redis_open || return 0
  while now_ms && [ "$REPLY" -lt "$deadline" ]; do
    t=$REPLY
    if redis_cmd "INFO commandstats"; then
      calls=0
      [[ $RTEXT =~ cmdstat_set:calls=([0-9]+) ]] && calls=${BASH_REMATCH[1]}
      echo "$t $calls"
      if [ -n "$pt" ] && [ "$t" -gt "$pt" ] && [ $(((calls - pc) * 2000)) -ge $(($2 * (t - pt))) ]; then
        n=$((t + 500))
        [ "$n" -lt "$deadline" ] && deadline=$n
      fi
      pt=$t pc=$calls
    else
      redis_open || true
    fi
    sleep 0.02
  done
  redis_close
}

# --- conditions: who got core 0, and the VM's stolen time -----------------------
clk_tck=$(getconf CLK_TCK 2>/dev/null || echo 100)
proc_ticks() { # pid -> REPLY = its utime + stime in clock ticks (0 if none or gone)
  local stat f
  REPLY=0
  [ -n "$1" ] || return 0
  { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 0
  stat=${stat##*) }
  read -r -a f <<<"$stat"
  REPLY=$((f[11] + f[12]))
}
# sample NAME >> file: "NAME ms server_ticks redis_ticks cpu0_steal cpu0_idle cpu0_total
# cpu1_idle cpu1_total" (ticks; idle includes iowait, total is user to steal)
sample() {
  local t srv rds name rest f steal0=0 idle0=0 total0=0 idle1=0 total1=0
  now_ms
  t=$REPLY
  proc_ticks "$server_pid"
  srv=$REPLY
  proc_ticks "$redis_pid"
  rds=$REPLY
  while read -r name rest; do
    case $name in
      cpu0)
        read -r -a f <<<"$rest"
        steal0=${f[7]:-0} idle0=$((f[3] + f[4])) total0=$((f[0] + f[1] + f[2] + f[3] + f[4] + f[5] + f[6] + f[7]))
        ;;
      cpu1)
        read -r -a f <<<"$rest"
        idle1=$((f[3] + f[4])) total1=$((f[0] + f[1] + f[2] + f[3] + f[4] + f[5] + f[6] + f[7]))
        break
        ;;
    esac
  done </proc/stat
  echo "$1 $t $srv $rds $steal0 $idle0 $total0 $idle1 $total1"
}

# --- one scenario --------------------------------------------------------------
# RESULT line of a wrk output -> "rps p99_us socket_errors non2xx"
wrk_figures() {
  local line
  line=$(grep '^RESULT ' "$1") || die "no RESULT line in $1"
  awk '{
    for (i = 2; i <= NF; i++) { split($i, kv, "="); r[kv[1]] = kv[2] }
    printf "%.0f %d %d %d\n", r["requests"] / (r["duration_us"] / 1e6), r["p99_us"],
      r["connect"] + r["read"] + r["write"] + r["timeout"], r["non2xx"]
  }' <<<"$line"
}

# "During" as 1-s wrk runs, for the default configuration (uses run_one's
# locals): OUT/TAG.during.N.wrk.txt for the window from N to N+1 s into the
# fault, each run's start and end (ms) in OUT/TAG.windows.raw, and
# OUT/TAG.during.wrk.txt(.time) as one run over them all would have written
# them (counts and times summed; percentiles: the worst window's).
during_windows() {
  local i files=() times=()
  : >"$out/$tag.windows.raw"
  for ((i = skip; i < outage; i++)); do
    now_ms
    local start=$REPLY
    wrk_for 1 "$out/$tag.during.$i.wrk.txt" || return 1
    now_ms
    echo "$i $start $REPLY" >>"$out/$tag.windows.raw"
    files+=("$out/$tag.during.$i.wrk.txt")
    times+=("$out/$tag.during.$i.wrk.txt.time")
  done
  grep -h '^RESULT ' "${files[@]}" | awk '
    {
      for (i = 2; i <= NF; i++) {
        split($i, kv, "=")
        if (kv[1] ~ /_us$/ && kv[1] != "duration_us") { if (kv[2] + 0 > r[kv[1]]) r[kv[1]] = kv[2] + 0 }
        else r[kv[1]] += kv[2]
      }
    }
    END {
      printf "RESULT requests=%d duration_us=%d non2xx=%d connect=%d read=%d write=%d timeout=%d" \
        " p50_us=%d p90_us=%d p99_us=%d max_us=%d\n", r["requests"], r["duration_us"], r["non2xx"],
        r["connect"], r["read"], r["write"], r["timeout"], r["p50_us"], r["p90_us"], r["p99_us"], r["max_us"]
    }' >"$out/$tag.during.wrk.txt" || return 1
  awk '{ w += $1; u += $2; s += $3 } END { printf "%.3f %.3f %.3f\n", w, u, s }' "${times[@]}" \
    >"$out/$tag.during.wrk.txt.time"
}

# One line for the default configuration's table (uses run_one's locals):
# "connections server_resume_ms redis_resume_ms during_sock after_sock
# during_non2xx after_non2xx", then per 1-s window "second:p99_us:sock:non2xx:
# answers:slow", slow being the answers the server took 250 ms or more for
# (its timeline's last bucket), counted by slot start within the run.
window_figures() { # connections server_resume redis_resume "during figures" "after figures"
  local d a
  read -r -a d <<<"$4"
  read -r -a a <<<"$5"
  printf '%s %s %s %s %s %s %s' "$1" "$2" "$3" "${d[2]}" "${a[2]}" "${d[3]}" "${a[3]}"
  local i start end fig
  while read -r i start end; do
    fig=$(wrk_figures "$out/$tag.during.$i.wrk.txt")
    read -r -a fig <<<"$fig"
    awk -v from="$start" -v to="$end" -v head="$i:${fig[1]}:${fig[2]}:${fig[3]}" '
      /^#/ { next }
      $1 >= from && $1 < to { for (j = 11; j <= 19; j++) n += $j; slow += $19 }
      END { printf " %s:%d:%d", head, n, slow }' "$out/$tag.timeline.txt"
  done <"$out/$tag.windows.raw"
  printf '\n'
}

run_one() { # index case fault policy [connections]
  local case=$2 fault=$3 policy=$4 tag="$1-$2-$3-$4" keys=$nkeys c=${5:-$conns} windows="" server_env=()
  [ "$case" = hot ] && keys=1
  # The default configuration: no overrides reach the server, "during" in 1-s runs.
  if [ "$policy" = default ]; then
    windows=1
    tag+="-c$c"
    server_env=(env -u BREAKER_FIRST_PROBE_MS -u BREAKER_MAX_COOLDOWN_MS -u CONNECT_TIMEOUT_MS -u LEASES -u LEASE_PERIOD_MS)
  fi
  for _ in $(seq 50); do port_busy "$port" || break; sleep 0.1; done
  if port_busy "$port"; then
    [ -z "${PORT:-}" ] || die "PORT $port is busy (another process took it?)"
    port=$(free_port)
  fi
  cli flushall >/dev/null
  cli config resetstat >/dev/null

  PORT=$port REDIS_URL=$redis_url ON_STORE_ERROR=$policy LEASES=$leases LEASE_PERIOD_MS=$lease_period \
    "${server_env[@]}" "${pin_server[@]}" "$bin" tollgate-redis-outage "$case" \
    >"$out/$tag.server.log" 2>&1 &
  server_pid=$!
  local up=""
  for _ in $(seq 100); do
    kill -0 "$server_pid" 2>/dev/null || break
    port_busy "$port" && { up=1; break; }
    sleep 0.1
  done
  if [ -z "$up" ] || ! kill -0 "$server_pid" 2>/dev/null; then
    cat "$out/$tag.server.log" >&2
    die "peer-server ($tag) did not start listening on $port within 10 s"
  fi
  local code
  code=$(curl -s -o /dev/null -m 5 -w '%{http_code}' -H 'x-client: probe' "http://127.0.0.1:$port/" || true)
  [ "$code" = 200 ] || { cat "$out/$tag.server.log" >&2; die "peer-server ($tag) answered $code to a probe, not 200"; }

  local url="http://127.0.0.1:$port/"
  wrk_for() { # seconds output: wrk's output in OUTPUT, its "wall user sys" seconds in OUTPUT.time
    local TIMEFORMAT='%R %U %S'
    { time WRK_KEYS=$keys timeout $(($1 + 30)) wrk -t"$threads" -c"$c" --timeout 2s -s "$crate/wrk.lua" \
      -d"$1s" "$url" >"$2" 2>&1; } 2>"$2.time"
  }
  wrk_for "$warmup" "$out/$tag.warmup.wrk.txt" || die "wrk warm-up failed ($tag)"
  local samples="$out/$tag.samples.txt"
  sample b0 >"$samples"
  wrk_for "$before" "$out/$tag.before.wrk.txt" || die "wrk failed ($tag, before)"
  sample b1 >>"$samples"
  local b o d a
  b=$(wrk_figures "$out/$tag.before.wrk.txt")

  inject "$fault"
  local t0=$REPLY
  wrk_for "$skip" "$out/$tag.onset.wrk.txt" || die "wrk failed ($tag, onset)"
  sample d0 >>"$samples"
  if [ -n "$windows" ]; then
    during_windows || die "wrk failed ($tag, during)"
  else
    wrk_for $((outage - skip)) "$out/$tag.during.wrk.txt" || die "wrk failed ($tag, during)"
  fi
  sample d1 >>"$samples"

  # "after" starts now, while the fault ends.
  sample a0 >>"$samples"
  wrk_for "$after" "$out/$tag.after.wrk.txt" &
  local wrk_pid=$!
  bg_pids+=("$wrk_pid")
  end_fault "$fault"
  local t_back=$REPLY
  poll_redis $((after > 3 ? 3 : after)) "${b%% *}" >"$out/$tag.redis-poll.txt"
  wait "$wrk_pid" || die "wrk failed ($tag, after)"
  bg_pids=()
  sample a1 >>"$samples"

  kill -0 "$server_pid" 2>/dev/null || { cat "$out/$tag.server.log" >&2; die "peer-server ($tag) died during the run"; }
  curl -s -m 10 "http://127.0.0.1:$port/timeline" >"$out/$tag.timeline.txt" || die "no /timeline from peer-server ($tag)"
  stop_server
  echo "$t0 $t_back" >"$out/$tag.fault.txt"
  local title="outage.sh: $case case, Redis $fault, policy $policy, $c connections"
  if [ "$policy" = default ]; then
    title+=", leases on (the default), keys: $keys"
  elif [ "$leases" = 1 ]; then
    title+=", leases (period $lease_period ms), keys: $keys"
  fi
  python3 "$root/benches/outage_timeline.py" "$out/$tag.timeline.txt" "$t0" "$t_back" \
    "$title" >"$out/$tag.timeline.svg" ||
    die "could not draw $out/$tag.timeline.svg"
  [ -z "${TIMELINE_SVG:-}" ] || cp "$out/$tag.timeline.svg" "$TIMELINE_SVG"

  o=$(wrk_figures "$out/$tag.onset.wrk.txt")
  d=$(wrk_figures "$out/$tag.during.wrk.txt")
  a=$(wrk_figures "$out/$tag.after.wrk.txt")
  local b_rps=${b%% *}
  # Server-side: resume, first non-Redis answer after the fault, answers not
  # decided by Redis (by source and status), fallback span, hot-case bound.
  local srv
  srv=$(awk -v t0="$t0" -v back="$t_back" '
    /^#/ { for (i = 2; i <= NF; i++) { split($i, kv, "="); if (kv[1] == "slot_ms") slot = kv[2] } next }
    {
      s = $1; st = $2 + $3 + $4; fb = $5 + $6 + $7; fl = $8 + $9 + $10; nr = fb + fl
      if (nr > 0) {
        if (first_nr == "" && s + slot > t0) first_nr = s
        if (s + slot > back) { after_nr += nr; last_nr = s }
      }
      if (st > 0 && s + slot > back && first_st == "") first_st = s
      if (fb > 0) { if (fb_first == "") fb_first = s; fb_last = s }
      f2 += $5; f429 += $6; x2 += $8; xother += $10
    }
    END {
      if (first_st == "") resume = -1
      else if (after_nr > 0) resume = last_nr + slot - back
      else resume = 0
      span = (fb_first == "") ? 0 : fb_last + slot - fb_first
      onset = (first_nr == "") ? -1 : first_nr - t0
      printf "%d %d %d %d %d %d %d %d %d\n", resume, onset, after_nr + 0, f2 + 0, f429 + 0, x2 + 0, xother + 0,
        span, 10 + int(span / 1000)
    }' "$out/$tag.timeline.txt")
  local redis_resume
  redis_resume=$(awk -v back="$t_back" -v thr="$(awk -v r="$b_rps" 'BEGIN { print r / 2 / 1000 }')" '
    NR == 1 { pt = $1; pc = $2; next }
    {
      if (!found && $1 > pt && ($2 - pc) / ($1 - pt) >= thr) { found = 1; print $1 - back }
      pt = $1; pc = $2
    }
    END { if (!found) print -1 }' "$out/$tag.redis-poll.txt")
  # Per window (before, during, after): the share of core 0 that peer-server
  # and redis-server got (%), core 0's stolen time (ms), and the longest
  # silence in the server's answers (ms; with wrk keeping CONNS requests in
  # flight, a silence means nothing was answered at all).
  local cond
  cond=$(awk -v tck="$clk_tck" -v wb="$out/$tag.before.wrk.txt.time" -v wd="$out/$tag.during.wrk.txt.time" \
    -v wa="$out/$tag.after.wrk.txt.time" '
    BEGIN { wrkf["b"] = wb; wrkf["d"] = wd; wrkf["a"] = wa }
    FILENAME == ARGV[1] { t[$1] = $2; srv[$1] = $3; rds[$1] = $4; st[$1] = $5; i0[$1] = $6; n0[$1] = $7; i1[$1] = $8; n1[$1] = $9; next }
    FILENAME == ARGV[2] {
      for (w = 1; w <= 3; w++) {
        k = substr("bda", w, 1)
        if ($1 >= t[k "0"] && $1 <= t[k "1"] && $2 > late[k]) late[k] = $2
      }
      next
    }
    /^#/ {
      for (i = 2; i <= NF; i++) {
        split($i, kv, "=")
        if (kv[1] == "slot_ms") slot = kv[2]
        if (kv[1] == "time_bounds_ms") { nb = split(kv[2], bound, ","); bound[nb + 1] = 999 }
      }
      next
    }
    {
      for (w = 1; w <= 3; w++) {
        k = substr("bda", w, 1)
        if ($1 >= t[k "0"] && $1 + slot <= t[k "1"]) {
          if (prev[k] != "" && $1 - prev[k] - slot > gap[k]) gap[k] = $1 - prev[k] - slot
          prev[k] = $1
          for (j = 1; j <= 9; j++) { hb[k, j] += $(10 + j); hn[k] += $(10 + j) }
        }
      }
    }
    END {
      for (w = 1; w <= 3; w++) {
        k = substr("bda", w, 1); a = k "0"; b = k "1"; ms = t[b] - t[a]
        share = (ms > 0) ? ((srv[b] - srv[a]) + (rds[b] - rds[a])) * 1000 / tck / ms * 100 : 0
        if (rds[b] < rds[a]) share = (srv[b] - srv[a] + rds[b]) * 1000 / tck / ms * 100
        # server-side p99: the upper bound of the bucket holding it (999: above 250 ms)
        p99 = 0; cum = 0
        for (j = 1; j <= 9 && hn[k] > 0; j++) { cum += hb[k, j]; if (cum >= 0.99 * hn[k]) { p99 = bound[j]; break } }
        getline wt < (wrkf[k]); split(wt, wx, " ")
        wshare = (wx[1] > 0) ? (wx[2] + wx[3]) / wx[1] * 100 : 0
        # the rest of each core: idle, and other work (100 - ours - idle)
        idle0 = (n0[b] > n0[a]) ? (i0[b] - i0[a]) / (n0[b] - n0[a]) * 100 : 0
        idle1 = (n1[b] > n1[a]) ? (i1[b] - i1[a]) / (n1[b] - n1[a]) * 100 : 0
        other0 = 100 - share - idle0; if (other0 < 0) other0 = 0
        other1 = 100 - wshare - idle1; if (other1 < 0) other1 = 0
        printf "%d %d %d %d %d %d %d %d %d ", share, (st[b] - st[a]) * 1000 / tck, gap[k] + 0, late[k] + 0, p99,
          hb[k, 9] + 0, wshare, other0, other1
      }
      printf "\n"
    }' "$samples" "$out/stall.txt" "$out/$tag.timeline.txt")
  [ -z "$windows" ] || window_figures "$c" "${srv%% *}" "$redis_resume" "$d" "$a" >>"$out/windows.txt"
  local line="$case $fault $policy $b $o $d $a $((t_back - t0)) $srv $redis_resume $cond $c"
  echo "$line" >>"$results"
  local r
  read -r -a r <<<"$line"
  printf '  %-4s %-6s %-8s before %6s req/s p99 %6.1f ms | during %6s req/s (x%.2f) p99 %6.1f ms | after %6s req/s p99 %6.1f ms | resume %s ms\n' \
    "$case" "$fault" "$policy" "${r[3]}" "$(awk -v u="${r[4]}" 'BEGIN { print u / 1000 }')" \
    "${r[11]}" "$(awk -v d="${r[11]}" -v b="${r[3]}" 'BEGIN { print (b > 0) ? d / b : 0 }')" \
    "$(awk -v u="${r[12]}" 'BEGIN { print u / 1000 }')" "${r[15]}" "$(awk -v u="${r[16]}" 'BEGIN { print u / 1000 }')" \
    "${r[20]}" >&2
  if [ "$leases" = 1 ] || [ "$policy" = default ]; then
    lease_figures "$case" "$fault" "$policy" "$t0" "$t_back" >>"$out/leases.txt"
    local l
    read -r -a l < <(tail -n 1 "$out/leases.txt")
    printf '       leases: before %s%% of answers decided in process; in the fault %s (the last %s ms after it began),' \
      "${l[3]}" "${l[4]}" "${l[5]}" >&2
    printf ' first fallback decision at %s ms; granted %s, spent %s, expired %s\n' "${l[6]}" "${l[9]}" "${l[10]}" "${l[12]}" >&2
  fi
}

# With leases on, from a scenario's timeline (uses run_one's tag): "case fault
# policy before_local_% fault_local last_local_ms first_fallback_ms
# local_decisions requests granted spent returned expired": the share of
# answers decided in process from a lease in the BEFORE s before the fault
# (at most 100: the sampled counts may run a slot apart from the answers),
# those decided so from the fault's start to Redis's return, the end of the
# last 10 ms slot with one (ms after the fault began; -1: none), the start of
# the first slot with a fallback decision in that span (-1: none), then the
# store's lease stats when the timeline was read.
lease_figures() { # case fault policy t0 t_back
  awk -v head="$1 $2 $3" -v t0="$4" -v back="$5" -v from="$(($4 - before * 1000))" '
    /^#/ {
      for (i = 2; i <= NF; i++) { split($i, kv, "="); h[kv[1]] = kv[2] }
      slot = h["slot_ms"]
      next
    }
    {
      n = 0
      for (j = 2; j <= 10; j++) n += $j
      if ($1 >= from && $1 + slot <= t0) { bn += n; bl += $20 }
      if ($1 + slot > t0 && $1 < back) {
        fl += $20
        if ($20 > 0) last = $1 + slot - t0
        if ($5 + $6 + $7 > 0 && first_fb == "") first_fb = $1 - t0
      }
    }
    END {
      share = bn ? bl * 100 / bn : 0
      printf "%s %.1f %d %d %d %d %d %d %d %d %d\n", head, (share > 100) ? 100 : share, fl, (last == "") ? -1 : last,
        (first_fb == "") ? -1 : first_fb, h["lease_local_decisions"], h["lease_requests"], h["lease_granted"],
        h["lease_spent"], h["lease_returned"], h["lease_expired"]
    }' "$out/$tag.timeline.txt"
}

# --- the scenarios -------------------------------------------------------------
scenarios=()
[ "$control" = 1 ] && scenarios+=("open none allow")
for f in $faults; do for p in $policies; do scenarios+=("open $f $p"); done; done
for f in $hot_faults; do for p in $hot_policies; do scenarios+=("hot $f $p"); done; done
for n in $default_conns; do scenarios+=("open freeze default $n"); done
[ ${#scenarios[@]} -gt 0 ] || die "nothing to run"
per_run=$((warmup + before + outage + after + 3))
echo "outage: ${#scenarios[@]} scenarios, about $((${#scenarios[@]} * per_run / 60 + 1)) min;" \
  "wrk -t$threads -c$conns${default_conns:+ (default configuration: -c ${default_conns// //})}, $placement; raw data in $out" >&2
load_start=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')
started_at=$(date -u '+%Y-%m-%d %H:%M UTC')
index=0
: >"$out/windows.txt"
: >"$out/leases.txt"
for s in "${scenarios[@]}"; do
  read -r c f p n <<<"$s"
  index=$((index + 1))
  run_one "$(printf %02d "$index")" "$c" "$f" "$p" "$n"
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')

# --- report --------------------------------------------------------------------
echo
lease_note=", leases off"
[ "$leases" = 1 ] && lease_note=", leases on with a $lease_period ms lease period"
echo "tollgate outage benchmark, $started_at: peer-server tollgate-redis-outage (RedisStore, store timeout 300 ms," \
  "default circuit breaker$lease_note), wrk -t$threads -c$conns${default_conns:+ (dflt-cN: the default configuration, leases on, -cN)}," \
  "$nkeys keys (open) / 1 key (hot), $cores cores, $placement"
overrides=""
for v in BREAKER_FIRST_PROBE_MS BREAKER_MAX_COOLDOWN_MS CONNECT_TIMEOUT_MS; do
  if [ -n "${!v:-}" ]; then overrides+=" $v=${!v}"; fi
done
[ "$leases" = 1 ] && overrides+=" LEASES=1 LEASE_PERIOD_MS=$lease_period"
[ -z "$overrides" ] || echo "NOT the defaults:$overrides (except in the dflt-cN rows)"
echo "windows: before ${before}s | fault ${outage}s, during = its last $((outage - skip))s | after ${after}s;" \
  "nice $nice_value; load average (1/5/15 min) $load_start at the start, $load_end at the end (this benchmark alone: about 2)"
awk -v conns="$conns" '
  function ms(us) { return us / 1000 }
  {
    k = NR; C[k] = $1; F[k] = $2; P[k] = ($3 == "default") ? "dflt-c" $58 : $3
    brps[k] = $4; bp99[k] = $5; bsock[k] = $6; bnon[k] = $7
    osock[k] = $10; onon[k] = $11
    drps[k] = $12; dp99[k] = $13; dsock[k] = $14; dnon[k] = $15
    arps[k] = $16; ap99[k] = $17; asock[k] = $18; anon[k] = $19
    flen[k] = $20; res[k] = $21; onset[k] = $22; nrafter[k] = $23
    f2[k] = $24; f429[k] = $25; x2[k] = $26; xo[k] = $27; span[k] = $28; bound[k] = $29; rres[k] = $30
    bshare[k] = $31; bsteal[k] = $32; bgap[k] = $33; blate[k] = $34; bsp99[k] = $35; bslow[k] = $36; bwrk[k] = $37; bo0[k] = $38; bo1[k] = $39
    dshare[k] = $40; dsteal[k] = $41; dgap[k] = $42; dlate[k] = $43; dsp99[k] = $44; dslow[k] = $45; dwrk[k] = $46; do0[k] = $47; do1[k] = $48
    ashare[k] = $49; asteal[k] = $50; agap[k] = $51; alate[k] = $52; asp99[k] = $53; aslow[k] = $54; awrk[k] = $55; ao0[k] = $56; ao1[k] = $57
    n = NR
  }
  function verdict(ok) { return ok ? "PASS" : "FAIL" }
  function lat(b) { return (b == 999) ? ">250" : b }
  END {
    printf "\n%-4s %-6s %-8s | %-14s | %-20s | %-20s | %-8s | %-20s | %s\n", "case", "fault", "policy",
      "before", "during", "after", "sock", "non-2xx", "resume ms"
    printf "%-4s %-6s %-8s | %7s %6s | %7s %5s %6s | %7s %5s %6s | %-8s | %-20s | %s\n", "", "", "",
      "req/s", "p99ms", "req/s", "x", "p99ms", "req/s", "x", "p99ms", "b/d/a", "b/d/a", "server/redis"
    for (k = 1; k <= n; k++) {
      printf "%-4s %-6s %-8s | %7d %6.1f | %7d %5.2f %6.1f | %7d %5.2f %6.1f | %-8s | %-20s | %s/%s\n",
        C[k], F[k], P[k], brps[k], ms(bp99[k]), drps[k], brps[k] ? drps[k] / brps[k] : 0, ms(dp99[k]),
        arps[k], brps[k] ? arps[k] / brps[k] : 0, ms(ap99[k]), bsock[k] "/" dsock[k] "/" asock[k],
        bnon[k] "/" dnon[k] "/" anon[k], res[k], rres[k]
    }
    printf "(x: ratio to before; sock: socket errors; resume: server = last answer not decided by Redis after it returned," \
      " redis = decisions in Redis (its SET calls) back to half the pre-fault rate; -1 = not within the after window)\n"

    printf "\nconditions per window, before/during/after: what the figures above were measured under\n"
    printf "%-4s %-6s %-8s | %-13s | %-8s | %-11s | %-11s | %-11s | %-11s | %-11s | %-11s | %s\n", "case", "fault", "policy",
      "server p99ms", ">=250ms", "c0 ours %", "c0 other %", "c1 wrk %", "c1 other %", "steal0 ms", "silence ms", "stall0 ms"
    for (k = 1; k <= n; k++)
      printf "%-4s %-6s %-8s | %-13s | %-8s | %-11s | %-11s | %-11s | %-11s | %-11s | %-11s | %s\n", C[k], F[k], P[k],
        lat(bsp99[k]) "/" lat(dsp99[k]) "/" lat(asp99[k]), bslow[k] "/" dslow[k] "/" aslow[k],
        bshare[k] "/" dshare[k] "/" ashare[k], bo0[k] "/" do0[k] "/" ao0[k], bwrk[k] "/" dwrk[k] "/" awrk[k],
        bo1[k] "/" do1[k] "/" ao1[k], bsteal[k] "/" dsteal[k] "/" asteal[k], bgap[k] "/" dgap[k] "/" agap[k],
        blate[k] "/" dlate[k] "/" alate[k]
    printf "(all b/d/a. server p99: the server-side time of the 99th percentile answer, from the middleware receiving" \
      " the request to the response, as the upper bound of its bucket (1 2 5 10 20 50 100 250 ms; >250);" \
      " >=250ms: answers that took the server 250 ms or more (a store timeout is 300 ms);" \
      " c0 ours: CPU time of peer-server + redis-server over wall time (100 = all of core 0); c0 other: core 0" \
      " busy with anything else (other work on the machine, the stall meter); c1 wrk, c1 other: the same for core 1" \
      " and wrk (the rest of each core was idle); steal0: what the hypervisor reports it took from core 0;" \
      " silence: the longest stretch in which peer-server answered nothing (its cause may be on either side);" \
      " stall: the longest a 5 ms sleeper on core 0 woke late (0 = never more than 30 ms))\n"

    printf "\ntargets (issue 8), open case, same run:   during/before >= 0.80 | p99 during <= 20 ms | socket errors during+after = 0 | resume <= 1000 ms\n"
    for (k = 1; k <= n; k++) {
      if (C[k] != "open") continue
      x = brps[k] ? drps[k] / brps[k] : 0
      if (F[k] == "none") {
        printf "  %-15s  %5.2f      | %6.1f ms      | %5d      |  (control, no fault: what the windows show by themselves; before p99 %.1f ms, after x%.2f)\n",
          "control", x, ms(dp99[k]), dsock[k] + asock[k], ms(bp99[k]), brps[k] ? arps[k] / brps[k] : 0
        continue
      }
      note = (P[k] == "deny") ? "   (Deny: the answers are 503s by design)" : ""
      if (P[k] ~ /^dflt/) note = "   (p99: its worst 1-s window, below)"
      printf "  %-6s %-8s  %5.2f %s | %6.1f ms %s | %5d %s | %5d ms %s  (fault lasted %d ms; first answer without Redis %d ms after it began)%s\n",
        F[k], P[k], x, verdict(x >= 0.8), ms(dp99[k]), verdict(dp99[k] <= 20000),
        dsock[k] + asock[k], verdict(dsock[k] + asock[k] == 0), res[k], verdict(res[k] >= 0 && res[k] <= 1000),
        flen[k], onset[k], note
    }
    hot = 0
    for (k = 1; k <= n; k++) if (C[k] == "hot") hot = 1
    if (hot) {
      printf "\nhot key (burst 10, 1/s) flooded through the outage: answers not decided by Redis (server-side counts)\n"
      for (k = 1; k <= n; k++) {
        if (C[k] != "hot") continue
        admitted = f2[k] + x2[k]
        if (P[k] == "fallback")
          printf "  %-6s %-8s  2xx %d, 429 %d, 503 %d; fallback decided for %.2f s: its quota admits at most %d -> %s\n",
            F[k], P[k], admitted, f429[k], xo[k], span[k] / 1000, bound[k], verdict(admitted <= bound[k] && span[k] > 0)
        else if (P[k] == "allow")
          printf "  %-6s %-8s  2xx %d, 429 %d, 503 %d (fail-open: no limit during the outage, as Allow documents)\n",
            F[k], P[k], admitted, f429[k], xo[k]
        else
          printf "  %-6s %-8s  2xx %d, 429 %d, 503 %d (fail-closed)\n", F[k], P[k], admitted, f429[k], xo[k]
      }
    }
  }' "$results"
if [ -s "$out/leases.txt" ]; then
  echo
  echo "leases (period $lease_period ms: a hold is used in process until 2 periods less a tenth," \
    "$((lease_period * 18 / 10)) ms, after its request was sent; dflt rows: tollgate's default period, 1000 ms, 1800 ms;" \
    "a roomy hold 64 periods less a tenth), from the server's timeline and lease stats"
  awk -v life="$((lease_period * 18 / 10))" '
    BEGIN {
      printf "%-4s %-6s %-8s | %-9s | %-9s | %-10s | %-10s | %s\n", "case", "fault", "policy", "before", "in fault",
        "last lease", "first fb", "store lease stats (whole run)"
      printf "%-4s %-6s %-8s | %-9s | %-9s | %-10s | %-10s |\n", "", "", "", "local %", "local", "ms", "ms"
    }
    {
      printf "%-4s %-6s %-8s | %9.1f | %9d | %10d | %10d | local decisions %d, lease requests %d, granted %d, spent %d," \
        " returned %d, expired %d\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13
    }
    END {
      printf "(before: share of the answers in the before window decided in process from a lease; in fault: answers" \
        " decided so from the fault'"'"'s start to Redis'"'"'s return; last lease: the end of the last 10 ms slot with" \
        " one, ms after the fault began (at most about %d: the holds'"'"' local life; fewer if their tokens ran out first);" \
        " first fb: the first slot with a fallback decision; -1: none. Counts are sampled from the lease stats every" \
        " 10 ms, late by up to a slot. Resume \"redis\" above counts Redis'"'"'s own decisions, which leases make few:" \
        " it may stay -1)\n", life
    }' "$out/leases.txt"
fi
if [ -s "$out/windows.txt" ]; then
  echo
  echo "the default configuration (RedisStore with a 300 ms timeout and nothing else set: default circuit breaker;" \
    "no OnStoreError set: Allow), $nkeys keys, Redis frozen ${outage}s: wrk's p99 in each 1-s run from ${skip}s into the freeze"
  awk -v skip="$skip" -v outage="$outage" '
    BEGIN {
      printf "%-5s |", "conns"
      for (i = skip; i < outage; i++) printf " %-14s |", i "-" i + 1 " s"
      printf " %-8s | %-8s | %-13s | %s\n", "sock d/a", "non2xx", "resume ms", "p99 <= 20 ms in every window | sock 0 | resume <= 1000 ms"
      printf "%-5s |", ""
      for (i = skip; i < outage; i++) printf " %-14s |", "p99 ms (slow)"
      printf " %-8s | %-8s | %-13s |\n", "", "d/a", "server/redis"
    }
    {
      printf "%5d |", $1
      worst = 0; sock = $4 + $5
      for (j = 8; j <= NF; j++) {
        split($j, w, ":")
        if (w[2] > worst) worst = w[2]
        printf " %6.1f (%3d)   |", w[2] / 1000, w[6]
      }
      ok = (worst <= 20000) && (sock == 0) && ($2 >= 0) && ($2 <= 1000)
      printf " %-8s | %-8s | %-13s | worst %.1f ms, %d socket errors, resume %d ms: %s\n", $4 "/" $5, $6 "/" $7,
        $2 "/" $3, worst / 1000, sock, $2, ok ? "PASS" : "FAIL"
    }' "$out/windows.txt"
  echo "(p99: wrk's, corrected for coordinated omission; slow: answers the server took 250 ms or more for in that run," \
    "from its timeline; sock: socket errors during the freeze/after it; resume: as above)"
fi
lease_raw=""
[ "$leases" = 1 ] && lease_raw="$out/leases.txt (with leases on, see lease_figures);"
reproduce="${overrides# }${overrides:+ }FAULTS=\"$faults\" POLICIES=\"$policies\" HOT_FAULTS=\"$hot_faults\" HOT_POLICIES=\"$hot_policies\""
reproduce+=" DEFAULT_CONNS=\"$default_conns\" BEFORE=$before OUTAGE=$outage SKIP=$skip AFTER=$after CONNS=$conns THREADS=$threads KEYS=$nkeys PIN=$pin NICE=$nice_value"
echo
echo "reproduce: $reproduce bash benches/outage.sh"
echo "raw: $results (case fault policy, then per window before/onset/during/after: req/s p99_us socket_errors non2xx;" \
  "fault_ms resume_ms onset_ms non_redis_after fallback_2xx fallback_429 failed_2xx failed_other fallback_span_ms bound redis_resume_ms," \
  "then per window before/during/after: core0_ours_% steal0_ms silence_ms stall0_ms server_p99_bucket_ms server_ge250ms" \
  "core1_wrk_% core0_other_% core1_other_%, then wrk connections);" \
  "${default_conns:+$out/windows.txt (the 1-s runs of the default configuration, see window_figures);}" \
  ${lease_raw:+"$lease_raw"} \
  "wrk outputs, /timeline dumps and Redis polls beside it"
