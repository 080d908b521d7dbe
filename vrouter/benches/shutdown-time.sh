#!/usr/bin/env bash
# The vrouter's shutdown time: SIGTERM to exit, with N veth ports (pod kind,
# AF_XDP copy mode) in a namespace of its own. Root. Prints one line:
#   ports=N attach_ms=... shutdown_ms=...
# Usage: vrouter/benches/shutdown-time.sh BINARY N [extra run flags...]
set -euo pipefail
bin=$1; n=$2; shift 2
ns="vrshut$$"
cleanup() { ip netns del "$ns" 2>/dev/null || true; }
trap cleanup EXIT
ip netns add "$ns"
ports=()
for i in $(seq 1 "$n"); do
  ip -n "$ns" link add "sa$i" type veth peer name "sb$i"
  ip -n "$ns" link set "sa$i" up
  ip -n "$ns" link set "sb$i" up
  ports+=(--port "sa$i=pod:10.77.$((i / 250)).$((i % 250 + 1))")
done
log=$(mktemp)
start=$(date +%s%N)
ip netns exec "$ns" "$bin" run "${ports[@]}" "$@" >"$log" 2>&1 &
pid=$!
# Ready when it prints its "running:" line.
for _ in $(seq 1 600); do
  grep -q '^running:' "$log" && break
  kill -0 "$pid" 2>/dev/null || { cat "$log"; exit 1; }
  sleep 0.05
done
ready=$(date +%s%N)
sleep 1
t0=$(date +%s%N)
kill -TERM "$pid"
wait "$pid"
t1=$(date +%s%N)
left=$(ip -n "$ns" link show | grep -c 'xdp' || true)
echo "ports=$n attach_ms=$(( (ready - start) / 1000000 )) shutdown_ms=$(( (t1 - t0) / 1000000 )) xdp_left=$left"
rm -f "$log"
