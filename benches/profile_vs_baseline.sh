#!/usr/bin/env bash
# Where the CPU goes, per event, in `streamgate sim` and in cli/examples/baseline_serve.rs under
# the same load: both built with frame pointers, each started fresh and sampled by
# `perf record -g` for the whole of one `streamgate loadgen` run, then every sample sorted into
# one category by the frames on its stack (the first rule that matches wins). Prints perf
# samples per 1,000 events delivered (at 4,000 Hz a sample is 250 µs of CPU, so 4 samples per
# 1,000 events is 1 µs per event) for each category, side by side.
#
#   bash benches/profile_vs_baseline.sh [STREAMS TOKENS STEP_MS]     # default: 200 250 20
#
# Needs `perf` (and the right to profile processes: run as root, or lower
# kernel.perf_event_paranoid). Builds into $CARGO_TARGET_DIR/profile (a second build of the
# workspace, about 4 minutes on 2 cores the first time).
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/common/listening.sh
streams=${1:-200}
tokens=${2:-250}
step_ms=${3:-20}
target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/profile
RUSTFLAGS="-C force-frame-pointers=yes" CARGO_PROFILE_RELEASE_DEBUG=line-tables-only \
  CARGO_TARGET_DIR=$target cargo build --release --bin streamgate --example baseline_serve >&2
bin=$target/release
work=$(mktemp -d)
server=""
trap 'kill -KILL $server 2>/dev/null || true; rm -rf "$work"' EXIT

profile() { # name command... -> $work/name.stacks, $work/name.json
  local name=$1; shift
  "$@" --addr 127.0.0.1:0 --step-ms "$step_ms" --kv-blocks 1000000 > "$work/$name.out" 2>&1 &
  server=$!
  local addr
  addr=$(listening_addr "$work/$name.out") || { echo "$name did not start" >&2; exit 1; }
  perf record -g -F 4000 -p "$server" -o "$work/$name.data" > /dev/null 2>&1 &
  local recorder=$!
  sleep 0.3
  "$bin/streamgate" loadgen --addr "$addr" --json --streams "$streams" --tokens "$tokens" > "$work/$name.json"
  kill -INT "$recorder"; wait "$recorder" || true
  kill "$server"; wait "$server" 2>/dev/null || true
  server=""
  perf script -i "$work/$name.data" -F ip,sym 2> /dev/null > "$work/$name.stacks"
}

# sim with every instrument, as benches/capacity.sh runs it (hop records for 1% of requests).
profile sim "$bin/streamgate" sim --hop-records "$work/records.jsonl" --hop-records-sample 0.01
profile baseline "$bin/examples/baseline_serve"

python3 - "$work" <<'EOF'
import json, sys
work = sys.argv[1]
# (category, frame names that put a sample in it); the first match wins.
rules = [
    ("kernel: writev (the event's bytes)", "__GI___writev"),
    ("kernel: ioctl (worker.sent's reading)", "__GI___ioctl"),
    ("reads (requests, a closed socket)", "poll_read"),
    ("frames: encoding (JSON, SSE)", "EncodeSse"),
    ("frames: probes, heartbeat, departures", "poll_frame"),
    ("hyper: connection, besides the above", "UpgradeableConnection"),
    ("axum: connection, besides the above", "handle_connection"),
    ("generator task (sim: gate, probes)", "gate::run::drive"),
    ("generator task (baseline: chunk JSON)", "baseline_serve::chat"),
    ("resume registry's pump task", "resume::entry::pump"),
    ("timers", "time::Driver"),
    ("idle: parking, epoll", "park"),
    ("memory: malloc, free, page faults", ("alloc", "free", "page_fault")),
    ("other", ("",)),
]
def stacks(name):
    current = []
    for line in open(f"{work}/{name}.stacks"):
        line = line.strip()
        if not line:
            if current:
                yield current
            current = []
            continue
        parts = line.split(None, 1)
        current.append(parts[1] if len(parts) > 1 else parts[0])
    if current:
        yield current
table, events = {}, {}
for name in ("sim", "baseline"):
    events[name] = json.load(open(f"{work}/{name}.json"))["events"]
    counts = dict.fromkeys((category for category, _ in rules), 0)
    for stack in stacks(name):
        for category, frames in rules:
            frames = (frames,) if isinstance(frames, str) else frames
            if any(frame in symbol for symbol in stack for frame in frames):
                counts[category] += 1
                break
    table[name] = counts
print(f"perf samples per 1,000 events ({events['sim']:,} events; at 4,000 Hz a sample is 250 µs)")
print("| where | sim | baseline |")
print("|---|---|---|")
for category, _ in rules:
    row = [table[name][category] / events[name] * 1000 for name in ("sim", "baseline")]
    print(f"| {category} | {row[0]:.1f} | {row[1]:.1f} |")
total = [sum(table[name].values()) / events[name] * 1000 for name in ("sim", "baseline")]
print(f"| **total** | **{total[0]:.1f}** | **{total[1]:.1f}** ({total[0] / total[1]:.2f}x) |")
EOF
