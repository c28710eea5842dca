#!/usr/bin/env bash
# What each streaming API costs through `streamgate proxy`, against chat completions in the
# same run: `loadgen --api chat|messages|responses` through a proxy in front of `streamgate sim`
# at 1 and 64 streams, interleaved, RUNS (default 3) runs each, one fresh sim and proxy per run.
# Prints one JSON line per run with the proxy's CPU seconds (utime+stime from /proc) per million
# events and per million tokens and the client's gap p99; then the medians and each API's ratio
# to chat. Then RUNS more runs per API at 64 streams write the proxy's hop records and measure
# each visible event's transit through the proxy (`proxy.recv` -> `proxy.write`, one clock).
#   [RUNS=5] [STEP_MS=5] bash benches/proxy_formats.sh
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-3}
step=${STEP_MS:-5}
source benches/common/listening.sh
source benches/common/proxy.sh
cargo build --release -p streamgate-cli --bin streamgate >&2
bin=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/streamgate
out=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$out"' EXIT

start() { # name args... -> prints the address; the pid is in $out/name.pid
  local name=$1; shift
  "$bin" "$@" --addr 127.0.0.1:0 > "$out/$name.out" 2>&1 &
  echo $! > "$out/$name.pid"
  listening_addr "$out/$name.out" || { echo "$name did not start" >&2; exit 1; }
}

run() { # api streams tokens [proxy flags]
  local api=$1 streams=$2 tokens=$3; shift 3
  local sim proxy; sim=$(start sim sim --step-ms "$step" --kv-blocks 100000)
  proxy=$(start proxy proxy --upstream "http://$sim" "$@")
  local pid; pid=$(cat "$out/proxy.pid")
  local before; before=$(cpu_ticks "$pid")
  local report
  report=$("$bin" loadgen --api "$api" --addr "$proxy" --stats "$sim" --streams "$streams" --tokens "$tokens" --json)
  local after; after=$(cpu_ticks "$pid")
  kill "$(cat "$out/sim.pid")" "$pid" 2>/dev/null || true
  wait 2>/dev/null || true
  python3 - "$api" "$streams" "$tokens" "$report" "$((after - before))" "$(getconf CLK_TCK)" <<'EOF'
import json, sys
api, streams, tokens, report, ticks, hz = sys.argv[1:]
r = json.loads(report)
assert r["completed"] == int(streams) and r["failed"] == 0, r
cpu = int(ticks) / int(hz)
print(json.dumps({"api": api, "streams": int(streams), "events": r["events"], "gap_p99_ms": r["gap_p99_ms"],
                  "proxy_cpu_s_per_m_events": round(cpu / r["events"] * 1e6, 2),
                  "proxy_cpu_s_per_m_tokens": round(cpu / (int(streams) * int(tokens)) * 1e6, 2)}))
EOF
}

apis="chat messages responses"
for i in $(seq "$runs"); do
  for load in "1 2000" "64 400"; do
    # shellcheck disable=SC2086 # streams and tokens are words
    for api in $apis; do run "$api" $load; done
  done
done | tee "$out/runs.jsonl"

for i in $(seq "$runs"); do
  for api in $apis; do
    run "$api" 64 400 --hop-records "$out/transit.jsonl" > /dev/null
    echo "{\"api\": \"$api\", \"transit\": $(transit "$out/transit.jsonl")}"
    rm -f "$out/transit.jsonl"
  done
done | tee "$out/transit_runs.jsonl"

python3 - "$out/runs.jsonl" "$out/transit_runs.jsonl" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
transits = [json.loads(l) for l in open(sys.argv[2])]
med = statistics.median
print("\nstreams | api | proxy CPU s per M events | per M tokens | ratio to chat (per token) | client gap p99 (ms), medians of the runs")
for streams in sorted({r["streams"] for r in rows}):
    at = lambda api, k: med([r[k] for r in rows if r["streams"] == streams and r["api"] == api])
    for api in ["chat", "messages", "responses"]:
        ratio = at(api, "proxy_cpu_s_per_m_tokens") / at("chat", "proxy_cpu_s_per_m_tokens")
        print(f'{streams} | {api} | {at(api, "proxy_cpu_s_per_m_events")} | {at(api, "proxy_cpu_s_per_m_tokens")} | '
              f'{ratio:.2f} | {at(api, "gap_p99_ms")}')
print("\napi | transit p50 (us) | transit p99 (us) at 64 streams, medians of the runs")
for api in ["chat", "messages", "responses"]:
    t = [r["transit"] for r in transits if r["api"] == api]
    print(f'{api} | {med(x["transit_p50_us"] for x in t)} | {med(x["transit_p99_us"] for x in t)}')
EOF
