#!/usr/bin/env bash
# What `streamgate proxy` adds: the same loadgen straight to `streamgate sim` and through a proxy
# in front of it, at 1, 64 and 256 streams, interleaved, RUNS (default 3) runs each, one fresh
# sim (and proxy) per run. Prints one JSON line per run with the client's gap p50/p99 and the
# CPU seconds (utime+stime from /proc) of sim and of the proxy per million events, then the
# medians and the differences. The client's gaps come from the probe's histogram (buckets 12.5%
# wide: at 5 ms steps, ~0.6 ms), too coarse for tens of microseconds; so RUNS more runs per
# load write the proxy's hop records and measure each event's transit through the proxy
# (`proxy.recv` -> `proxy.write`, one process, one clock), exactly; medians of the runs.
#   [RUNS=5] [STEP_MS=5] bash benches/proxy_vs_direct.sh
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-3}
step=${STEP_MS:-5}
source benches/common/proxy.sh
cargo build --release -p streamgate-cli --bin streamgate >&2
bin=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/streamgate
out=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$out"' EXIT

start() { # name args... -> prints the address; the pid is in $out/name.pid
  local name=$1; shift
  "$bin" "$@" --addr 127.0.0.1:0 > "$out/$name.out" 2>&1 &
  echo $! > "$out/$name.pid"
  for _ in $(seq 200); do
    local addr; addr=$(sed -n 's/^listening on http:\/\///p' "$out/$name.out")
    [ -n "$addr" ] && { echo "$addr"; return; }
    sleep 0.05
  done
  echo "$name did not start" >&2; exit 1
}

run() { # mode streams tokens [proxy flags]
  local mode=$1 streams=$2 tokens=$3; shift 3
  local sim; sim=$(start sim sim --step-ms "$step" --kv-blocks 100000)
  local target=$sim proxy_pid=""
  if [ "$mode" = proxy ]; then
    target=$(start proxy proxy --upstream "http://$sim" "$@")
    proxy_pid=$(cat "$out/proxy.pid")
  fi
  local sim_pid; sim_pid=$(cat "$out/sim.pid")
  local sim0 proxy0=0; sim0=$(cpu_ticks "$sim_pid")
  [ -n "$proxy_pid" ] && proxy0=$(cpu_ticks "$proxy_pid")
  local report; report=$("$bin" loadgen --addr "$target" --streams "$streams" --tokens "$tokens" --json)
  local sim1 proxy1=0; sim1=$(cpu_ticks "$sim_pid")
  [ -n "$proxy_pid" ] && proxy1=$(cpu_ticks "$proxy_pid")
  kill "$sim_pid" ${proxy_pid:+"$proxy_pid"} 2>/dev/null || true
  wait 2>/dev/null || true
  python3 - "$mode" "$streams" "$report" "$((sim1 - sim0))" "$((proxy1 - proxy0))" "$(getconf CLK_TCK)" <<'EOF'
import json, sys
mode, streams, report, sim_ticks, proxy_ticks, hz = sys.argv[1:]
r = json.loads(report)
events = max(r["events"], 1)
per_m = lambda ticks: round(int(ticks) / int(hz) / events * 1e6, 2)
print(json.dumps({"mode": mode, "streams": int(streams), "events": r["events"],
                  "completed": r["completed"], "gap_p50_ms": r["gap_p50_ms"], "gap_p99_ms": r["gap_p99_ms"],
                  "sim_cpu_s_per_m_events": per_m(sim_ticks), "proxy_cpu_s_per_m_events": per_m(proxy_ticks)}))
EOF
}

for i in $(seq "$runs"); do
  for load in "1 2000" "64 400" "256 200"; do
    # shellcheck disable=SC2086 # streams and tokens are words
    for mode in direct proxy; do run "$mode" $load; done
  done
done | tee "$out/runs.jsonl"

for i in $(seq "$runs"); do
  for load in "1 2000" "64 400" "256 200"; do
    # shellcheck disable=SC2086 # streams and tokens are words
    run proxy $load --hop-records "$out/transit.jsonl" > /dev/null
    echo "{\"streams\": ${load%% *}, \"transit\": $(transit "$out/transit.jsonl")}"
    rm -f "$out/transit.jsonl"
  done
done | tee "$out/transit_runs.jsonl"
python3 - "$out/transit_runs.jsonl" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("\nstreams | transit p50 (us) | transit p99 (us) | max (us), medians of the runs")
for streams in sorted({r["streams"] for r in rows}):
    t = [r["transit"] for r in rows if r["streams"] == streams]
    m = lambda k: statistics.median(x[k] for x in t)
    print(f'{streams} | {m("transit_p50_us")} | {m("transit_p99_us")} | {m("transit_max_us")}')
EOF

python3 - "$out/runs.jsonl" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = lambda xs: statistics.median(xs)
print("\nstreams | gap p50 direct / proxy (ms) | gap p99 direct / proxy (ms) | added p99 (us) | proxy CPU s per M events | sim CPU s per M events (direct / proxied)")
for streams in sorted({r["streams"] for r in rows}):
    d = [r for r in rows if r["streams"] == streams and r["mode"] == "direct"]
    p = [r for r in rows if r["streams"] == streams and r["mode"] == "proxy"]
    g = lambda rs, k: med([r[k] for r in rs])
    print(f'{streams} | {g(d,"gap_p50_ms")} / {g(p,"gap_p50_ms")} | {g(d,"gap_p99_ms")} / {g(p,"gap_p99_ms")} | '
          f'{round((g(p,"gap_p99_ms") - g(d,"gap_p99_ms")) * 1e3)} | {g(p,"proxy_cpu_s_per_m_events")} | '
          f'{g(d,"sim_cpu_s_per_m_events")} / {g(p,"sim_cpu_s_per_m_events")}')
EOF
