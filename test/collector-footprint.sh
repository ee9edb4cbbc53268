#!/usr/bin/env bash
# Measures a running collector's footprint: RSS and CPU of `gpuscaler collector --source sim`
# with 8 GPUs reporting at 1 Hz to a real scaler (embedded NATS), over DURATION seconds.
# Usage: test/collector-footprint.sh [--cold] [DURATION]   (make bench-collector)
#
# The resident set depends on the page cache: a binary already cached (as it is right
# after a build) is mapped in 64 KiB around each page fault, a cold one page by page.
# --cold drops bin/gpuscaler from the page cache just before the collector starts, as on
# a node that has just pulled the image. The scaler always runs from a copy, so that its
# own mapping keeps none of the collector's binary in the cache.
set -euo pipefail
cd "$(dirname "$0")/.."
cold=false
duration=60
for arg; do
  case $arg in
    --cold) cold=true ;;
    *[!0-9]* | '') echo "usage: $0 [--cold] [DURATION]" >&2; exit 2 ;;
    *) duration=$arg ;;
  esac
done
bin=./bin/gpuscaler
[ -x "$bin" ] || { echo "build first: make build" >&2; exit 1; }
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
nats_port=$(port)
work=$(mktemp -d)
scaler= collector=
cleanup() { kill $scaler $collector 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

cp "$bin" "$work/gpuscaler-scaler"
"$work/gpuscaler-scaler" scaler --grpc-addr 127.0.0.1:0 --http-addr - --embedded-nats-addr "127.0.0.1:$nats_port" --log-level warn 2>"$work/scaler.log" &
scaler=$!
sleep 2
if $cold; then
  python3 -c "import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)" "$bin"
fi
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
status() { awk -v k="$1:" '$1==k{print $2}' "/proc/$collector/status"; }
python3 - "$cold" "$cpu0" "$cpu1" "$t0" "$t1" "$ticks" "$(status VmRSS)" "$(status VmHWM)" "$(status RssAnon)" "$(status RssFile)" <<'PY'
import sys
cold = sys.argv[1] == "true"
cpu0, cpu1, t0, t1, ticks, rss, hwm, anon, file = map(float, sys.argv[2:])
pct = (cpu1 - cpu0) / ticks / (t1 - t0) * 100
print(f"collector, sim source, 8 GPUs at 1 Hz, over {t1-t0:.0f} s, binary {'cold' if cold else 'as cached'}:")
print(f"  CPU  {pct:.3f}% of one core   (target <= 1%)")
print(f"  RSS  {rss/1024:.1f} MiB now, {hwm/1024:.1f} MiB peak   (target <= 40 MiB)")
print(f"       {anon/1024:.1f} MiB anonymous (heap, stacks), {file/1024:.1f} MiB file-backed (the binary)")
PY
if [ -s "$work/collector.log" ]; then echo "collector log:"; cat "$work/collector.log"; fi
