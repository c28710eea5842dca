#!/usr/bin/env bash
# streamgate-llama (engine/) against llama.cpp's own llama-server, in one run on this machine:
# the same model (SmolLM2-135M Q4_1), threads, context and slots (a KV stream per slot), both
# servers up at once and measured in turns, `streamgate loadgen` as the client. Greedy answers of exactly TOKENS tokens
# (`ignore_eos`), `cache_prompt: false` (llama-server would otherwise answer every repeat of
# loadgen's one prompt from its prompt cache, which streamgate-llama does not have).
#   bash benches/engine_vs_llama.sh                      # RUNS=3 TOKENS=200 THREADS=2
# Prints one JSON line per (scenario, server, run), then the medians and the median of each
# run's ratio (measured in turn, a second apart) as a Markdown table, with the command. Then,
# streamgate-llama alone, started fresh for each: four readers that keep up, without and with
# a fifth that stops reading (its sequence paused) in the slot before theirs or between them,
# their gap p99 compared.
# Needs scripts/real-model.sh's build of llama-server (~15-20 minutes the first time).
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/common/listening.sh
runs=${RUNS:-3}
tokens=${TOKENS:-200}
threads=${THREADS:-2}
eval "$(bash scripts/real-model.sh | tail -2)" # LLAMA_SERVER, GGUF
cargo build --release --bin streamgate >&2
(cd engine && cargo build --release >&2)
target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
streamgate=$target/release/streamgate
engine=$target/release/streamgate-llama
scratch=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$scratch"' EXIT

# Both: 8 slots of 1,024 tokens, a KV stream each, THREADS threads. Each writes its log under
# its name.
start() { # server [extra flags] -> sets addr and pid
  local server=$1; shift
  local log=$scratch/$server.log
  rm -f "$log" # not the last run's address: the shell truncates it after forking
  case $server in
    llama-server)
      "$LLAMA_SERVER" -m "$GGUF" --host 127.0.0.1 --port "$(free_port)" -t "$threads" -c 8192 -np 8 \
        > "$log" 2>&1 & ;;
    streamgate-llama)
      "$engine" -m "$GGUF" --addr 127.0.0.1:0 -t "$threads" -c 8192 --parallel 8 "$@" > "$log" 2>&1 & ;;
  esac
  pid=$!
  addr=$(listening_addr "$log" 600) || { echo "$server did not start" >&2; cat "$log" >&2; exit 1; }
  # One answer first: the first step builds llama.cpp's graphs and pages the model in.
  "$streamgate" loadgen --addr "$addr" --streams 1 --tokens 8 --extra "$extra" --json > /dev/null
}

stop() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

extra='{"temperature":0,"ignore_eos":true,"cache_prompt":false}'
results=$scratch/results.jsonl
# Both servers run (idle but for the one measured: their threads sleep between requests), and
# each measurement of one is followed by the same of the other, in turns that alternate which
# goes first: the machine's drift (it is shared) falls on both alike.
start llama-server; llama_addr=$addr; llama_pid=$pid
start streamgate-llama; engine_addr=$addr; engine_pid=$pid
pid=
trap 'kill "$llama_pid" "$engine_pid" 2>/dev/null; rm -rf "$scratch"' EXIT
for run in $(seq "$runs"); do
  for streams in 1 4 8; do
    servers="llama-server streamgate-llama"
    [ $((run % 2)) = 0 ] && servers="streamgate-llama llama-server"
    for server in $servers; do
      addr=$llama_addr
      [ "$server" = streamgate-llama ] && addr=$engine_addr
      sleep 1 # the other's threads asleep
      result=$("$streamgate" loadgen --addr "$addr" --streams "$streams" --tokens "$tokens" \
        --extra "$extra" --json)
      echo "{\"scenario\":\"$streams streams\",\"server\":\"$server\",\"run\":$run,\"streams\":$streams,\"tokens\":$tokens,\"loadgen\":$result}" \
        | tee -a "$results"
    done
  done
done
kill "$llama_pid" "$engine_pid" 2>/dev/null; wait "$llama_pid" "$engine_pid" 2>/dev/null || true
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$scratch"' EXIT

# A reader that stops: its socket takes 4 KiB, the engine's 4 KiB with 1 KiB unsent at most,
# its gate 8 events, and it is never ended (the deadline is past the run), so its sequence is
# paused, KV kept, for the whole run of the others.
stopped_reader() { # addr tokens -> its pid in $reader
  python3 - "$1" "$2" <<'EOF' &
import json, socket, sys, time
host, port = sys.argv[1].split(":")
body = json.dumps({"messages": [{"role": "user", "content": "Tell me a story."}],
                   "max_tokens": int(sys.argv[2]) * 4, "temperature": 0, "ignore_eos": True,
                   "stream": True})
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
s.connect((host, int(port)))
s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
          f"content-length: {len(body)}\r\n\r\n{body}".encode())
s.recv(256)
time.sleep(600)
EOF
  reader=$!
}
until_paused() { # addr n: waits until n sequences are paused
  for _ in $(seq 1200); do
    paused=$(curl -s "http://$1/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["sequences_paused"])')
    [ "$paused" = "$2" ] && return 0
    sleep 0.05
  done
  echo "$2 sequences never paused (now $paused)" >&2; exit 1
}
paused_flags=(--sndbuf 4096 --notsent-lowat 1024 --buffer-events 8 --slow-deadline-ms 600000)
for run in $(seq "$runs"); do
  # Alone; beside a paused sequence in slot 0 (it came first: the four decode in slots 1-4);
  # beside one paused in slot 2 (two that held slots 0 and 1 left: the four take slots 0, 1,
  # 3 and 4, around it, and the engine moves it out of their way).
  for with in alone first between; do
    start streamgate-llama "${paused_flags[@]}"
    readers=()
    case $with in
      first)
        stopped_reader "$addr" "$tokens"; readers+=("$reader"); until_paused "$addr" 1 ;;
      between)
        for n in 1 2 3; do stopped_reader "$addr" "$tokens"; readers+=("$reader"); until_paused "$addr" "$n"; done
        kill "${readers[0]}" "${readers[1]}"
        until_paused "$addr" 1 ;;
    esac
    result=$("$streamgate" loadgen --addr "$addr" --streams 4 --tokens "$tokens" --extra "$extra" --json)
    after=$(curl -s "http://$addr/stats" | python3 -c 'import json,sys; s=json.load(sys.stdin); print(json.dumps({k: s[k] for k in ("sequences_paused", "slot_moves")}))')
    echo "{\"scenario\":\"4 readers, $with\",\"server\":\"streamgate-llama\",\"run\":$run,\"streams\":4,\"tokens\":$tokens,\"engine_after\":$after,\"loadgen\":$result}" \
      | tee -a "$results"
    if [ "${#readers[@]}" -gt 0 ]; then kill "${readers[@]}" 2>/dev/null || true; fi
    stop
  done
done

python3 - "$results" "$runs" "$tokens" "$threads" <<'EOF'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
runs, tokens, threads = sys.argv[2], sys.argv[3], sys.argv[4]
def med(scenario, server, f):
    values = [f(r) for r in rows if r["scenario"] == scenario and r["server"] == server]
    return statistics.median(values) if values else None
tps = lambda r: r["streams"] * r["tokens"] / r["loadgen"]["wall_s"]
measures = [("tokens/s", tps, "higher"), ("TTFT p50 ms", lambda r: r["loadgen"]["ttfe_p50_ms"], "lower"),
            ("gap p50 ms", lambda r: r["loadgen"]["gap_p50_ms"], "lower"),
            ("gap p99 ms", lambda r: r["loadgen"]["gap_p99_ms"], "lower")]
print(f"\n`RUNS={runs} TOKENS={tokens} THREADS={threads} bash benches/engine_vs_llama.sh` (medians of {runs})\n")
print("| streams | measure | llama-server | streamgate-llama | ratio, median of the runs' (range) |")
print("|---|---|---|---|---|")
def paired(scenario, f):
    """The median of each run's ratio (streamgate-llama over llama-server, measured in turn)."""
    by_run = {}
    for r in rows:
        if r["scenario"] == scenario:
            by_run.setdefault(r["run"], {})[r["server"]] = f(r)
    ratios = [v["streamgate-llama"] / v["llama-server"] for v in by_run.values() if len(v) == 2]
    return statistics.median(ratios), min(ratios), max(ratios)
for scenario in ["1 streams", "4 streams", "8 streams"]:
    for name, f, _ in measures:
        base, ours = med(scenario, "llama-server", f), med(scenario, "streamgate-llama", f)
        ratio, low, high = paired(scenario, f)
        print(f"| {scenario.split()[0]} | {name} | {base:.1f} | {ours:.1f} | {ratio:.2f}x ({low:.2f}-{high:.2f}) |")
print("\n| streamgate-llama, 4 readers that keep up | gap p50 ms | gap p99 ms | tokens/s |")
print("|---|---|---|---|")
names = {"alone": "alone", "first": "beside a paused sequence in slot 0",
         "between": "beside a paused sequence in slot 2, between theirs (0, 1, 3, 4)"}
for key, label in names.items():
    scenario = f"4 readers, {key}"
    cells = [med(scenario, "streamgate-llama", f) for f in (measures[2][1], measures[3][1], tps)]
    print(f"| {label} | {cells[0]:.1f} | {cells[1]:.1f} | {cells[2]:.1f} |")
for key in ["first", "between"]:
    # Paired as above: each run measures alone, first and between in turn.
    by_run = {}
    for r in rows:
        if r["scenario"] in ("4 readers, alone", f"4 readers, {key}"):
            by_run.setdefault(r["run"], {})[r["scenario"]] = measures[3][1](r)
    ratios = [v[f"4 readers, {key}"] / v["4 readers, alone"] for v in by_run.values() if len(v) == 2]
    moves = [r["engine_after"]["slot_moves"] for r in rows if r["scenario"] == f"4 readers, {key}"]
    print(f"\nthe others' gap p99 beside a paused sequence ({key}): {statistics.median(ratios):.2f}x alone "
          f"(median of the runs' ratios, {min(ratios):.2f}-{max(ratios):.2f}); slot moves per run: {moves}")
EOF
