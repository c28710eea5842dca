#!/usr/bin/env bash
# loadgen against `streamgate sim` and cli/examples/baseline_serve.rs, scenario by scenario, in one
# run on this machine; prints one JSON line per (scenario, server) with the server's RSS.
#   bash benches/serve_vs_baseline.sh [stall_seconds]
set -euo pipefail
cd "$(dirname "$0")/.."
stall_s=${1:-30}
cargo build --release --bin streamgate --example baseline_serve >&2
target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
bin=$target/release

start() { # name step_ms [extra server flags] -> sets addr and pid
  local name=$1 step=$2; shift 2
  local command=("$bin/streamgate" sim)
  [ "$name" = baseline_serve ] && command=("$bin/examples/baseline_serve")
  rm -f "target/$name.out" # not the last run's address: the shell truncates it after forking
  "${command[@]}" --addr 127.0.0.1:0 --step-ms "$step" "$@" > "target/$name.out" 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    addr=$(grep -so '127\.0\.0\.1:[0-9]*' "target/$name.out" || true)
    [ -n "$addr" ] && return
    sleep 0.05
  done
  echo "$name did not start" >&2; exit 1
}

rss_kib() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }

scenario() { # label step_ms serve-only-flags loadgen-args...
  local label=$1 step=$2 serve_flags=$3; shift 3
  for server in serve baseline_serve; do
    # shellcheck disable=SC2086 # the serve-only flags are words
    if [ "$server" = serve ]; then start "$server" "$step" $serve_flags; else start "$server" "$step"; fi
    local before; before=$(rss_kib "$pid")
    local peak=0
    ( while kill -0 "$pid" 2>/dev/null; do r=$(rss_kib "$pid" || echo 0); echo "$r"; sleep 0.2; done ) > "target/$server.rss" &
    local sampler=$!
    local result; result=$("$bin/streamgate" loadgen --addr "$addr" --json "$@")
    kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
    wait "$sampler" 2>/dev/null || true
    peak=$(sort -n "target/$server.rss" | tail -1)
    echo "{\"scenario\":\"$label\",\"server\":\"$server\",\"rss_before_kib\":$before,\"rss_peak_kib\":${peak:-0},\"loadgen\":$result}"
  done
}

# Token counts stay within the default KV pool (4096 blocks of 16 tokens) at any moment, and no
# request's `max_tokens` needs more than the whole pool (both servers refuse one with a 400).
scenario "1 stream, as fast as possible" 0 "" --streams 1 --tokens 50000
scenario "64 streams, as fast as possible" 0 "" --streams 64 --tokens 1000
scenario "256 streams at 5 ms steps" 5 "" --streams 256 --tokens 200
scenario "100 disconnects" 5 "" --streams 100 --tokens 1000 --disconnect 1 --after 20
# The crate's listener stops taking bytes at 16 KiB unsent; the baseline has the kernel's defaults
# (besides TCP_NODELAY and a backlog of 1024, as sim's).
scenario "one reader stalled ${stall_s} s" 0 "" --streams 1 --tokens 60000 --slow 1 --stop-s "$stall_s"
