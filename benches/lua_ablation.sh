#!/usr/bin/env bash
# Where the script's time goes: Redis CPU per decision of lua/token_bucket.lua
# and of variants of it with parts taken out, against a peer script
# (benches/peers/gcra_float.lua) with and without its write, in one run.
#
#   bash benches/lua_ablation.sh               # 3 rounds, about 2 minutes
#   ROUNDS=5 N=400000 bash benches/lua_ablation.sh
#
# The variants are made from the repository's script by replacing one line each
# (the script refuses to run when a line it replaces is not found):
#   full      the script as it is
#   no-set    the SET of an admitted bucket replaced by the formatting alone
#   no-calls  no-set, and the GET replaced by "no stored bucket"
#   no-format no-calls, and the formatting of the stored value dropped
# They are wrong as rate limiters; they only show what each part costs. Our
# variants decide B checks per call (B [16], as batching does under load), over
# B x 10 000 random keys, in the script's long form (the general path; the
# compact form RedisStore sends for checks of one quota has its own copy of
# these lines: its GET is swapped too, its SET is not, and the long form never
# runs it); the peer decides one per call over 10 000 keys.
#
# Each figure is redis-server's user+sys CPU (INFO cpu) over the run divided by
# the decisions made (calls x decisions per call), in microseconds. Rounds are
# interleaved; redis-server and redis-benchmark are pinned to different cores
# when taskset exists. Every round is printed, then the medians.
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in redis-server redis-cli redis-benchmark python3; do
  command -v "$tool" >/dev/null || { echo "$tool not found" >&2; exit 1; }
done
rounds=${ROUNDS:-3}
requests=${N:-200000}
batch=${B:-16}

dir=$(mktemp -d)
sock="$dir/redis.sock"
pin_server=() pin_client=()
if command -v taskset >/dev/null; then pin_server=(taskset -c 0) pin_client=(taskset -c 1); fi
"${pin_server[@]}" redis-server --port 0 --unixsocket "$sock" --save "" --appendonly no \
  --dir "$dir" --daemonize yes --pidfile "$dir/pid" --logfile "$dir/log" >/dev/null
trap 'redis-cli -s "$sock" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
for _ in $(seq 50); do redis-cli -s "$sock" ping >/dev/null 2>&1 && break; sleep 0.1; done
cli() { redis-cli -s "$sock" "$@"; }

python3 - "$dir" <<'EOF'
import sys
out = sys.argv[1]
src = open("lua/token_bucket.lua").read()
peer = open("benches/peers/gcra_float.lua").read()
def swap(text, old, new):
    if old not in text:
        sys.exit(f"lua_ablation: line not found, update the script: {old}")
    return text.replace(old, new)
SET = 'call("SET", key, value, "PX", format(INT, ttl + MARGIN_MS))'
GET = 'local stored = call("GET", key)'
VALUE = 'local value = format(VALUE, level, stamp)'
no_set = swap(src, SET, 'local _ = format(INT, ttl + MARGIN_MS)')
no_calls = swap(no_set, GET, "local stored = false")
no_format = swap(swap(no_calls, VALUE, "local value = level"), 'local _ = format(INT, ttl + MARGIN_MS)', "local _ = ttl")
variants = {"full": src, "no-set": no_set, "no-calls": no_calls, "no-format": no_format}
for name, text in variants.items():
    open(f"{out}/{name}.lua", "w").write(text)
open(f"{out}/peer.lua", "w").write(peer)
lines = [l for l in peer.split("\n") if 'redis.call("SET"' in l or "redis.call('SET'" in l]
if len(lines) != 1:
    sys.exit("lua_ablation: the peer script's SET line is not unique")
open(f"{out}/peer-no-set.lua", "w").write(peer.replace(lines[0], ""))
EOF

cpu() { cli info cpu | awk -F: '/^used_cpu_(user|sys):/ {s += $2} END {printf "%.6f", s}'; }
# run PER-CALL ARGS...: CPU µs per decision of one redis-benchmark run.
run() {
  local per=$1 c0 c1 calls
  shift
  cli flushall >/dev/null
  cli config resetstat >/dev/null
  c0=$(cpu)
  "${pin_client[@]}" redis-benchmark -s "$sock" -n "$requests" -c 50 -P 16 -r 10000 -q "$@" >/dev/null 2>&1
  c1=$(cpu)
  calls=$(cli info commandstats | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\).*/\1/p')
  awk -v a="$c0" -v b="$c1" -v n="$calls" -v p="$per" 'BEGIN {printf "%.2f", (b - a) * 1e6 / (n * p)}'
}

keys=() decisions=()
for i in $(seq "$batch"); do
  keys+=("tollgate:{u$i:__rand_int__}:10/1s:10")
  decisions+=(1 1 1 0)
done
names=(peer peer-no-set full no-set no-calls no-format)
declare -A sha
for n in "${names[@]}"; do sha[$n]=$(cli script load "$(cat "$dir/$n.lua")"); done
results="$dir/results"
echo "Redis CPU µs per decision; ours $batch decisions per call, the peer one (load average $(cut -d' ' -f1 /proc/loadavg) before)"
for r in $(seq "$rounds"); do
  line="round $r:"
  for n in "${names[@]}"; do
    case $n in
      peer*) v=$(run 1 EVALSHA "${sha[$n]}" 1 'rate:{user:__rand_int__}' 10 10 1 1) ;;
      *) v=$(run "$batch" EVALSHA "${sha[$n]}" "$batch" "${keys[@]}" "" 1 1000000 1 100000 "$batch" "${decisions[@]}") ;;
    esac
    echo "$n $v" >>"$results"
    line="$line $n=$v"
  done
  echo "$line"
done
echo "medians:"
sort -k1,1 -k2,2n "$results" | awk '
  { v[$1] = v[$1] " " $2; c[$1]++ }
  END { for (n in v) { split(substr(v[n], 2), a, " "); printf "  %-10s %s\n", n, a[int((c[n] + 1) / 2)] } }' | sort
echo "(load average $(cut -d' ' -f1 /proc/loadavg) after)"
