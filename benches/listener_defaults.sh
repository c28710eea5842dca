#!/usr/bin/env bash
# What TunedListener's TCP_NOTSENT_LOWAT default costs a client that reads: loadgen against
# `streamgate sim` with the listener's defaults and with `--notsent-lowat 0` (the OS setting),
# started fresh for every run, interleaved, RUNS (default 7) runs each; prints every run and the
# medians.
#   [RUNS=15] bash benches/listener_defaults.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin streamgate >&2
target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
bin=$target/release

run() { # loadgen args, then -- serve flags; prints events/s
  local args=()
  while [ "$1" != -- ]; do args+=("$1"); shift; done
  shift
  "$bin/streamgate" sim --addr 127.0.0.1:0 --step-ms 0 "$@" > target/listener_defaults.out 2>&1 &
  local pid=$! addr=""
  for _ in $(seq 100); do
    addr=$(grep -o '127\.0\.0\.1:[0-9]*' target/listener_defaults.out || true)
    [ -n "$addr" ] && break
    sleep 0.05
  done
  "$bin/streamgate" loadgen --addr "$addr" --json "${args[@]}" | grep -o '"events_per_s":[0-9.]*' | cut -d: -f2
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

median() { tr ' ' '\n' | grep . | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

for load in "--streams 1 --tokens 50000" "--streams 64 --tokens 1000"; do
  tuned="" os=""
  for _ in $(seq "${RUNS:-7}"); do
    # shellcheck disable=SC2086 # the load is words
    tuned="$tuned $(run $load --)"
    # shellcheck disable=SC2086
    os="$os $(run $load -- --notsent-lowat 0)"
  done
  t=$(echo "$tuned" | median) o=$(echo "$os" | median)
  echo "$load: listener defaults$tuned | OS setting$os"
  echo "$load: median events/s $t against $o: $(awk "BEGIN {printf \"%.2f\", $t / $o}")x"
done
