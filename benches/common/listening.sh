# Sourced by the benchmark scripts.

# Waits until a server started with `--addr 127.0.0.1:0` has written its `listening on
# http://ADDR` line to LOG, then prints ADDR; fails after TRIES tries 50 ms apart (200: 10 s).
listening_addr() { # log [tries]
  local log=$1 tries=${2:-200} addr
  for _ in $(seq "$tries"); do
    addr=$(grep -so 'listening on http://127\.0\.0\.1:[0-9]*' "$log" | grep -o '127.*' || true)
    if [ -n "$addr" ]; then
      echo "$addr"
      return 0
    fi
    sleep 0.05
  done
  return 1
}
