#!/usr/bin/env bash
# What `streamgate proxy`'s Redis resume store costs against its memory store (issue 27), in one
# run on this machine: one `streamgate sim` upstream (one token every 1000/RATE ms per stream),
# one `redis-server` of our own (a free port of 127.0.0.1, its own dir, `--save '' --appendonly
# no`), and for each store a fresh proxy (`--resume-grace-ms 30000`, and `--resume-store
# redis://127.0.0.1:PORT` for Redis) loaded by `streamgate loadgen` with STREAMS streams of
# TOKENS tokens, every client reading to [DONE] (no resumes: every event still goes through the
# store). RUNS runs per store, alternating which goes first; Redis is flushed (FLUSHALL) and its
# counters reset (CONFIG RESETSTAT) before each Redis run.
# Per run: the proxy's CPU (utime+stime from /proc) per event the clients received, Redis's CPU
# per event, the Redis commands per event by name (INFO commandstats), the client gap p50/p99
# (loadgen), events delivered; a run where any stream did not complete fails the script.
# loadgen's gap quantiles are the top of a log-linear bucket at most 12.5% wide (a 20 ms pace
# reads 23.069 ms), so a gap p99 ratio moves in steps of about 1.1x; the max is exact.
# Prints one JSON line per run, then a Markdown table of medians (for BENCHMARKS.md) with the
# ratios redis/memory against the goals of issue 27.
#
#   bash benches/resume_store.sh
#   STREAMS=200 TOKENS=750 RATE=50 RUNS=3 bash benches/resume_store.sh   # the defaults (~15 s a run)
#
# Without redis-server (or redis-cli) it says SKIPPED and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/common/listening.sh
. benches/common/proxy.sh
streams=${STREAMS:-200}
tokens=${TOKENS:-750}
rate=${RATE:-50}
runs=${RUNS:-3}
step_ms=$((1000 / rate))
grace_ms=30000

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  echo "resume_store: SKIPPED: redis-server or redis-cli is not installed" >&2
  exit 0
fi
ulimit -n "$(ulimit -Hn)"
cargo build --release -p streamgate-cli --bin streamgate >&2
bin=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/streamgate
work=$(mktemp -d)
pids=""
trap 'for p in $pids; do kill -KILL "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$work"' EXIT
tick=$(getconf CLK_TCK)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
rcli() { redis-cli -h 127.0.0.1 -p "$redis_port" "$@"; }
# A compile running beside the load would be measured with it: wait until none runs.
wait_for_no_build() {
  while pgrep -x cargo >/dev/null || pgrep -x rustc >/dev/null; do
    echo "resume_store: a cargo build is running; waiting" >&2; sleep 5
  done
}

redis_port=$(free_port)
mkdir "$work/redis"
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$work/redis" \
  > "$work/redis/out" 2>&1 &
redis_pid=$!; pids="$pids $redis_pid"
for _ in $(seq 100); do [ "$(rcli ping 2>/dev/null)" = PONG ] && break; sleep 0.05; done
[ "$(rcli ping)" = PONG ] || { echo "redis-server did not start" >&2; cat "$work/redis/out" >&2; exit 1; }

"$bin" sim --addr 127.0.0.1:0 --step-ms "$step_ms" --kv-blocks 1000000 > "$work/sim.out" 2>&1 &
pids="$pids $!"
sim_addr=$(listening_addr "$work/sim.out") || { echo "sim did not start" >&2; cat "$work/sim.out" >&2; exit 1; }

run() { # store run
  local store=$1 n=$2 flags=(--resume-grace-ms "$grace_ms")
  [ "$store" = redis ] && flags+=(--resume-store "redis://127.0.0.1:$redis_port")
  "$bin" proxy --addr 127.0.0.1:0 --upstream "http://$sim_addr" "${flags[@]}" > "$work/proxy.out" 2>&1 &
  local proxy=$!; pids="$pids $proxy"
  local addr; addr=$(listening_addr "$work/proxy.out") || { echo "proxy did not start" >&2; cat "$work/proxy.out" >&2; exit 1; }
  wait_for_no_build
  # Counted from here: what the proxy did at startup (its connection, any SCRIPT LOAD) is not.
  rcli flushall > /dev/null
  rcli config resetstat > /dev/null
  local proxy0 redis0 proxy1 redis1
  proxy0=$(cpu_ticks "$proxy"); redis0=$(cpu_ticks "$redis_pid")
  "$bin" loadgen --addr "$addr" --stats "$sim_addr" --json --streams "$streams" --tokens "$tokens" \
    > "$work/loadgen.json" || true # exit 1 when a stream failed: checked below, with the report
  proxy1=$(cpu_ticks "$proxy"); redis1=$(cpu_ticks "$redis_pid")
  rcli info commandstats > "$work/commandstats"
  kill "$proxy"; wait "$proxy" 2>/dev/null || true
  python3 - "$store" "$n" "$streams" "$tick" "$((proxy1 - proxy0))" "$((redis1 - redis0))" \
    "$work/loadgen.json" "$work/commandstats" <<'EOF'
import json, sys
store, n, streams, hz, proxy_ticks, redis_ticks, report, stats = sys.argv[1:]
r = json.load(open(report))
if r["completed"] != int(streams) or r["failed"]:
    sys.exit(f"resume_store: {store} run {n}: {r['completed']} of {streams} streams completed, "
             f"{r['failed']} failed: {r['errors']}")
events = r["events"]
per_event = lambda ticks: round(int(ticks) / int(hz) / events * 1e6, 2)
# `cmdstat_NAME:calls=C,usec=U,...`. The commands a Lua script runs (redis.call) are counted
# under their own names as well as the script's EVAL/EVALSHA (checked on Redis 7.0: an EVAL of
# XADD + PEXPIRE counts eval 1, xadd 1, pexpire 1), and EVAL's usec includes theirs: calls/event
# is what Redis executed, but do not sum the usec column. Our own CONFIG RESETSTAT is left out.
commands = {}
for line in open(stats):
    if line.startswith("cmdstat_") and not line.startswith("cmdstat_config|resetstat:"):
        name, fields = line.strip()[len("cmdstat_"):].split(":", 1)
        f = dict(kv.split("=") for kv in fields.split(","))
        commands[name] = {"calls_per_event": round(int(f["calls"]) / events, 3),
                          "usec_per_event": round(int(f["usec"]) / events, 2)}
print(json.dumps({"store": store, "run": int(n), "events": events, "completed": r["completed"],
                  "wall_s": r["wall_s"], "events_per_s": r["events_per_s"],
                  "gap_p50_ms": r["gap_p50_ms"], "gap_p99_ms": r["gap_p99_ms"], "gap_max_ms": r["gap_max_ms"],
                  "proxy_cpu_us_per_event": per_event(proxy_ticks),
                  "redis_cpu_us_per_event": per_event(redis_ticks) if store == "redis" else None,
                  "redis_commands": commands if store == "redis" else None}))
EOF
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores), $(redis-server --version | cut -d' ' -f1-3)" >&2
for n in $(seq "$runs"); do
  if [ $((n % 2)) = 1 ]; then order="memory redis"; else order="redis memory"; fi
  for store in $order; do
    run "$store" "$n" >> "$work/runs.jsonl" # not in a pipe: the trap must see the proxy's pid
    tail -n 1 "$work/runs.jsonl"
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

python3 - "$work/runs.jsonl" "$streams" "$tokens" "$rate" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
streams, tokens, rate = sys.argv[2:]
med = lambda store, k: statistics.median(r[k] for r in rows if r["store"] == store)
runs = sum(r["store"] == "redis" for r in rows)
print(f"\n{streams} streams x {tokens} tokens at {rate} tokens/s each, through `streamgate proxy "
      f"--resume-grace-ms 30000`; medians of {runs} run(s) per store")
print("\n| measure | memory | redis | redis / memory | goal | met |\n|---|---|---|---|---|---|")
def row(label, k, goal=None, ratio=True):
    m, r = med("memory", k), med("redis", k)
    q = r / m if ratio and m else None
    met = "" if goal is None else ("yes" if (q if ratio else r) <= goal else "**no**")
    goal_text = "" if goal is None else (f"<= {goal}x" if ratio else f"<= {goal} us")
    print(f"| {label} | {m if m is not None else ''} | {r} | {f'{q:.2f}x' if q else ''} | {goal_text} | {met} |")
row("proxy CPU per event (us)", "proxy_cpu_us_per_event", 1.3)
row("client gap p99 (ms)", "gap_p99_ms", 1.1)
row("client gap p50 (ms)", "gap_p50_ms")
row("client gap max (ms)", "gap_max_ms")
row("events delivered", "events")
row("events/s", "events_per_s")
print(f"| Redis CPU per event (us) | | {med('redis', 'redis_cpu_us_per_event')} | | <= 5 us | "
      f"{'yes' if med('redis', 'redis_cpu_us_per_event') <= 5 else '**no**'} |")
redis = [r["redis_commands"] for r in rows if r["store"] == "redis"]
names = sorted({c for r in redis for c in r}, key=lambda c: -max(r.get(c, {}).get("calls_per_event", 0) for r in redis))
print("\nRedis commands per event (commands run inside Lua scripts are counted under their own "
      "names too; EVAL's usec includes theirs)")
print("\n| command | calls / event | Redis usec / event |\n|---|---|---|")
for c in names:
    g = lambda k: statistics.median(r.get(c, {}).get(k, 0) for r in redis)
    print(f"| {c} | {g('calls_per_event')} | {g('usec_per_event')} |")
EOF
