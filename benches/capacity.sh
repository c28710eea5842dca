#!/usr/bin/env bash
# Capacity numbers an operator plans with, for `streamgate sim` and cli/examples/baseline_serve.rs
# (the hand-rolled axum server with TCP_NODELAY), each started fresh for every measurement, in one
# run on this machine:
#   cpu_per_event  server CPU (utime+stime from /proc/PID/stat) per event delivered, at a fixed
#                  offered load: C streams of T tokens at one token every STEP_MS ms each
#                  (`streamgate loadgen`; CPU read just before it starts and just after it ends),
#                  CPU_RUNS runs per server and load, alternating which goes first;
#   throughput     events/s, client gap p99, server CPU per event and the server's peak RSS
#                  (VmHWM, the process was started for it) for each of SCENARIOS
#                  (STREAMSxTOKENS@STEP_MS: as fast as each server goes at 1 and 64 streams, 256
#                  streams at a 5 ms decode pace, and 64 streams at 10 and at 1 ms a token, 10x
#                  the event rate for the same streams), CPU_RUNS runs each, alternating which
#                  goes first;
#   rss_per_stream (RSS with N streams open - RSS idle) / N, every stream's generator stalled
#                  before its second token (`--stall-at 1 --stall-ms 600000`), its client
#                  (loadgen, `--slow 1`) holding it open; read once `/stats` counts N generators
#                  running and the RSS has settled;
#   release        100 streams that all disconnect after 50 events: last disconnect until
#                  `/stats` shows `generators_running == 0 && kv_blocks_in_use == 0` (loadgen's
#                  `released_after_last_disconnect_ms`: a new connection per poll, 1 ms apart, so
#                  it resolves ~2 ms), RELEASE_RUNS runs per server, alternating which goes first;
#   release_tight  the same with a small Python client that closes its 100 sockets at once and
#                  then polls `/stats` back to back on one keep-alive connection: released_ms is
#                  when a response first showed everything released, not_before_ms when the last
#                  poll that did not was sent (the release happened in between), and sim's own
#                  measure (`/stats` end_to_release_max_us: the slowest stream's gate end to
#                  release).
# sim runs with all its instruments: probes at its four hops, stamps, the Prometheus recorder, and
# hop records for 1% of requests (--hop-records-sample 0.01).
# Prints one JSON line per measurement, then a table of medians with ratios (sim / baseline).
# Every run's loadavg is in its JSON line: on a shared machine, read the CPU figures with it.
#
#   bash benches/capacity.sh
#   SCENARIOS="1x200000@0 64x20000@0 256x400@5 64x500@10 64x5000@1" \
#   CPU_STREAMS="200 1000" CPU_TOKENS=250 STEP_MS=20 CPU_RUNS=3 MEM_STREAMS=10000 \
#     RELEASE_RUNS=9 RELEASE_STEP_MS=5 bash benches/capacity.sh      # the defaults
#
# The file descriptor limit is raised to the hard limit (MEM_STREAMS needs that many in the
# server and in loadgen). The KV pool is made large enough for every stream on both servers.
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/common/listening.sh
cpu_streams=${CPU_STREAMS:-200 1000}
cpu_tokens=${CPU_TOKENS:-250}
step_ms=${STEP_MS:-20}
cpu_runs=${CPU_RUNS:-3}
mem_streams=${MEM_STREAMS:-10000}
release_runs=${RELEASE_RUNS:-9}
release_step_ms=${RELEASE_STEP_MS:-5}
kv_blocks=1000000

ulimit -n "$(ulimit -Hn)"
if [ "$(ulimit -n)" -lt $((mem_streams + 1000)) ]; then
  echo "capacity: the fd limit ($(ulimit -n)) is too low for MEM_STREAMS=$mem_streams" >&2; exit 1
fi
cargo build --release --bin streamgate --example baseline_serve >&2
target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
bin=$target/release
work=$(mktemp -d)
results=$work/results.jsonl
tick=$(getconf CLK_TCK)
pid=""
trap 'for p in $pid ${client:-}; do kill -KILL "$p" 2>/dev/null || true; done; rm -rf "$work"' EXIT

start() { # sim|baseline [server flags] -> sets addr and pid
  local name=$1; shift
  local command=("$bin/streamgate" sim)
  [ "$name" = baseline ] && command=("$bin/examples/baseline_serve")
  rm -f "$work/$name.out" # not the last server's address: the shell truncates it after forking
  # Every instrument on in sim: hop records for 1% of requests, besides its probes and metrics.
  [ "$name" = sim ] && command+=(--hop-records "$work/records.jsonl" --hop-records-sample 0.01)
  "${command[@]}" --addr 127.0.0.1:0 --kv-blocks "$kv_blocks" "$@" > "$work/$name.out" 2>&1 &
  pid=$!
  addr=$(listening_addr "$work/$name.out") && return
  echo "capacity: $name did not start" >&2; cat "$work/$name.out" >&2; exit 1
}

stop() {
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  pid=""
}

cpu_ticks() { sed 's/.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'; } # utime + stime
rss_kib() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }
stat_field() { curl -s "http://$addr/stats" | python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

emit() { echo "$1" | tee -a "$results"; }

cpu_per_event() { # server streams
  local server=$1 streams=$2
  start "$server" --step-ms "$step_ms"
  local before after client_cpu result
  before=$(cpu_ticks "$pid")
  local TIMEFORMAT='%U %S'
  { time "$bin/streamgate" loadgen --addr "$addr" --json --streams "$streams" \
      --tokens "$cpu_tokens" > "$work/loadgen.json"; } 2> "$work/time"
  after=$(cpu_ticks "$pid")
  result=$(cat "$work/loadgen.json")
  client_cpu=$(awk '{print $1 + $2}' "$work/time")
  stop
  emit "$(python3 - "$server" "$streams" "$before" "$after" "$tick" "$client_cpu" "$result" "$(loadavg)" "$step_ms" <<'EOF'
import json, sys
server, streams, before, after, tick, client, result, load, step = sys.argv[1:]
r = json.loads(result)
cpu = (int(after) - int(before)) / int(tick)
events = r["events"]
print(json.dumps({
    "measure": "cpu_per_event", "server": server, "streams": int(streams), "step_ms": int(step),
    "offered_events_per_s": int(streams) * 1000 // int(step), "events_per_s": r["events_per_s"],
    "events": events, "completed": r["completed"], "failed": r["failed"], "wall_s": r["wall_s"],
    "server_cpu_s": cpu, "cpu_s_per_million_events": round(cpu / events * 1e6, 2) if events else None,
    "loadgen_cpu_s": float(client), "gap_p99_ms": r["gap_p99_ms"],
    "ttfe_p99_ms": r["ttfe_p99_ms"], "loadavg": load,
}))
EOF
)"
}

throughput() { # server scenario streams tokens step_ms
  local server=$1 scenario=$2 streams=$3 tokens=$4 step=$5
  start "$server" --step-ms "$step"
  local before after result
  before=$(cpu_ticks "$pid")
  result=$("$bin/streamgate" loadgen --addr "$addr" --json --streams "$streams" --tokens "$tokens")
  after=$(cpu_ticks "$pid")
  local peak; peak=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
  stop
  emit "$(python3 - "$server" "$scenario" "$streams" "$step" "$before" "$after" "$tick" "$result" "$(loadavg)" "$peak" <<'EOF2'
import json, sys
server, scenario, streams, step, before, after, tick, result, load, peak = sys.argv[1:]
r = json.loads(result)
cpu = (int(after) - int(before)) / int(tick)
events = r["events"]
print(json.dumps({
    "measure": "throughput", "scenario": scenario, "server": server, "streams": int(streams),
    "step_ms": int(step), "events": r["events"], "completed": r["completed"], "failed": r["failed"],
    "events_per_s": r["events_per_s"], "gap_p50_ms": r["gap_p50_ms"], "gap_p99_ms": r["gap_p99_ms"],
    "gap_max_ms": r["gap_max_ms"],
    "cpu_s_per_million_events": round(cpu / events * 1e6, 2) if events else None,
    "peak_rss_mib": round(int(peak) / 1024, 1),
    "loadavg": load,
}))
EOF2
)"
}

rss_per_stream() { # server
  local server=$1
  start "$server" --step-ms "$step_ms" --stall-at 1 --stall-ms 600000
  sleep 1
  local idle; idle=$(rss_kib "$pid")
  "$bin/streamgate" loadgen --addr "$addr" --json --streams "$mem_streams" --tokens 16 \
    --slow 1 --stop-s 600 > /dev/null 2>&1 &
  client=$!
  local running=0 waited=0
  while [ "$running" != "$mem_streams" ] && [ "$waited" -lt 120 ]; do
    sleep 1; waited=$((waited + 1))
    running=$(stat_field generators_running || echo 0)
  done
  # Let the RSS settle: the same reading twice, a second apart (at most 10 s).
  local open last=0
  for _ in $(seq 10); do
    open=$(rss_kib "$pid")
    [ "$open" = "$last" ] && break
    last=$open; sleep 1
  done
  local connections
  connections=$(ss -Htn state established "( sport = :${addr##*:} )" | wc -l)
  kill -KILL "$client" 2>/dev/null || true; wait "$client" 2>/dev/null || true; client=""
  stop
  emit "$(python3 - "$server" "$mem_streams" "$running" "$connections" "$idle" "$open" "$waited" "$(loadavg)" <<'EOF'
import json, sys
server, streams, running, connections, idle, opened, waited, load = sys.argv[1:]
streams, idle, opened = int(streams), int(idle), int(opened)
print(json.dumps({
    "measure": "rss_per_stream", "server": server, "streams": streams,
    "generators_running": int(running), "connections": int(connections),
    "rss_idle_kib": idle, "rss_open_kib": opened, "seconds_to_open": int(waited),
    "bytes_per_stream": round((opened - idle) * 1024 / streams), "loadavg": load,
}))
EOF
)"
}

release_tight() { # server run
  local server=$1 run=$2
  start "$server" --step-ms "$release_step_ms"
  local result
  result=$(python3 "$work/release.py" "$addr" 100 50)
  stop
  emit "$(python3 - "$server" "$run" "$result" "$(loadavg)" "$release_step_ms" <<'EOF'
import json, sys
server, run, result, load, step = sys.argv[1:]
r = json.loads(result)
print(json.dumps({"measure": "release_tight", "server": server, "run": int(run), "streams": 100,
                  "step_ms": int(step), **r, "loadavg": load}))
EOF
)"
}

release() { # server run
  local server=$1 run=$2
  start "$server" --step-ms "$release_step_ms"
  local result
  result=$("$bin/streamgate" loadgen --addr "$addr" --json --streams 100 --tokens 1000 \
    --disconnect 1 --after 50)
  stop
  emit "$(python3 - "$server" "$run" "$result" "$(loadavg)" "$release_step_ms" <<'EOF'
import json, sys
server, run, result, load, step = sys.argv[1:]
r = json.loads(result)
print(json.dumps({
    "measure": "release", "server": server, "run": int(run), "streams": r["streams"],
    "step_ms": int(step), "disconnected": r["disconnected"], "wasted_tokens": r["wasted_tokens"],
    "released_after_last_disconnect_ms": r["released_after_last_disconnect_ms"], "loadavg": load,
}))
EOF
)"
}

cat > "$work/release.py" <<'EOF'
# Opens N streams, reads `after` events from each, closes every socket, then polls /stats on
# one keep-alive connection (opened before) until no generator runs and no KV block is held.
import json, selectors, socket, sys, time
host, port = sys.argv[1].rsplit(":", 1)
streams, after = int(sys.argv[2]), int(sys.argv[3])
body = json.dumps({"model": "m", "messages": [], "stream": True, "max_tokens": 1000}).encode()
request = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
           b"content-length: %d\r\n\r\n" % len(body)) + body
def connect():
    s = socket.create_connection((host, int(port)))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s
selector, seen = selectors.DefaultSelector(), {}
for _ in range(streams):
    s = connect()
    s.sendall(request)
    selector.register(s, selectors.EVENT_READ)
    seen[s] = 0
stats = connect()
def poll():
    stats.sendall(b"GET /stats HTTP/1.1\r\nhost: x\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        data += stats.recv(65536)
    head, rest = data.split(b"\r\n\r\n", 1)
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(rest) < length:
        rest += stats.recv(65536)
    return json.loads(rest)
before = poll()
waiting = streams
while waiting:
    for key, _ in selector.select():
        data = key.fileobj.recv(65536)
        seen[key.fileobj] += data.count(b"data: ")
        if seen[key.fileobj] >= after or not data:
            selector.unregister(key.fileobj)
            waiting -= 1
for s in seen:
    s.close()
closed = time.perf_counter()
ms = lambda t: round((t - closed) * 1e3, 3)
polls, not_before = 0, closed
while True:
    sent = time.perf_counter()
    now = poll()
    polls += 1
    if now["generators_running"] == 0 and now["kv_blocks_in_use"] == 0:
        break
    not_before = sent
print(json.dumps({"released_ms": ms(time.perf_counter()), "not_before_ms": ms(not_before), "polls": polls,
                  "wasted_tokens": now["tokens_after_cancel"] - before["tokens_after_cancel"],
                  # sim's own measure (the baseline has none): the slowest end-to-release.
                  "end_to_release_max_ms": now["end_to_release_max_us"] / 1e3
                  if "end_to_release_max_us" in now else None}))
EOF
echo "load average before: $(loadavg) ($(nproc) cores)" >&2
alternate() { if [ $(($1 % 2)) = 1 ]; then echo sim baseline; else echo baseline sim; fi; }
# label streams tokens step_ms: as fast as the server goes, and many streams at a decode pace.
scenarios=${SCENARIOS:-"1x200000@0 64x20000@0 256x400@5 64x500@10 64x5000@1"}
for scenario in $scenarios; do
  streams=${scenario%%x*}; rest=${scenario#*x}; tokens=${rest%@*}; step=${rest#*@}
  for run in $(seq "$cpu_runs"); do
    for server in $(alternate "$run"); do
      throughput "$server" "$scenario" "$streams" "$tokens" "$step"
    done
  done
done
for streams in $cpu_streams; do
  for run in $(seq "$cpu_runs"); do
    for server in $(alternate "$run"); do cpu_per_event "$server" "$streams"; done
  done
done
for server in sim baseline; do rss_per_stream "$server"; done
for run in $(seq "$release_runs"); do
  for server in $(alternate "$run"); do release "$server" "$run"; done
done
for run in $(seq "$release_runs"); do
  for server in $(alternate "$run"); do release_tight "$server" "$run"; done
done
echo "load average after: $(loadavg)" >&2

python3 - "$results" <<'EOF'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
def median(measure, server, key, **match):
    values = [r[key] for r in rows if r["measure"] == measure and r["server"] == server
              and all(r[k] == v for k, v in match.items()) and r[key] is not None]
    return statistics.median(values) if values else None
lines = ["", "| measure | sim | baseline | ratio (sim / baseline) |", "|---|---|---|---|"]
def line(label, measure, key, unit, ratio=True, **match):
    sim, base = median(measure, "sim", key, **match), median(measure, "baseline", key, **match)
    ratio = f"{sim / base:.2f}" if ratio and sim is not None and base else ""
    def fmt(v):
        if v is None:
            return "n/a"
        return f"{v:,.2f} {unit}" if unit and isinstance(v, float) else f"{round(v):,} {unit}".strip()
    lines.append(f"| {label} | {fmt(sim)} | {fmt(base)} | {ratio} |")
for scenario in dict.fromkeys(r["scenario"] for r in rows if r["measure"] == "throughput"):
    first = next(r for r in rows if r["measure"] == "throughput" and r["scenario"] == scenario)
    runs = sum(1 for r in rows if r["measure"] == "throughput" and r["scenario"] == scenario and r["server"] == "sim")
    pace = "as fast as possible" if first["step_ms"] == 0 else f"one token every {first['step_ms']} ms"
    title = f"{first['streams']} stream{'s' if first['streams'] > 1 else ''}, {pace} (median of {runs})"
    line(f"{title}: events/s", "throughput", "events_per_s", "", scenario=scenario)
    line("  client gap p99", "throughput", "gap_p99_ms", "ms", scenario=scenario)
    line("  server CPU per event", "throughput", "cpu_s_per_million_events", "s / 1M events", scenario=scenario)
    line("  server peak RSS", "throughput", "peak_rss_mib", "MiB", scenario=scenario)
for streams in sorted({r["streams"] for r in rows if r["measure"] == "cpu_per_event"}):
    step = next(r["step_ms"] for r in rows if r["measure"] == "cpu_per_event")
    runs = sum(1 for r in rows if r["measure"] == "cpu_per_event" and r["server"] == "sim" and r["streams"] == streams)
    label = f"CPU per event, {streams} streams x {1000 // step} tokens/s (median of {runs})"
    line(label, "cpu_per_event", "cpu_s_per_million_events", "s / 1M events", streams=streams)
    line(f"  events/s delivered (offered {streams * 1000 // step:,})", "cpu_per_event", "events_per_s", "", streams=streams)
for r in rows:
    if r["measure"] == "rss_per_stream":
        streams = r["streams"]
line(f"RSS per open stream ({streams:,} stalled)", "rss_per_stream", "bytes_per_stream", "B")
runs = sum(1 for r in rows if r["measure"] == "release" and r["server"] == "sim")
line(f"release after the last of 100 disconnects (median of {runs})", "release", "released_after_last_disconnect_ms", "ms")
def every(measure, key):
    values = [", ".join(map(str, sorted(r[key] for r in rows if r["measure"] == measure and r["server"] == server)))
              for server in ("sim", "baseline")]
    lines.append(f"|   every run (ms) | {values[0]} | {values[1]} | |")
every("release", "released_after_last_disconnect_ms")
line(f"the same, /stats polled back to back on one connection (median of {runs})", "release_tight", "released_ms", "ms")
every("release_tight", "released_ms")
line("  the last poll that still saw a generator or a block was sent at (median)", "release_tight", "not_before_ms", "ms", ratio=False)
line("  inside sim: the slowest stream's end to release, as its gate measures it (median)", "release_tight", "end_to_release_max_ms", "ms", ratio=False)
print("\n".join(lines))
EOF
