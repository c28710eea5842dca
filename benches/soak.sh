#!/usr/bin/env bash
# The soak (issue 27): STREAMS concurrent streams for SECONDS through two `streamgate proxy`
# instances (a Redis resume store of our own, `--resume-grace-ms 15000`) in front of two
# `streamgate sim` replicas (one token a second per stream), with misbehaving readers and
# faults on a schedule, then the invariants checked.
#
# Clients (`streamgate loadgen --duration-s`, each client starting a new stream of TOKENS
# tokens when its last ends, every text checked against sim's answer, a cut stream taken up
# again at the other proxy): half keep up, through proxy A; the other half through proxy B
# are a mix: 15% stop reading for 15 s, 15% hang up and resume, 10% hang up, 10% vanish
# (neither read nor close for 15 s), 10% reset (RST) after 5 events, the rest keep up.
# Faults, every CYCLE seconds (the first cycle starts after the ramp): at 15% of it sim 1 is
# killed (SIGKILL) and restarted 5 s later; at 30% Redis is restarted (SHUTDOWN SAVE, as
# `systemctl restart redis` does, and started again on its dump); at 45% proxy A is killed
# (SIGKILL: its clients take their streams up at B, which adopts them) and restarted 5 s
# later; at 60% an RST storm (2,000 clients at B that reset after 2 events); at 70% 500
# slowloris connections to B.
# The invariants, at the end: every stream's text is sim's answer (whole when it completed;
# nothing lost, repeated or reordered), every other stream ended with a terminal frame that
# says why or was left by its reader, the readers that keep up completed every stream, no
# resume lost or repeated an event; every slowloris connection was closed by the proxy; each
# sim's `generators_running` and `kv_blocks_in_use` and each proxy's `streams_running` back to
# 0, its `streams_started` the sum of its `streams_ended`; each process's descriptors back to
# its baseline (+8); each sim's and proxy's RSS at most 16 MiB above its baseline (an idle
# process gives the allocator's free pages back every 10 s; glibc would otherwise keep the
# pages of the peak); Redis's keys all expired; no panic in any log. It prints the figures (peak RSS per stream,
# CPU, the gap p99 of the readers that keep up, failovers, resumes) as JSON and a Markdown
# table, and exits 1 if an invariant does not hold.
#
#   bash benches/soak.sh                                  # 10,000 streams, 3 minutes
#   STREAMS=2000 SECONDS_TOTAL=180 CYCLE=90 bash benches/soak.sh  # CI's (two cycles of faults)
#   SECONDS_TOTAL=3600 bash benches/soak.sh               # the hour-long soak (20 cycles)
#
# The servers spend about a core per 2,000 streams (one token a second each), and the proxy
# that takes over the other's streams holds two descriptors per stream: 10,000 streams need
# ~5 cores and a descriptor limit of 25,000. The script raises its limit itself where it may
# (root with CAP_SYS_RESOURCE raises the hard one) and refuses to start below what STREAMS
# needs. Without redis-server it says SKIPPED and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
streams=${STREAMS:-10000}
total=${SECONDS_TOTAL:-180}
cycle=${CYCLE:-180}
tokens=${TOKENS:-30}
ramp=${RAMP:-20}

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  echo "soak: SKIPPED: redis-server or redis-cli is not installed" >&2
  exit 0
fi
want_fds=$((streams * 4 + 10000))
[ "$(ulimit -Hn)" -lt "$want_fds" ] && { ulimit -Hn "$want_fds" 2>/dev/null || true; }
ulimit -n "$(ulimit -Hn)"
if [ "$(ulimit -n)" -lt $((streams * 2 + 5000)) ]; then
  echo "soak: the descriptor limit $(ulimit -n) is too low for $streams streams (raise it, or run as root)" >&2
  exit 1
fi
cargo build --release -p streamgate-cli --bin streamgate >&2
bin=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/streamgate
work=$(mktemp -d)
trap 'exec 2>/dev/null; pkill -KILL -P $$ 2>/dev/null || true; for p in $(cat "$work"/*.pid 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done; wait 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
log() { printf '[soak %4ss] %s\n' "$(( $(date +%s) - t0 ))" "$*" >&2; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
t0=$(date +%s)

redis_port=$(free_port)
sim_ports=("$(free_port)" "$(free_port)")
proxy_ports=("$(free_port)" "$(free_port)")
rcli() { redis-cli -h 127.0.0.1 -p "$redis_port" "$@"; }
mkdir "$work/redis"

# Each process is started (and restarted) by name: its pid in NAME.pid, its output appended to
# NAME.log (a restart's after the last's, so the panic check reads every run).
start_redis() {
  redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$work/redis" --dbfilename dump.rdb >> "$work/redis.log" 2>&1 &
  echo $! > "$work/redis.pid"
  for _ in $(seq 200); do [ "$(rcli ping 2>/dev/null)" = PONG ] && return 0; sleep 0.05; done
  echo "soak: redis-server did not start" >&2; exit 1
}
start_sim() { # n
  local n=$1 before; before=$(grep -c 'listening on' "$work/sim$n.log" 2>/dev/null || true)
  "$bin" sim --addr "127.0.0.1:${sim_ports[$n]}" --step-ms 1000 --kv-blocks 10000000 \
    --heartbeat-ms 2000 >> "$work/sim$n.log" 2>&1 &
  echo $! > "$work/sim$n.pid"
  wait_listening "$work/sim$n.log" "${sim_ports[$n]}" "${before:-0}"
}
start_proxy() { # n
  local n=$1 before; before=$(grep -c 'listening on' "$work/proxy$n.log" 2>/dev/null || true)
  "$bin" proxy --addr "127.0.0.1:${proxy_ports[$n]}" \
    --upstream "http://127.0.0.1:${sim_ports[0]}" --upstream "http://127.0.0.1:${sim_ports[1]}" \
    --resume-store "redis://127.0.0.1:$redis_port" --resume-grace-ms 15000 \
    --slow-deadline-ms 10000 --heartbeat-ms 2000 >> "$work/proxy$n.log" 2>&1 &
  echo $! > "$work/proxy$n.pid"
  wait_listening "$work/proxy$n.log" "${proxy_ports[$n]}" "${before:-0}"
}
wait_listening() { # log port earlier-lines
  for _ in $(seq 400); do
    [ "$(grep -c "listening on http://127.0.0.1:$2" "$1" || true)" -gt "$3" ] && return 0
    sleep 0.05
  done
  echo "soak: $1 is not listening" >&2; tail -5 "$1" >&2; exit 1
}
pid() { cat "$work/$1.pid"; }
# A process's descriptors, resident memory (KiB) and CPU ticks (empty once it is gone).
fds() { ls "/proc/$(pid "$1")/fd" | wc -l; }
rss() { awk '/^VmRSS/ {print $2}' "/proc/$(pid "$1")/status"; }
ticks() { { sed 's/.*) //' "/proc/$(pid "$1")/stat" 2>/dev/null || true; } | awk '{print $12 + $13}'; }
# The CPU each server spent from the baseline on, across its restarts: what a run used so far
# is added before it is killed.
declare -A spent
spend() { spent[$1]=$(( ${spent[$1]:-0} + $(ticks "$1") )); }
stats() { curl -s --max-time 5 "http://127.0.0.1:$1/stats"; }
restart() { # name starter n
  local name=$1
  spend "$name"
  kill -KILL "$(pid "$name")"; wait "$(pid "$name")" 2>/dev/null || true
  log "$name killed"
  sleep 5
  "$2" "$3"
  log "$name restarted"
}

start_redis
start_sim 0; start_sim 1
start_proxy 0; start_proxy 1
procs="redis sim0 sim1 proxy0 proxy1"
# Baselines, after one stream through each proxy (its connections to Redis and the sims made).
for port in "${proxy_ports[@]}"; do
  "$bin" loadgen --addr "127.0.0.1:$port" --streams 1 --tokens 2 --json > /dev/null
done
declare -A base_fds base_rss peak_rss client_ticks
for p in $procs; do base_fds[$p]=$(fds "$p"); base_rss[$p]=$(rss "$p"); peak_rss[$p]=${base_rss[$p]}; done
for p in $procs; do spent[$p]=$(( -$(ticks "$p") )); done
log "baseline: $(for p in $procs; do printf '%s %s fds %s KiB; ' "$p" "${base_fds[$p]}" "${base_rss[$p]}"; done)"

half=$((streams / 2))
common=(--tokens "$tokens" --duration-s "$total" --ramp-s "$ramp" --expect-sim-text --json)
a="127.0.0.1:${proxy_ports[0]}"; b="127.0.0.1:${proxy_ports[1]}"
"$bin" loadgen --addr "$a" --failover-addr "$b" --streams "$half" "${common[@]}" \
  > "$work/keepers.json" 2> "$work/keepers.log" &
keepers=$!
echo "$keepers" > "$work/keepers.pid"
"$bin" loadgen --addr "$b" --failover-addr "$a" --streams "$((streams - half))" "${common[@]}" \
  --slow 0.15 --stop-s 15 --resume 0.15 --disconnect 0.1 --vanish 0.1 --reset 0.1 --after 5 \
  > "$work/mix.json" 2> "$work/mix.log" &
mix=$!
echo "$mix" > "$work/mix.pid"

# The faults, cycle by cycle after the ramp, while the clients run; the peaks sampled each second.
at() { # second of the run, relative to its start
  local p r c t
  while [ $(( $(date +%s) - t0 )) -lt "$1" ]; do
    for p in $procs; do
      r=$(rss "$p" 2>/dev/null || echo 0); [ "$r" -gt "${peak_rss[$p]}" ] && peak_rss[$p]=$r
    done
    for c in keepers mix; do t=$(ticks "$c"); if [ -n "$t" ]; then client_ticks[$c]=$t; fi; done
    sleep 1
  done
}
start=$(( $(date +%s) - t0 ))
faults=(); storms=()
for ((c = 0; c * cycle < total; c++)); do
  s=$((start + ramp + c * cycle))
  [ $((s + cycle * 70 / 100 - start)) -ge "$total" ] && break
  at $((s + cycle * 15 / 100)); restart sim0 start_sim 0; faults+=("sim0 killed")
  at $((s + cycle * 30 / 100))
  spend redis; rcli shutdown save > /dev/null 2>&1 || true
  wait "$(pid redis)" 2>/dev/null || true
  log "redis stopped (SHUTDOWN SAVE)"; sleep 2; start_redis; log "redis restarted"; faults+=("redis restarted")
  at $((s + cycle * 45 / 100)); restart proxy0 start_proxy 0; faults+=("proxy0 killed")
  at $((s + cycle * 60 / 100))
  "$bin" loadgen --addr "$b" --streams 2000 --tokens "$tokens" --reset 1 --after 2 --json \
    > "$work/storm$c.json" 2>> "$work/storm.log" &
  storms+=($!); log "RST storm: 2000 clients at proxy1"; faults+=("rst storm")
  at $((s + cycle * 70 / 100))
  "$bin" loadgen --addr "$b" --streams 1 --tokens 2 --slowloris 500 --json \
    > "$work/slowloris$c.json" 2>> "$work/slowloris.log" &
  storms+=($!); log "slowloris: 500 connections to proxy1"; faults+=("slowloris")
done
log "faults done; waiting for the clients"
while kill -0 "$keepers" 2>/dev/null || kill -0 "$mix" 2>/dev/null; do at $(( $(date +%s) - t0 + 1 )); done
wait "$keepers" || true; wait "$mix" || true
for s in "${storms[@]}"; do wait "$s" || true; done
cpu_lines=""
for p in $procs; do spend "$p"; cpu_lines="$cpu_lines$p ${spent[$p]}\n"; done
for c in keepers mix; do cpu_lines="$cpu_lines$c ${client_ticks[$c]:-0}\n"; done
log "clients done"

# Everything let go: generators, KV, streams, Redis's keys (the grace, 15 s, and the readers'
# leases run out), descriptors (the proxies' idle pooled upstream connections close after
# 30 s), memory (given back on the first idle tick after that).
settled() {
  for p in $procs; do [ "$(fds "$p")" -le $((base_fds[$p] + 8)) ] || return 1; done
  for p in sim0 sim1 proxy0 proxy1; do [ "$(rss "$p")" -le $((base_rss[$p] + 16384)) ] || return 1; done
  python3 - "$(stats "${sim_ports[0]}")" "$(stats "${sim_ports[1]}")" "$(stats "${proxy_ports[0]}")" \
    "$(stats "${proxy_ports[1]}")" "$(rcli dbsize)" <<'EOF'
import json, sys
sims = [json.loads(s) for s in sys.argv[1:3]]
proxies = [json.loads(s) for s in sys.argv[3:5]]
ok = all(s["generators_running"] == 0 and s["kv_blocks_in_use"] == 0 for s in sims)
ok = ok and all(p["streams_running"] == 0 for p in proxies) and int(sys.argv[5]) == 0
sys.exit(0 if ok else 1)
EOF
}
for _ in $(seq 120); do settled && break; sleep 1; done
log "settled (or 120 s passed)"
fd_lines=""; rss_lines=""
for p in $procs; do
  fd_lines="$fd_lines$p ${base_fds[$p]} $(fds "$p")\n"
  rss_lines="$rss_lines$p ${base_rss[$p]} ${peak_rss[$p]} $(rss "$p")\n"
done
grep -l -E 'panicked|RUST_BACKTRACE' "$work"/*.log > "$work/panics" || true

python3 - "$work" "$streams" "$total" "$(printf "$cpu_lines")" "$(getconf CLK_TCK)" "$(printf "$fd_lines")" \
  "$(printf "$rss_lines")" "$(stats "${sim_ports[0]}")" "$(stats "${sim_ports[1]}")" \
  "$(stats "${proxy_ports[0]}")" "$(stats "${proxy_ports[1]}")" "$(rcli dbsize)" "${#faults[@]}" <<'EOF'
import glob, json, sys
work, streams, total, hz = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[5])
cpu = {name: int(t) for name, t in (l.split() for l in sys.argv[4].splitlines() if l)}
fd_rows = [l.split() for l in sys.argv[6].splitlines() if l]
rss_rows = [l.split() for l in sys.argv[7].splitlines() if l]
sims = [json.loads(s) for s in sys.argv[8:10]]
proxies = [json.loads(s) for s in sys.argv[10:12]]
keys, faults = int(sys.argv[12]), int(sys.argv[13])
keepers = json.load(open(f"{work}/keepers.json"))
mix = json.load(open(f"{work}/mix.json"))
storms = [json.load(open(f)) for f in sorted(glob.glob(f"{work}/storm*.json"))]
lorises = [json.load(open(f))["slowloris"] for f in sorted(glob.glob(f"{work}/slowloris*.json"))]
broken = []
def check(ok, what):
    if not ok:
        broken.append(what)
for name, r in [("keepers", keepers), ("mix", mix)] + [(f"storm{i}", s) for i, s in enumerate(storms)]:
    check(r["text_mismatches"] == 0, f"{name}: {r['text_mismatches']} streams' text is not sim's answer: {r['errors']}")
    check(r["unexplained"] == 0, f"{name}: {r['unexplained']} streams ended with no frame to say why: {r['errors']}")
    check(r["resume_mismatches"] == 0, f"{name}: {r['resume_mismatches']} resumes lost or repeated an event")
check(keepers["completed"] == keepers["streams"], f"keepers: {keepers['streams'] - keepers['completed']} of {keepers['streams']} streams did not complete: {keepers['ended_by']} {keepers['errors']}")
for i, l in enumerate(lorises):
    check(l["opened"] > 0 and l["closed_by_server"] == l["opened"], f"slowloris{i}: the proxy closed {l['closed_by_server']} of {l['opened']}")
for i, s in enumerate(sims):
    check(s["generators_running"] == 0 and s["kv_blocks_in_use"] == 0, f"sim{i}: {s['generators_running']} generators running, {s['kv_blocks_in_use']} KV blocks in use")
for i, p in enumerate(proxies):
    ended = sum(p["streams_ended"].values())
    check(p["streams_running"] == 0, f"proxy{i}: {p['streams_running']} streams running")
    check(p["streams_started"] == ended, f"proxy{i}: {p['streams_started']} streams started, {ended} ended ({p['streams_ended']})")
for name, base, end in fd_rows:
    check(int(end) <= int(base) + 8, f"{name}: {end} descriptors, {base} at the start")
for name, base, peak, end in rss_rows:
    if name != "redis":
        check(int(end) <= int(base) + 16 * 1024, f"{name}: RSS {end} KiB at the end, {base} at the start, {peak} at the peak")
check(keys == 0, f"redis: {keys} keys left after the grace")
panics = open(f"{work}/panics").read().split()
check(not panics, f"a panic in {panics}")
peak_proxy = sum(int(peak) - int(base) for name, base, peak, _ in rss_rows if name.startswith("proxy"))
figures = {
    "streams": streams, "seconds": total, "faults": faults,
    "streams_opened": keepers["streams"] + mix["streams"],
    "events": keepers["events"] + mix["events"],
    "keepers_gap_p50_ms": keepers["gap_p50_ms"], "keepers_gap_p99_ms": keepers["gap_p99_ms"], "keepers_gap_max_ms": keepers["gap_max_ms"],
    "cuts_taken_up": keepers["cuts_taken_up"] + mix["cuts_taken_up"],
    "resumed": mix["resumed"],
    "failovers": {k: sum(p["failovers"][k] for p in proxies) for k in proxies[1]["failovers"]},
    "ended_by": {k: keepers["ended_by"].get(k, 0) + mix["ended_by"].get(k, 0) for k in set(keepers["ended_by"]) | set(mix["ended_by"])},
    "proxy_peak_rss_per_stream_kib": round(peak_proxy / streams, 1),
    "cpu_us_per_event": round(sum(t for n, t in cpu.items() if n not in ("keepers", "mix")) / hz * 1e6 / max(1, keepers["events"] + mix["events"]), 1),
    "cpu_s": {n: round(t / hz, 1) for n, t in cpu.items()},
    "rss_kib": {name: {"start": int(b), "peak": int(p), "end": int(e)} for name, b, p, e in rss_rows},
    "slowloris_longest_held_ms": max((l["longest_held_ms"] or 0) for l in lorises) if lorises else None,
    "broken": broken,
}
print(json.dumps(figures))
print(f"""
| soak: {streams} streams, {total} s, {faults} faults | |
|---|---|
| streams opened, events | {figures['streams_opened']}, {figures['events']} |
| gap of the readers that keep up, p50 / p99 / max | {keepers['gap_p50_ms']} / {keepers['gap_p99_ms']} / {keepers['gap_max_ms']} ms |
| cuts taken up at the other proxy, resumes | {figures['cuts_taken_up']}, {figures['resumed']} |
| failovers (proxies now running) | {figures['failovers']} |
| ended by a terminal frame | {figures['ended_by']} |
| proxy peak RSS per stream | {figures['proxy_peak_rss_per_stream_kib']} KiB |
| RSS start / peak / end (KiB) | {'; '.join(f"{n} {v['start']} / {v['peak']} / {v['end']}" for n, v in figures['rss_kib'].items() if n != 'redis')} |
| CPU of all servers per event; CPU seconds by process | {figures['cpu_us_per_event']} us; {', '.join(f"{n} {v}" for n, v in figures['cpu_s'].items())} |
| slowloris held at most | {figures['slowloris_longest_held_ms']} ms |
""")
for b in broken:
    print("BROKEN:", b, file=sys.stderr)
sys.exit(1 if broken else 0)
EOF
