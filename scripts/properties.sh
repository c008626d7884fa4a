#!/usr/bin/env bash
# The long run of the property tests: the model tests (both stores against an
# independent model, quota changes included), the reservation and lease
# models, the leases of keys seen a few times (tests/leases.rs) and the
# library's own properties, each with CASES generated cases instead of CI's
# few hundred. Property tests must never be flaky: run this
# before trusting a change to the engine.
#
#   scripts/properties.sh [CASES] [SERVER]
#
# CASES: cases per property (20000). SERVER: a name scripts/servers.sh knows
# (redis-6.2, valkey-9), put first on PATH; the system's redis-server
# otherwise. A failure prints its minimal case; cargo's output is kept in
# target/properties.log.
set -euo pipefail
cd "$(dirname "$0")/.."

cases=${1:-20000}
server=${2:-}
if [ -n "$server" ]; then
  PATH="$(scripts/servers.sh "$server"):$PATH"
fi
mkdir -p target
started=$(date +%s)
PROPTEST_CASES=$cases cargo test --all-features --lib \
  --test model --test reservation_model --test lease_model --test leases 2>&1 |
  tee target/properties.log |
  grep -E '^(test |test result|running|thread .* panicked)'
echo "properties: $cases cases each, $(( $(date +%s) - started )) s"
