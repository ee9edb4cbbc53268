#!/usr/bin/env bash
# Measures a running collector's footprint: RSS and CPU of `gpuscaler collector --source sim`
# with 8 GPUs reporting at 1 Hz to a real scaler (embedded NATS), over DURATION seconds.
# Usage: test/collector-footprint.sh [DURATION]   (make bench-collector)
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-60}
bin=./bin/gpuscaler
[ -x "$bin" ] || { echo "build first: make build" >&2; exit 1; }
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
nats_port=$(port)
work=$(mktemp -d)
cleanup() { kill "$scaler" "$collector" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

"$bin" scaler --grpc-addr 127.0.0.1:0 --http-addr - --embedded-nats-addr "127.0.0.1:$nats_port" --log-level warn 2>"$work/scaler.log" &
scaler=$!
sleep 2
"$bin" collector --source sim --sim-gpus 8 --node footprint-node --kubeconfig none --http-addr - \
  --nats-url "nats://127.0.0.1:$nats_port" --log-level warn 2>"$work/collector.log" &
collector=$!
sleep 5 # past start-up
ticks=$(getconf CLK_TCK)
cpu0=$(awk '{print $14+$15}' "/proc/$collector/stat")
t0=$(date +%s.%N)
sleep "$duration"
cpu1=$(awk '{print $14+$15}' "/proc/$collector/stat")
t1=$(date +%s.%N)
rss=$(awk '/^VmRSS/{print $2}' "/proc/$collector/status")
hwm=$(awk '/^VmHWM/{print $2}' "/proc/$collector/status")
python3 - "$cpu0" "$cpu1" "$t0" "$t1" "$ticks" "$rss" "$hwm" <<'PY'
import sys
cpu0, cpu1, t0, t1, ticks, rss, hwm = map(float, sys.argv[1:])
pct = (cpu1 - cpu0) / ticks / (t1 - t0) * 100
print(f"collector, sim source, 8 GPUs at 1 Hz, over {t1-t0:.0f} s:")
print(f"  CPU  {pct:.3f}% of one core   (target <= 1%)")
print(f"  RSS  {rss/1024:.1f} MiB now, {hwm/1024:.1f} MiB peak   (target <= 40 MiB)")
PY
if [ -s "$work/collector.log" ]; then echo "collector log:"; cat "$work/collector.log"; fi
