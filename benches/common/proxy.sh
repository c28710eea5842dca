# Sourced by the benchmark scripts that measure the proxy.

# The CPU ticks (utime + stime) the processes PID... have used, summed.
cpu_ticks() {
  local sum=0 p
  for p in "$@"; do sum=$((sum + $(sed 's/.*) //' "/proc/$p/stat" | awk '{print $12 + $13}'))); done
  echo "$sum"
}

# The p50, p99 and max of each visible event's transit through the proxy (`proxy.recv` to
# `proxy.write`, one process, one clock), in microseconds, from its hop records in FILE; one
# JSON object.
transit() { # records file
  python3 - "$1" <<'EOF'
import json, sys
recv, transit = {}, []
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["kind"] != "visible":
        continue
    key = (r["request"], r["seq"])
    if r["hop"] == "proxy.recv":
        recv[key] = r["t_ns"]
    elif r["hop"] == "proxy.write" and key in recv:
        transit.append(r["t_ns"] - recv.pop(key))
transit.sort()
q = lambda p: round(transit[min(len(transit) - 1, int(p * len(transit)))] / 1e3, 1)
print(json.dumps({"events": len(transit), "transit_p50_us": q(0.5), "transit_p99_us": q(0.99), "transit_max_us": round(transit[-1] / 1e3, 1)}))
EOF
}
