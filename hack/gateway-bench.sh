#!/usr/bin/env bash
# Runs the gateway's benchmarks against the issue's targets and writes their figures
# into docs/gateway.md, between the markers "<!-- gateway-bench:start -->" and
# "<!-- gateway-bench:end -->", so the page's figures come from one run and are never
# typed by hand. Takes about a minute; run it on a quiet machine.
#
#   hack/gateway-bench.sh            # run and rewrite docs/gateway.md
#   hack/gateway-bench.sh --print    # run and print the table only
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp)
trap 'rm -f "$out"' EXIT
{
  go test -run '^$' -bench 'AddedLatency|Throughput|ReleaseOverHTTP|HeldMemory' -benchtime 1x ./gateway/ 2>&1
  go test -run '^$' -bench 'ReleaseOverHTTP' -benchtime 20x ./gateway/ 2>&1
  go test -run '^$' -bench 'GatewayWake' -benchtime 100x ./cmd/gpuscaler/ 2>&1
} | grep '^Benchmark' >"$out"

# metric NAME UNIT: the value of UNIT on the last line whose benchmark starts with NAME.
metric() {
  awk -v name="$1" -v unit="$2" 'index($1, name) == 1 { for (i = 3; i < NF; i++) if ($(i+1) == unit) v = $i } END { print v }' "$out"
}
cpu=$(grep -m1 '^model name' /proc/cpuinfo | sed 's/.*: //')
table=$(cat <<TABLE
| figure | goal | measured |
| --- | --- | --- |
| added latency, p99 at 1,000 requests/s, backend answering at once | ≤ 1.2× direct | $(metric BenchmarkAddedLatency/backend=0s p99-ratio)× ($(metric BenchmarkAddedLatency/backend=0s gateway-p99-ms) ms against $(metric BenchmarkAddedLatency/backend=0s direct-p99-ms) ms) |
| added latency, p99 at 1,000 requests/s, backend taking 5 ms | ≤ 1.2× direct | $(metric BenchmarkAddedLatency/backend=5ms p99-ratio)× ($(metric BenchmarkAddedLatency/backend=5ms gateway-p99-ms) ms against $(metric BenchmarkAddedLatency/backend=5ms direct-p99-ms) ms) |
| most requests/s, backend answering at once | ≥ 0.7× direct | $(metric BenchmarkThroughput/backend=0s ratio)× ($(metric BenchmarkThroughput/backend=0s gateway-req/s) against $(metric BenchmarkThroughput/backend=0s direct-req/s)) |
| most requests/s, backend taking 5 ms | ≥ 0.7× direct | $(metric BenchmarkThroughput/backend=5ms ratio)× ($(metric BenchmarkThroughput/backend=5ms gateway-req/s) against $(metric BenchmarkThroughput/backend=5ms direct-req/s)) |
| first request at zero → KEDA told active (StreamIsActive), p99 | ≤ 5 ms | $(metric BenchmarkGatewayWake p99-ms) ms (p50 $(metric BenchmarkGatewayWake p50-ms) ms) |
| EndpointSlice ready → 100 held requests answered, p99 | ≤ 50 ms | $(metric BenchmarkReleaseOverHTTP p99-ms) ms (p50 $(metric BenchmarkReleaseOverHTTP p50-ms) ms) |
| memory per held request, 10,000 held: the gateway's own | ≤ 8 KiB | $(( $(metric BenchmarkHeldMemory/handler bytes/held) / 1024 )).$(( $(metric BenchmarkHeldMemory/handler bytes/held) % 1024 * 10 / 1024 )) KiB |
| memory per held request, 5,000 held over loopback HTTP, both ends' connections in one process | — | $(( $(metric BenchmarkHeldMemory/http bytes/held) / 1024 )).$(( $(metric BenchmarkHeldMemory/http bytes/held) % 1024 * 10 / 1024 )) KiB |

Measured by \`hack/gateway-bench.sh\` on $(nproc) cores of an ${cpu}, $(date -u +%Y-%m-%d): for latency and requests/s the gateway runs in a process of its own, the load and the backend in the benchmark's; the other figures are taken in one process.
TABLE
)
if [ "${1:-}" = --print ]; then
  printf '%s\n' "$table"
  exit 0
fi
doc=docs/gateway.md
awk -v table="$table" '
  /<!-- gateway-bench:start -->/ { print; print table; skip = 1; next }
  /<!-- gateway-bench:end -->/ { skip = 0 }
  !skip { print }
' "$doc" >"$doc.new"
mv "$doc.new" "$doc"
echo "wrote the figures into $doc"
