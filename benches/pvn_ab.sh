#!/usr/bin/env bash
# `streamgate proxy` against what operators put in front of a streaming server today: nginx
# (Debian's package, installed here if missing) with `proxy_buffering off`, HTTP/1.1 keepalive
# to the upstream and `tcp_nodelay`, with 1 worker and with `worker_processes auto`. The same
# `streamgate sim` upstream and `streamgate loadgen` clients for each, one fresh upstream and
# proxy per run, the modes interleaved, RUNS (default 3) runs each; every process on the same
# cores. The proxy runs with every instrument on: its probes at both hops, its Prometheus
# metrics, hop records for 1% of requests (`--hop-records-sample 0.01`).
#
# Scenarios (SCENARIOS, STREAMSxTOKENS@STEP_MS): 200 streams x 250 tokens at 50 tokens/s each
# (a paced fleet) and 64 streams x 5,000 tokens as fast as sim goes (a burst). Per run: the
# proxy's CPU (utime+stime from /proc, nginx's master and workers summed) per event delivered,
# the client's gap p50/p99 (loadgen), and the proxy's peak RSS (VmHWM; nginx's workers summed).
# Prints one JSON line per run, then the medians and the ratios against nginx with 1 worker.
#
#   bash benches/proxy_vs_nginx.sh
#   RUNS=3 SCENARIOS="200x250@20 64x5000@0" MODES="nginx1 nginxauto proxy" bash benches/proxy_vs_nginx.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/common/listening.sh
. benches/common/proxy.sh
runs=${RUNS:-3}
scenarios=${SCENARIOS:-200x250@20 64x5000@0}
modes=${MODES:-nginx1 nginxauto proxy}

if ! command -v nginx >/dev/null 2>&1 && [ -x /usr/sbin/nginx ]; then PATH=$PATH:/usr/sbin; fi
if ! command -v nginx >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "proxy_vs_nginx: installing nginx (Debian's nginx-light)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >/dev/null
    PATH=$PATH:/usr/sbin
    # The package starts its own server on port 80: not ours.
    pkill -x nginx 2>/dev/null || true
  else
    echo "proxy_vs_nginx: nginx is missing and cannot be installed (not root, or no apt-get)" >&2
    exit 1
  fi
fi
ulimit -n "$(ulimit -Hn)"
:
bin=${BIN:?}
work=$(mktemp -d)
chmod 755 "$work" # nginx's workers (user nobody) write their temp files under it
pids=""
trap 'for p in $pids; do kill -KILL "$p" 2>/dev/null || true; done; rm -rf "$work"' EXIT
tick=$(getconf CLK_TCK)

peak_kib() { # pids... -> their VmHWM summed
  local sum=0 p
  for p in "$@"; do sum=$((sum + $(awk '/VmHWM/ {print $2}' "/proc/$p/status"))); done
  echo "$sum"
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start_sim() { # step_ms -> sets sim_addr, sim_pid
  "$bin" sim --addr 127.0.0.1:0 --step-ms "$1" --kv-blocks 1000000 > "$work/sim.out" 2>&1 &
  sim_pid=$!; pids="$pids $sim_pid"
  sim_addr=$(listening_addr "$work/sim.out") || { echo "sim did not start" >&2; cat "$work/sim.out" >&2; exit 1; }
}

start_nginx() { # workers -> sets proxy_addr, proxy_pids (the master and its workers)
  local port; port=$(free_port)
  mkdir -p "$work/nginx"
  chmod 777 "$work/nginx"
  cat > "$work/nginx/nginx.conf" <<EOF
worker_processes $1;
worker_rlimit_nofile 65536;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log warn;
events { worker_connections 16384; }
http {
  access_log off;
  client_body_temp_path $work/nginx/body;
  proxy_temp_path $work/nginx/proxy;
  upstream sim { server $sim_addr; keepalive 512; }
  server {
    listen 127.0.0.1:$port backlog=4096;
    tcp_nodelay on;
    location / {
      proxy_pass http://sim;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout 600s;
    }
  }
}
EOF
  nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" -g 'daemon off; master_process on;' \
    > "$work/nginx/out" 2>&1 &
  local master=$!; pids="$pids $master"
  for _ in $(seq 100); do
    [ -n "$(pgrep -P "$master" || true)" ] && curl -s -o /dev/null "http://127.0.0.1:$port/stats" && break
    sleep 0.05
  done
  proxy_pids="$master $(pgrep -P "$master" | tr '\n' ' ')"
  proxy_addr=127.0.0.1:$port
}

start_proxy() { # -> sets proxy_addr, proxy_pids
  "$bin" proxy --addr 127.0.0.1:0 --upstream "http://$sim_addr" \
    --hop-records "$work/records.jsonl" --hop-records-sample 0.01 > "$work/proxy.out" 2>&1 &
  proxy_pids=$!; pids="$pids $proxy_pids"
  proxy_addr=$(listening_addr "$work/proxy.out") || { echo "proxy did not start" >&2; cat "$work/proxy.out" >&2; exit 1; }
}

stop_all() {
  for p in $pids; do kill "$p" 2>/dev/null || true; done
  for p in $pids; do wait "$p" 2>/dev/null || true; done
  pids=""
  rm -rf "$work/nginx" "$work/records.jsonl"
}

run() { # mode streams tokens step_ms run
  local mode=$1 streams=$2 tokens=$3 step=$4 n=$5
  start_sim "$step"
  case $mode in
    nginx1) start_nginx 1 ;;
    nginxauto) start_nginx auto ;;
    proxy) start_proxy ;;
  esac
  # shellcheck disable=SC2086 # pids are words
  local before; before=$(cpu_ticks $proxy_pids)
  local report; report=$("$bin" loadgen --addr "$proxy_addr" --json --streams "$streams" --tokens "$tokens")
  # shellcheck disable=SC2086
  local after peak; after=$(cpu_ticks $proxy_pids); peak=$(peak_kib $proxy_pids)
  stop_all
  python3 - "$mode" "$streams" "$tokens" "$step" "$n" "$report" "$((after - before))" "$tick" "$peak" <<'EOF'
import json, sys
mode, streams, tokens, step, n, report, ticks, hz, peak = sys.argv[1:]
r = json.loads(report)
events = max(r["events"], 1)
print(json.dumps({"mode": mode, "scenario": f"{streams}x{tokens}@{step}", "run": int(n),
                  "events": r["events"], "completed": r["completed"], "failed": r["failed"],
                  "events_per_s": r["events_per_s"], "gap_p50_ms": r["gap_p50_ms"],
                  "gap_p99_ms": r["gap_p99_ms"],
                  "cpu_us_per_event": round(int(ticks) / int(hz) / events * 1e6, 2),
                  "peak_rss_mib": round(int(peak) / 1024, 1)}))
EOF
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores), $(nginx -v 2>&1)" >&2
for n in $(seq "$runs"); do
  for scenario in $scenarios; do
    streams=${scenario%%x*}; rest=${scenario#*x}; tokens=${rest%@*}; step=${scenario#*@}
    for mode in $modes; do run "$mode" "$streams" "$tokens" "$step" "$n"; done
  done
done | tee "$work/runs.jsonl"

python3 - "$work/runs.jsonl" "$modes" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
modes = sys.argv[2].split()
base = "nginx1" if "nginx1" in modes else modes[0]
med = lambda xs: statistics.median(xs)
print(f"\nmedians of the runs; ratios against {base}")
print("scenario | mode | CPU us/event | ratio | gap p50 ms | gap p99 ms | ratio | peak RSS MiB | ratio | events/s")
for scenario in dict.fromkeys(r["scenario"] for r in rows):
    m = {mode: [r for r in rows if r["scenario"] == scenario and r["mode"] == mode] for mode in modes}
    g = lambda mode, k: med([r[k] for r in m[mode]])
    for mode in modes:
        ratio = lambda k: round(g(mode, k) / g(base, k), 2) if g(base, k) else None
        print(f'{scenario} | {mode} | {g(mode, "cpu_us_per_event")} | {ratio("cpu_us_per_event")} | '
              f'{g(mode, "gap_p50_ms")} | {g(mode, "gap_p99_ms")} | {ratio("gap_p99_ms")} | '
              f'{g(mode, "peak_rss_mib")} | {ratio("peak_rss_mib")} | {g(mode, "events_per_s")}')
EOF
