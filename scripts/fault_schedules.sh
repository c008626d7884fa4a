#!/usr/bin/env bash
# The long run of the fault-schedule checker (tests/fault_schedule.rs): many
# random schedules of faults against real servers, each checked window by
# window, then the totals BENCHMARKS.md shows (schedules, violations,
# admitted against what the bucket allowed and what an exact bucket would
# have admitted, by lease setting and by what opened each checked stretch).
#
#   scripts/fault_schedules.sh [SCHEDULES] [SERVER]
#
# SCHEDULES: standalone schedules (500); a twenty-fifth as many run on a
# Redis Cluster (FAULT_CLUSTER_SCHEDULES overrides). SERVER: a name
# scripts/servers.sh knows (redis-6.2, valkey-9), put first on PATH; the
# system's redis-server otherwise. Redis 6.2 cannot start the harness's
# cluster (no --cluster-port), so its run has no cluster schedules.
# FAULT_BASE_SEED, FAULT_LEASES, FAULT_KINDS and FAULT_DURATION_MS pass
# through (see tests/fault_schedule.rs). The whole output is kept in
# target/fault-schedules/; a failing schedule's seed replays it:
#   FAULT_SEED=0x... cargo test --all-features --test fault_schedule -- --nocapture
set -euo pipefail
cd "$(dirname "$0")/.."

schedules=${1:-500}
server=${2:-}
if [ -n "$server" ]; then
  PATH="$(scripts/servers.sh "$server"):$PATH"
fi
cluster=${FAULT_CLUSTER_SCHEDULES:-$(( (schedules + 24) / 25 ))}
skip=()
if [ "$server" = redis-6.2 ]; then
  cluster=0
  skip=(--skip cluster)
fi
export FAULT_BASE_SEED=${FAULT_BASE_SEED:-$(date +%s%N)}

version=$(redis-server --version | cut -d' ' -f1-3)
mkdir -p target/fault-schedules
log="target/fault-schedules/${server:-system}-$FAULT_BASE_SEED.log"
echo "$schedules standalone and $cluster cluster schedules on $version," \
  "FAULT_BASE_SEED=$FAULT_BASE_SEED; output in $log"
cargo test --all-features --test fault_schedule --no-run
start=$(date +%s)
status=0
FAULT_SCHEDULES=$schedules FAULT_CLUSTER_SCHEDULES=$cluster RUST_BACKTRACE=0 \
  cargo test -q --all-features --test fault_schedule -- \
  --nocapture --test-threads=1 "${skip[@]}" >"$log" 2>&1 || status=$?

echo "server: $version; commit: $(git rev-parse --short HEAD);" \
  "$(nproc) cores; $(( $(date +%s) - start )) s"
grep -E '^(TOTAL|  [^ ])' "$log" || true
grep -E 'VIOLATION|panicked|Failing seeds' "$log" | head -40 || true
exit "$status"
