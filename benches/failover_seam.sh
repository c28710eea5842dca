#!/usr/bin/env bash
# What a failover costs the user: the gap a client sees at the seam, where a stream whose
# replica died mid-answer goes on from another, against the gaps of the same streams elsewhere
# (the baseline, measured in the same run). KILLS times (default 100): a fresh
# `streamgate sim --die-after K` (K at random in 5..34; it SIGKILLs itself after K tokens), a
# second sim, and a proxy whose fleet falls back from the first to the second; one client
# streams 40 tokens at --step-ms STEP_MS (default 5) and stamps each event as it arrives. Prints
# one JSON line per kill, then p50/p99 of the seam's gap and of the other gaps, and the extra.
#   [KILLS=100] [STEP_MS=5] bash benches/failover_seam.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/common/listening.sh
kills=${KILLS:-100}
step=${STEP_MS:-5}
cargo build --release -p streamgate-cli --bin streamgate >&2
bin=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/streamgate
out=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$out"' EXIT

start() { # name args... -> prints the address
  local name=$1; shift
  "$bin" "$@" --addr 127.0.0.1:0 > "$out/$name.log" 2>&1 &
  echo $! > "$out/$name.pid"
  listening_addr "$out/$name.log" || { echo "$name did not start" >&2; cat "$out/$name.log" >&2; exit 1; }
}

for i in $(seq "$kills"); do
  die_after=$((5 + RANDOM % 30))
  dying=$(start dying sim --step-ms "$step" --die-after "$die_after")
  other=$(start other sim --step-ms "$step")
  cat > "$out/fleet.toml" <<EOF
[[pool]]
name = "dying"
models = ["sim"]
upstreams = ["http://$dying"]
[[pool]]
name = "other"
models = ["sim-b"]
upstreams = ["http://$other"]
[fallbacks]
sim = "sim-b"
EOF
  proxy=$(start proxy proxy --config "$out/fleet.toml")
  python3 - "$proxy" "$die_after" <<'EOF'
import http.client, json, sys, time
proxy, die_after = sys.argv[1], int(sys.argv[2])
host, port = proxy.split(":")
conn = http.client.HTTPConnection(host, int(port), timeout=30)
body = json.dumps({"model": "sim", "stream": True, "max_tokens": 40,
                   "messages": [{"role": "user", "content": "hi"}]})
conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
response = conn.getresponse()
assert response.status == 200, response.status
stamps, models, text = [], [], ""
while True:
    line = response.readline()
    if not line:
        break
    if not line.startswith(b"data: "):
        continue
    data = line[6:].strip()
    if data == b"[DONE]":
        break
    chunk = json.loads(data)
    content = chunk["choices"][0]["delta"].get("content")
    if content:
        stamps.append(time.monotonic())
        models.append(chunk["model"])
        text += content
assert text == "".join(f"t{i} " for i in range(40)), text
gaps = [b - a for a, b in zip(stamps, stamps[1:])]
# The seam: between the last token from the dying replica and the first from the other (the
# one that names the fallback's model).
first = models.index("sim-b")
assert first > 0, "the dying replica sent no token"
seam = gaps[first - 1]
others = gaps[:first - 1] + gaps[first:]
print(json.dumps({"die_after": die_after, "delivered": first, "seam_ms": round(seam * 1e3, 2),
                  "other_gaps_ms": [round(g * 1e3, 2) for g in others]}))
EOF
  kill "$(cat "$out/other.pid")" "$(cat "$out/proxy.pid")" 2>/dev/null || true
  wait 2>/dev/null || true
done | tee "$out/kills.jsonl"

python3 - "$out/kills.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
seams = sorted(r["seam_ms"] for r in rows)
others = sorted(g for r in rows for g in r["other_gaps_ms"])
q = lambda xs, p: xs[min(len(xs) - 1, int(p * len(xs)))]
print(f"\n{len(rows)} kills | seam gap p50 / p99 (ms) | other gaps p50 / p99 (ms) | extra at the seam p50 / p99 (ms)")
print(f"| {q(seams, .5)} / {q(seams, .99)} | {q(others, .5)} / {q(others, .99)} | "
      f"{round(q(seams, .5) - q(others, .5), 2)} / {round(q(seams, .99) - q(others, .5), 2)}")
EOF
