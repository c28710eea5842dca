#!/usr/bin/env bash
# The soak (issue 27): STREAMS concurrent streams for SECONDS through two `streamgate proxy`
# instances (a Redis resume store of our own, `--resume-grace-ms 15000`) in front of two
# `streamgate sim` replicas (one token every STEP_MS, default 1000, per stream), with
# misbehaving readers and faults on a schedule, then the invariants checked.
#
# Clients (`streamgate loadgen --duration-s`, each client starting a new stream of TOKENS
# tokens when its last ends, every text checked against sim's answer, a cut stream taken up
# again at the other proxy): half keep up through proxy A; through proxy B, 20% keep up, 7.5%
# hang up after 5 events and resume, and 22.5% misbehave (a third stop reading for 15 s, the
# rest in equal parts hang up, vanish (neither read nor close for 15 s) or reset (RST), after
# 5 events).
# Faults, every CYCLE seconds (the first cycle starts after the ramp): at 15% of it the first
# sim is killed (SIGKILL) and restarted 5 s later; at 30% Redis is restarted (SHUTDOWN SAVE, as
# `systemctl restart redis` does, and started again on its dump); at 45% proxy A is killed
# (SIGKILL: its clients take their streams up at B, which adopts them) and restarted 5 s
# later; at 60% an RST storm (2,000 clients at B that reset after 2 events); at 70% 500
# slowloris connections to B.
# The invariants, at the end: every stream's text is sim's answer (whole when it completed;
# nothing lost, repeated or reordered); the readers that keep up and those that resume
# completed every stream, and the resumes lost or repeated no event; a misbehaving reader's
# stream was left by its reader or ended with a `slow_consumer` frame, and no stream ended with
# no frame to say why; every fault had its effect (each kill of the sim made failovers at
# proxy B, each kill of proxy A adoptions at B, every resumer resumed, every storm client
# reset its stream); every slowloris connection was opened and closed by the proxy; no server
# died but those killed; each sim's `generators_running` and `kv_blocks_in_use` and each
# proxy's `streams_running` back to 0 (a stream never released holds them up; a proxy's
# `streams_started` is the sum of its `streams_ended` whenever none runs, both counted by the
# same calls); each process's descriptors back to its baseline (+8); each sim's and proxy's
# RSS at most 16 MiB above its baseline (an idle process gives the allocator's free pages back
# every 10 s; glibc would otherwise keep the pages of the peak); Redis's keys all expired; no panic in any log. It prints the figures
# (peak RSS per stream, CPU by process, the gap p99 of the readers that keep up, failovers,
# resumes) as JSON and a Markdown table, and exits 1 if an invariant does not hold (keeping its
# logs, and saying where).
#
#   bash benches/soak.sh                                  # 10,000 streams, 3 minutes
#   STREAMS=2000 SECONDS_TOTAL=180 CYCLE=90 bash benches/soak.sh  # CI's (two cycles of faults)
#   STREAMS=2000 SECONDS_TOTAL=3600 bash benches/soak.sh  # BENCHMARKS.md's hour (20 cycles)
#   STREAMS=4000 STEP_MS=2000 TOKENS=12 SECONDS_TOTAL=360 bash benches/soak.sh # a limit of 20,000
#
# The servers spend about a core per 2,000 streams (one token a second each; STEP_MS=5000
# gives 10,000 streams the same event rate). Proxy B holds every stream's client once proxy A
# is killed (A's clients take their streams up at B), plus 2,000 RST-storm and 500 slowloris
# connections, and a proxy accepts at most (limit - limit/4) / 2 connections (two descriptors
# per stream): STREAMS needs a descriptor limit of 8 (STREAMS + 2,500) / 3, 33,334 for 10,000.
# Below it B reaches its cap mid-run and new clients wait in its listen backlog: a run of
# 7,500 streams with a limit of 20,000 did, and had not ended 10 minutes past its end (why B
# did not recover as streams ended was not looked into). The script raises its limit itself
# where it may (root with CAP_SYS_RESOURCE raises the hard one) and refuses to start below
# what STREAMS needs. Without redis-server it says SKIPPED and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
streams=${STREAMS:-10000}
total=${SECONDS_TOTAL:-180}
cycle=${CYCLE:-180}
tokens=${TOKENS:-30}
step_ms=${STEP_MS:-1000}
ramp=${RAMP:-20}

if [ "$streams" -lt 40 ]; then
  echo "soak: STREAMS=$streams: at least 40 (each client group gets its share)" >&2
  exit 1
fi
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  echo "soak: SKIPPED: redis-server or redis-cli is not installed" >&2
  exit 0
fi
need_fds=$(((streams + 2500) * 8 / 3 + 1))
want_fds=$((need_fds + 10000))
[ "$(ulimit -Hn)" -lt "$want_fds" ] && { ulimit -Hn "$want_fds" 2>/dev/null || true; }
ulimit -n "$(ulimit -Hn)"
if [ "$(ulimit -n)" -lt "$need_fds" ]; then
  echo "soak: the descriptor limit $(ulimit -n) is too low for $streams streams (raise it, or run as root)" >&2
  exit 1
fi
cargo build --release -p streamgate-cli --bin streamgate >&2
bin=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/streamgate
work=$(mktemp -d)
trap 'rc=$?; { [ -z "${KEEP:-}" ] && [ "$rc" = 0 ]; } || echo "soak: the logs are in $work" >&2; exec 2>/dev/null; pkill -KILL -P $$ || true; for p in $(cat "$work"/*.pid); do kill -KILL "$p" || true; done; wait; [ -n "${KEEP:-}" ] || [ "$rc" != 0 ] || rm -rf "$work"' EXIT
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
  "$bin" sim --addr "127.0.0.1:${sim_ports[$n]}" --step-ms "$step_ms" --kv-blocks 10000000 \
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
alive() { kill -0 "$(pid "$1")" 2>/dev/null; }
# A process's descriptors, resident memory (KiB) and CPU ticks (0, 0 and empty once it is
# gone).
fds() { { ls "/proc/$(pid "$1")/fd" 2>/dev/null || true; } | wc -l; }
rss() { { cat "/proc/$(pid "$1")/status" 2>/dev/null || true; } | awk '/^VmRSS/ {r = $2} END {print r + 0}'; }
ticks() { { sed 's/.*) //' "/proc/$(pid "$1")/stat" 2>/dev/null || true; } | awk '{print $12 + $13}'; }
# The CPU each server spent from the baseline on, across its restarts: what a run used so far
# is added before it is killed.
declare -A spent
spend() { local t; t=$(ticks "$1"); spent[$1]=$(( ${spent[$1]:-0} + ${t:-0} )); }
stats() { curl -s --max-time 5 "http://127.0.0.1:$1/stats"; }
effect() { stats "${proxy_ports[1]}" > "$work/effect$1" || true; }
restart() { # name starter n
  local name=$1
  alive "$name" || { died="$died $name"; log "$name had died before it was killed"; }
  spend "$name"
  kill -KILL "$(pid "$name")" 2>/dev/null || true; wait "$(pid "$name")" 2>/dev/null || true
  log "$name killed"
  sleep 5
  "$2" "$3"
  log "$name restarted"
}

died="" # servers that died but were not killed
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

# The client groups: each a `loadgen`, its report in NAME.json, its pid in NAME.pid.
half=$((streams / 2)); keepers_b=$((streams / 5)); resumers=$((streams * 3 / 40))
common=(--tokens "$tokens" --duration-s "$total" --ramp-s "$ramp" --expect-sim-text --json)
a="127.0.0.1:${proxy_ports[0]}"; b="127.0.0.1:${proxy_ports[1]}"
clients() { # name streams addr failover-addr [flags]
  local name=$1 n=$2 addr=$3 other=$4; shift 4
  "$bin" loadgen --addr "$addr" --failover-addr "$other" --streams "$n" "${common[@]}" "$@" \
    > "$work/$name.json" 2> "$work/$name.log" &
  echo $! > "$work/$name.pid"
}
clients keepers_a "$half" "$a" "$b"
clients keepers_b "$keepers_b" "$b" "$a"
clients resumers "$resumers" "$b" "$a" --resume 1 --after 5
clients mix "$((streams - half - keepers_b - resumers))" "$b" "$a" \
  --slow 0.33 --stop-s 15 --disconnect 0.22 --vanish 0.22 --reset 0.22 --after 5
groups="keepers_a keepers_b resumers mix"

# The faults, cycle by cycle after the ramp, while the clients run; the peaks sampled each second.
at() { # second of the run, relative to its start
  local p r c t
  while [ $(( $(date +%s) - t0 )) -lt "$1" ]; do
    for p in $procs; do
      r=$(rss "$p" 2>/dev/null || echo 0); [ "$r" -gt "${peak_rss[$p]}" ] && peak_rss[$p]=$r
    done
    for c in $groups; do
      [ -f "$work/$c.pid" ] || continue
      t=$(ticks "$c"); if [ -n "$t" ]; then client_ticks[$c]=$t; fi
    done
    sleep 1
  done
}
start=$(( $(date +%s) - t0 ))
faults=(); storms=(); sim_kills=0; proxy_kills=0
for ((c = 0; c * cycle < total; c++)); do
  s=$((start + ramp + c * cycle))
  [ $((s + cycle * 70 / 100 - start)) -ge "$total" ] && break
  # Each kill's effect, seen at the proxy never killed: its failovers around the sim's, its
  # adoptions around the proxy's.
  at $((s + cycle * 15 / 100)); effect "$c.sim.before"; restart sim0 start_sim 0; faults+=("sim0 killed"); sim_kills=$((sim_kills + 1))
  at $((s + cycle * 30 / 100)); effect "$c.sim.after"
  spend redis; rcli shutdown save > /dev/null 2>&1 || true
  wait "$(pid redis)" 2>/dev/null || true
  log "redis stopped (SHUTDOWN SAVE)"; sleep 2; start_redis; log "redis restarted"; faults+=("redis restarted")
  at $((s + cycle * 45 / 100)); effect "$c.proxy.before"; restart proxy0 start_proxy 0; faults+=("proxy0 killed"); proxy_kills=$((proxy_kills + 1))
  at $((s + cycle * 60 / 100)); effect "$c.proxy.after"
  "$bin" loadgen --addr "$b" --streams 2000 --tokens "$tokens" --reset 1 --after 2 --expect-sim-text --json \
    > "$work/storm$c.json" 2>> "$work/storm.log" &
  storms+=($!); log "RST storm: 2000 clients at proxy1"; faults+=("rst storm")
  at $((s + cycle * 70 / 100))
  "$bin" loadgen --addr "$b" --streams 1 --tokens 2 --slowloris 500 --json \
    > "$work/slowloris$c.json" 2>> "$work/slowloris.log" &
  storms+=($!); log "slowloris: 500 connections to proxy1"; faults+=("slowloris")
done
log "faults done; waiting for the clients"
for c in $groups; do
  while alive "$c"; do at $(( $(date +%s) - t0 + 1 )); done
  wait "$(pid "$c")" || true; rm "$work/$c.pid"
done
for s in "${storms[@]}"; do wait "$s" || true; done
for p in $procs; do alive "$p" || died="$died $p"; done
cpu_lines=""
for p in $procs; do spend "$p"; cpu_lines="$cpu_lines$p ${spent[$p]}\n"; done
for c in $groups; do cpu_lines="$cpu_lines$c ${client_ticks[$c]:-0}\n"; done
log "clients done"

# Everything let go: generators, KV, streams, Redis's keys (the grace, 15 s, and the readers'
# leases run out), descriptors (the proxies' idle pooled upstream connections close after
# 30 s), memory (given back on the first idle tick after that).
settled() {
  [ -z "$died" ] || return 0 # not to be waited for
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
for n in 0 1; do
  stats "${sim_ports[$n]}" > "$work/sim$n.final.stats" || true
  stats "${proxy_ports[$n]}" > "$work/proxy$n.final.stats" || true
done

python3 - "$work" "$streams" "$total" "$(printf "$cpu_lines")" "$(getconf CLK_TCK)" "$(printf "$fd_lines")" \
  "$(printf "$rss_lines")" "$(rcli dbsize 2>/dev/null || echo unknown)" "${#faults[@]}" "$sim_kills" \
  "$proxy_kills" "$died" "$groups" <<'EOF'
import glob, json, re, sys
work, streams, total, hz = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[5])
cpu = {name: int(t) for name, t in (l.split() for l in sys.argv[4].splitlines() if l)}
fd_rows = [l.split() for l in sys.argv[6].splitlines() if l]
rss_rows = [l.split() for l in sys.argv[7].splitlines() if l]
keys, faults, sim_kills, proxy_kills = sys.argv[8], int(sys.argv[9]), int(sys.argv[10]), int(sys.argv[11])
died, groups = sys.argv[12].split(), sys.argv[13].split()
broken = []
def check(ok, what):
    if not ok:
        broken.append(what)
def load(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        check(False, f"{path}: no JSON")
        return None
def numbered(pattern):
    return sorted(glob.glob(f"{work}/{pattern}"), key=lambda f: int(re.findall(r"\d+", f.rsplit("/", 1)[1])[-1]))
check(not died, f"servers died that were not killed: {died} (see their logs)")
check(faults > 0, "no fault was injected (SECONDS_TOTAL too short for one CYCLE after the ramp)")
clients = {g: load(f"{work}/{g}.json") for g in groups}
storms = [load(f) for f in numbered("storm*.json")]
loris_runs = [r for r in (load(f) for f in numbered("slowloris*.json")) if r]
lorises = [r["slowloris"] for r in loris_runs]
sims = [load(f"{work}/sim{n}.final.stats") for n in range(2)]
proxies = [load(f"{work}/proxy{n}.final.stats") for n in range(2)]
if broken:
    for b in broken:
        print("BROKEN:", b, file=sys.stderr)
    sys.exit(1)
reports = list(clients.items()) + [(f"storm{i}", s) for i, s in enumerate(storms)]
for name, r in reports:
    check(r["text_mismatches"] == 0, f"{name}: {r['text_mismatches']} streams' text is not sim's answer: {r['errors']}")
    check(r["unexplained"] == 0, f"{name}: {r['unexplained']} streams ended with no frame to say why: {r['errors']}")
    check(r["resume_mismatches"] == 0, f"{name}: {r['resume_mismatches']} resumes lost or repeated an event")
for name in ("keepers_a", "keepers_b", "resumers"):
    r = clients[name]
    check(r["completed"] == r["streams"], f"{name}: {r['streams'] - r['completed']} of {r['streams']} streams did not complete: {r['ended_by']} {r['errors']}")
for name, r in [("mix", clients["mix"])] + [(f"storm{i}", s) for i, s in enumerate(storms)]:
    others = {k: v for k, v in r["ended_by"].items() if k != "slow_consumer"}
    check(not others, f"{name}: streams of misbehaving readers ended by {others}")
check(clients["resumers"]["resumed"] == clients["resumers"]["streams"], f"resumers: {clients['resumers']['resumed']} of {clients['resumers']['streams']} streams resumed")
# Each kill made its streams move: failovers at proxy1 from just before a sim's kill to the
# next fault, adoptions at proxy1 from just before proxy0's kill to the next fault.
def moved(c, kind, of):
    before, after = load(f"{work}/effect{c}.{kind}.before"), load(f"{work}/effect{c}.{kind}.after")
    return of(after) - of(before) if before and after else 0
failovers = lambda p: p["failovers"]["continued"] + p["failovers"]["restarted"]
for c in range(sim_kills):
    check(moved(c, "sim", failovers) > 0, f"cycle {c}: killing a sim made no failover at proxy1")
for c in range(proxy_kills):
    check(moved(c, "proxy", lambda p: p["streams_adopted"]) > 0, f"cycle {c}: killing proxy0 made proxy1 adopt no stream")
check(all(s["disconnected"] == 2000 for s in storms), f"a storm's 2,000 clients did not all reset their streams: {[s['disconnected'] for s in storms]}")
for i, l in enumerate(lorises):
    check(l["opened"] > 0 and l["refused"] == 0 and l["closed_by_server"] == l["opened"], f"slowloris{i}: {l['opened']} opened, {l['refused']} refused, the proxy closed {l['closed_by_server']}")
for i, s in enumerate(sims):
    check(s["generators_running"] == 0 and s["kv_blocks_in_use"] == 0, f"sim{i}: {s['generators_running']} generators running, {s['kv_blocks_in_use']} KV blocks in use")
for i, p in enumerate(proxies):
    check(p["streams_running"] == 0, f"proxy{i}: {p['streams_running']} streams running")
for name, base, end in fd_rows:
    check(int(end) <= int(base) + 8, f"{name}: {end} descriptors, {base} at the start")
for name, base, peak, end in rss_rows:
    if name != "redis":
        check(int(end) <= int(base) + 16 * 1024, f"{name}: RSS {end} KiB at the end, {base} at the start, {peak} at the peak")
check(keys == "0", f"redis: {keys} keys left after the grace")
panics = open(f"{work}/panics").read().split()
check(not panics, f"a panic in {panics}")
peak_proxy = sum(int(peak) - int(base) for name, base, peak, _ in rss_rows if name.startswith("proxy"))
server_s = sum(t for n, t in cpu.items() if n not in groups) / hz
ka, kb = clients["keepers_a"], clients["keepers_b"]
figures = {
    "streams": streams, "seconds": total, "faults": faults,
    "streams_opened": sum(r["streams"] for r in clients.values()),
    "events": sum(r["events"] for r in clients.values()),
    "keepers_a_gap_ms": [ka["gap_p50_ms"], ka["gap_p99_ms"], ka["gap_max_ms"]],
    "keepers_b_gap_ms": [kb["gap_p50_ms"], kb["gap_p99_ms"], kb["gap_max_ms"]],
    "cuts_taken_up": sum(r["cuts_taken_up"] for r in clients.values()),
    "resumed": clients["resumers"]["resumed"],
    "failovers": proxies[1]["failovers"],
    "ended_by": {k: sum(r["ended_by"].get(k, 0) for _, r in reports) for k in set().union(*(r["ended_by"] for _, r in reports))},
    "proxy_peak_rss_per_stream_kib": round(peak_proxy / streams, 1),
    "server_cpu_s": round(server_s, 1),
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
| gap of the readers that keep up, p50 / p99 / max: through A; through B | {' / '.join(map(str, figures['keepers_a_gap_ms']))} ms; {' / '.join(map(str, figures['keepers_b_gap_ms']))} ms |
| cuts taken up at the other proxy, resumes | {figures['cuts_taken_up']}, {figures['resumed']} |
| failovers (the proxy never killed) | {figures['failovers']} |
| ended by a terminal frame | {figures['ended_by']} |
| proxy peak RSS per stream | {figures['proxy_peak_rss_per_stream_kib']} KiB |
| RSS start / peak / end (KiB) | {'; '.join(f"{n} {v['start']} / {v['peak']} / {v['end']}" for n, v in figures['rss_kib'].items() if n != 'redis')} |
| CPU seconds: the servers; by process | {figures['server_cpu_s']}; {', '.join(f"{n} {v}" for n, v in figures['cpu_s'].items())} |
| slowloris held at most | {figures['slowloris_longest_held_ms']} ms |
""")
for b in broken:
    print("BROKEN:", b, file=sys.stderr)
sys.exit(1 if broken else 0)
EOF
