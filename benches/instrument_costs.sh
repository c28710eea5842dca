#!/usr/bin/env bash
# What each of `streamgate sim`'s instruments costs per event, and sim without any of them,
# against cli/examples/baseline_serve.rs (the hand-rolled server of benches/capacity.sh), at
# STREAMS streams of one token every STEP_MS ms:
#   callgrind  instructions, L1 instruction-cache misses and L1 data-cache read and write
#              misses per event delivered, counted by valgrind's callgrind with its cache
#              simulation over one `streamgate loadgen` run of STREAMS x TOKENS (the same counts
#              every run, whatever else the machine does; the kernel is not in them);
#   cpu        the server's utime+stime from /proc per event delivered, STREAMS x CPU_TOKENS,
#              RUNS rounds over every variant (medians; read them as +-1.5 us on a shared
#              machine).
#
# The instruments are left out by a temporary build: benches/instrument_costs.patch, applied to
# a git worktree of HEAD (built into $CARGO_TARGET_DIR/instrument-costs, never committed),
# gives sim a `STREAMGATE_ABLATE=part,...` switch. Its parts: `metrics` (the Prometheus
# recorder), `sent` (the `worker.sent` probe: `Departures` and its ioctl), `write` (the
# `worker.write` probe), `decode_publish` (the generator's two probes), `heartbeat`, `registry`
# (the resume registry: its pump task, replay log and subscriber). To switch layers at run time
# the patch boxes the response's frame stream twice, so "every instrument" is measured in both
# builds. What stays on with every part left out: the buffer-age stamps, the hop-record sink,
# the generator's recorders (made, never fed) and the `metrics` calls (into its no-op recorder).
# The real build is of the working tree, the temporary one of HEAD: commit first.
#
#   bash benches/instrument_costs.sh
#   STREAMS=200 TOKENS=50 CPU_TOKENS=250 STEP_MS=20 RUNS=5 bash benches/instrument_costs.sh
#
# Needs valgrind (Debian's package) and about 10 minutes on 2 cores besides the builds.
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/common/listening.sh
streams=${STREAMS:-200}
tokens=${TOKENS:-50}
cpu_tokens=${CPU_TOKENS:-250}
step_ms=${STEP_MS:-20}
runs=${RUNS:-5}
command -v valgrind > /dev/null || { echo "instrument_costs: needs valgrind" >&2; exit 1; }
ulimit -n "$(ulimit -Hn)"

cargo build --release --bin streamgate --example baseline_serve >&2
target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
bin=$target/release
work=$(mktemp -d)
tree=$work/tree
pid=""
trap 'kill -KILL $pid 2>/dev/null || true; git worktree remove --force "$tree" 2>/dev/null || true; rm -rf "$work"' EXIT
if ! git diff --quiet HEAD -- src cli; then
  echo "instrument_costs: uncommitted changes in src/ or cli/: the two builds would differ" >&2
  exit 1
fi
git worktree add --detach "$tree" HEAD > /dev/null
git -C "$tree" apply "$PWD/benches/instrument_costs.patch"
(cd "$tree" && CARGO_TARGET_DIR=$target/instrument-costs cargo build --release --bin streamgate >&2)
ablating=$target/instrument-costs/release/streamgate

parts=(metrics sent write decode_publish heartbeat registry)
all=$(IFS=,; echo "${parts[*]}")
# name, binary, STREAMGATE_ABLATE
variants=("sim (real build)|$bin/streamgate|" "sim, every instrument|$ablating|")
for part in "${parts[@]}"; do variants+=("without $part|$ablating|$part"); done
variants+=("sim without any|$ablating|$all" "baseline|$bin/examples/baseline_serve|")

start() { # binary ablate [valgrind...] -> pid, addr
  local binary=$1 ablate=$2; shift 2
  local command=("$binary")
  [ "$binary" != "$bin/examples/baseline_serve" ] &&
    command+=(sim --hop-records "$work/records.jsonl" --hop-records-sample 0.01)
  STREAMGATE_ABLATE=$ablate "$@" "${command[@]}" --addr 127.0.0.1:0 --step-ms "$step_ms" \
    --kv-blocks 1000000 > "$work/server.out" 2>&1 &
  pid=$!
  # valgrind takes a while to start the server.
  addr=$(listening_addr "$work/server.out" 600) && return
  echo "instrument_costs: the server did not start" >&2; cat "$work/server.out" >&2; exit 1
}

stop() {
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  pid=""
}

for variant in "${variants[@]}"; do
  IFS='|' read -r name binary ablate <<< "$variant"
  start "$binary" "$ablate" valgrind --tool=callgrind --cache-sim=yes \
    --callgrind-out-file="$work/callgrind.out"
  sleep 1
  callgrind_control -z "$pid" > /dev/null
  "$bin/streamgate" loadgen --addr "$addr" --json --streams "$streams" --tokens "$tokens" \
    > "$work/loadgen.json"
  callgrind_control -d "$pid" > /dev/null
  stop
  events=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["events"])' "$work/loadgen.json")
  totals=$(callgrind_annotate "$work/callgrind.out.1" 2> /dev/null | grep 'PROGRAM TOTALS' | tr -d ,)
  rm -f "$work"/callgrind.out*
  echo "$name|callgrind|$events|$totals" | tee -a "$work/results" >&2
done

tick=$(getconf CLK_TCK)
for run in $(seq "$runs"); do
  for variant in "${variants[@]}"; do
    IFS='|' read -r name binary ablate <<< "$variant"
    start "$binary" "$ablate"
    before=$(sed 's/.*) //' "/proc/$pid/stat" | awk '{print $12 + $13}')
    "$bin/streamgate" loadgen --addr "$addr" --json --streams "$streams" --tokens "$cpu_tokens" \
      > "$work/loadgen.json"
    after=$(sed 's/.*) //' "/proc/$pid/stat" | awk '{print $12 + $13}')
    stop
    events=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["events"])' "$work/loadgen.json")
    echo "$name|cpu|$events|$before $after $tick" | tee -a "$work/results" >&2
  done
done

python3 - "$work/results" "$streams" "$tokens" "$cpu_tokens" "$step_ms" "$runs" <<'EOF'
import statistics, sys
path, streams, tokens, cpu_tokens, step, runs = sys.argv[1:]
order, counts, cpu = [], {}, {}
for line in open(path):
    name, kind, events, rest = line.rstrip("\n").split("|")
    events = int(events)
    if name not in order:
        order.append(name)
    if kind == "callgrind":
        # Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw, each but a zero followed by its share
        values = [int(v) for v in rest.split() if v.isdigit()]
        if len(values) != 9:
            sys.exit(f"instrument_costs: unexpected callgrind totals for {name}: {rest}")
        counts[name] = [values[0] / events, values[3] / events, values[4] / events, values[5] / events]
    else:
        before, after, tick = (int(v) for v in rest.split())
        cpu.setdefault(name, []).append((after - before) / int(tick) / events * 1e6)
print(f"{streams} streams, one token every {step} ms; callgrind over {streams} x {tokens} tokens, "
      f"CPU: medians of {runs} rounds of {streams} x {cpu_tokens} tokens")
print("| variant | instructions | L1i misses | L1d read misses | L1d write misses | CPU (us) |")
print("|---|---|---|---|---|---|")
for name in order:
    ir, i1, d1r, d1w = counts[name]
    median = statistics.median(cpu[name])
    print(f"| {name} | {ir:,.0f} | {i1:.1f} | {d1r:.1f} | {d1w:.1f} | {median:.1f} |")
EOF
