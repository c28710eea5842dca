#!/usr/bin/env bash
# `streamgate diagnose` at production scale: wall time and peak RSS of the release binary on
#   1. 10 million hop records over 100,000 requests (4 hops, one file per hop, 1,000 streams
#      interleaved at a time, 25 records per stream per hop, end records included), with 100
#      injected stalls, 100 freezes the stream ends in and 100 hidden phases a hop filters out;
#      the requests are in four pools (`gateway.recv` names each stream's `pool`), and pool p2
#      stalls 5% of its requests (1,250 stalls at the worker), so that
#   1b. `--by pool` and `--by length,pool` slice the same records;
#   2. the same, read from standard input (one concatenated stream);
#   3. 1 GiB of random bytes (garbage);
#   4. 1 million copies of one record (duplicates);
#   5. 4 million records of 4 million distinct requests (one hop each), and
#   6. 1.1 million distinct requests at all four hops (4.4 million records): past the default
#      limit of 1 Mi requests, the most state the analysis keeps by default.
# The inputs are generated into $CARGO_TARGET_DIR/diagnose-at-scale (default target/), about
# 3 GB; KEEP=1 keeps them for another run.
#   [REQUESTS=100000] bash benches/diagnose_at_scale.sh   (REQUESTS a multiple of 1000)
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
cargo build --release --bin streamgate >&2
bin="$target/release/streamgate diagnose"
dir=$target/diagnose-at-scale
requests=${REQUESTS:-100000}
records=$dir/records-pools-$requests
mkdir -p "$records"
path=worker.publish,gateway.recv,gateway.write,client.recv

if [ ! -s "$records/client.recv.jsonl" ]; then
  echo "generating $((requests * 100)) records into $records" >&2
  awk -v dir="$records" -v R="$requests" 'BEGIN {
    # Times are printed with %.0f: %d stops at 2^31 in mawk.
    split("worker.publish gateway.recv gateway.write client.recv", hop, " ")
    srand(42); MS = 1000000; B = 1000; E = 24
    for (h = 1; h <= 4; h++) {
      # Each hop its own clock: offsets far apart, never comparable.
      off[h] = h * 7919 * 1000 * MS
      file[h] = dir "/" hop[h] ".jsonl"
    }
    for (b = 0; b < R / B; b++) {
      t0 = b * 150 * MS
      for (e = 0; e <= E; e++) {
        for (i = 0; i < B; i++) {
          r = b * B + i
          kind_of = r % 1000
          at = 1 + int(r / 1000) % 4       # the hop an injected stall or freeze begins at
          for (h = 1; h <= 4; h++) {
            # Events every 5 ms, up to 2 ms of jitter, 0.3 ms later per hop.
            t = t0 + e * 5 * MS + (h - 1) * 300000 + int(rand() * 2 * MS)
            kind = "visible"
            if (kind_of == 250) {
              # Reasoning: events 1-8 hidden, 200 ms apart; the gateway writes only the answer.
              if (e >= 1 && e <= 8) { kind = "hidden"; t = t0 + e * 200 * MS + (h - 1) * 300000 }
              else if (e > 8) t += 1600 * MS
              if (kind == "hidden" && h >= 3) continue
            }
            if (kind_of == 7 && h >= at && e >= 12) t += 1500 * MS     # a 1.5 s stall before 12
            if (r % 4 == 2 && int(r / 4) % 20 == 0 && e >= 16) t += 1500 * MS   # p2: 5% stall at the worker
            attrs = (h == 2 && e == 0) ? sprintf(",\"attrs\":{\"pool\":\"p%d\"}", r % 4) : ""
            if (kind_of == 500 && h >= at && e >= 10) {                 # frozen after 9, user leaves
              if (e == E) printf "{\"request\":\"req-%d\",\"hop\":\"%s\",\"seq\":10,\"t_ns\":%.0f,\"bytes\":0,\"kind\":\"end\",\"reason\":\"consumer_gone\",\"idle_ns\":%.0f}\n", r, hop[h], last[i, h] + 30000 * MS + off[h], 30000 * MS > file[h]
              continue
            }
            if (e == E) {
              printf "{\"request\":\"req-%d\",\"hop\":\"%s\",\"seq\":%d,\"t_ns\":%.0f,\"bytes\":0,\"kind\":\"end\",\"reason\":\"completed\",\"idle_ns\":%.0f}\n", r, hop[h], E, last[i, h] + MS + off[h], MS > file[h]
              continue
            }
            last[i, h] = t
            printf "{\"request\":\"req-%d\",\"hop\":\"%s\",\"seq\":%d,\"t_ns\":%.0f,\"bytes\":12,\"kind\":\"%s\"%s}\n", r, hop[h], e, t + off[h], kind, attrs > file[h]
          }
        }
      }
    }
  }'
fi
if [ ! -s "$dir/garbage" ]; then
  head -c 1073741824 /dev/urandom > "$dir/garbage"
fi
if [ ! -s "$dir/duplicates.jsonl" ]; then
  awk 'BEGIN { for (i = 0; i < 1000000; i++)
    print "{\"request\":\"req-1\",\"hop\":\"gateway.recv\",\"seq\":7,\"t_ns\":123456789,\"bytes\":12,\"kind\":\"visible\"}" }' \
    > "$dir/duplicates.jsonl"
fi

if [ ! -s "$dir/distinct.jsonl" ]; then
  awk 'BEGIN { for (i = 0; i < 4000000; i++)
    printf "{\"request\":\"hostile-%d\",\"hop\":\"gateway.recv\",\"seq\":0,\"t_ns\":%d,\"bytes\":1,\"kind\":\"visible\"}\n", i, i }' \
    > "$dir/distinct.jsonl"
fi
if [ ! -s "$dir/distinct4.jsonl" ]; then
  awk 'BEGIN { split("worker.publish gateway.recv gateway.write client.recv", hop, " ")
    for (i = 0; i < 1100000; i++) for (h = 1; h <= 4; h++)
      printf "{\"request\":\"hostile-%d\",\"hop\":\"%s\",\"seq\":0,\"t_ns\":%d,\"bytes\":1,\"kind\":\"visible\"}\n", i, hop[h], i }' \
    > "$dir/distinct4.jsonl"
fi

measure() { # name, then the command; prints wall time, peak RSS and the report's first lines
  local name=$1
  shift
  local status=0
  /usr/bin/time -v -o "$dir/$name.time" "$@" > "$dir/$name.out" 2> "$dir/$name.err" || status=$?
  printf '%-12s exit %d, %s wall (m:ss), %s KiB peak RSS\n' "$name" "$status" \
    "$(grep 'Elapsed (wall clock)' "$dir/$name.time" | awk '{print $NF}')" \
    "$(grep 'Maximum resident set size' "$dir/$name.time" | awk '{print $NF}')"
  head -n 3 "$dir/$name.out" | sed 's/^/    /'
}

ls -l "$records" "$dir/garbage" "$dir/duplicates.jsonl" "$dir/distinct.jsonl" "$dir/distinct4.jsonl" >&2
measure records $bin --path "$path" "$records"
measure sliced $bin --path "$path" --by pool "$records"
measure pairs $bin --path "$path" --by length,pool "$records"
measure stdin sh -c "cat '$records'/*.jsonl | $bin --path '$path' -"
measure garbage $bin --path "$path" "$dir/garbage"
measure duplicates $bin --path "$path" "$dir/duplicates.jsonl"
measure distinct $bin --path "$path" "$dir/distinct.jsonl"
measure distinct4 $bin --path "$path" "$dir/distinct4.jsonl"
grep -E 'stalls|problems in' "$dir/records.out" | head -n 3
sed -n '/^  hop /,/^[^ ]/p' "$dir/records.out"
sed -n '/^by pool/,/^[^ b]/p' "$dir/sliced.out"
sed -n '/^by length/,/^[^ b]/p' "$dir/pairs.out"
if [ -z "${KEEP:-}" ]; then
  rm -rf "$records" "$dir/garbage" "$dir/duplicates.jsonl" "$dir/distinct.jsonl" \
    "$dir/distinct4.jsonl"
fi
