#!/usr/bin/env bash
# Runs gpuscaler's end-to-end suite against a real control plane (etcd, kube-apiserver)
# and KEDA's operator, all on loopback, from a clean clone. It builds what the cache lacks
# (etcd, kube-apiserver, KEDA's operator, nats-server, through the Go module proxy: ~14
# minutes cold on 2 cores), then runs the tests (~7 minutes). Needs Go 1.26 and nothing
# else: no Docker, no cluster, no root.
#
#   test/e2e/run.sh                      # everything
#   test/e2e/run.sh -run TestQueue       # extra go test flags
#
# GPUSCALER_E2E_CACHE moves the binary cache (default: .e2e-cache at the repository
# root); GPUSCALER_E2E_PUSH_RUNS and GPUSCALER_E2E_POLL_RUNS set the latency runs.
set -euo pipefail
cd "$(dirname "$0")"
export PATH="$PATH:/usr/local/go/bin"

if ! command -v go >/dev/null; then
  echo "run.sh: needs Go 1.26 (https://go.dev/dl/)" >&2
  exit 1
fi
GPUSCALER_E2E_CACHE="${GPUSCALER_E2E_CACHE:-$(cd ../.. && pwd)/.e2e-cache}"
export GPUSCALER_E2E_CACHE
mkdir -p "$GPUSCALER_E2E_CACHE"

start=$(date +%s)
echo "=== e2e: vet ($(date -u +%H:%M:%S))"
go vet ./...
echo "=== e2e: build what the cache ($GPUSCALER_E2E_CACHE) lacks ($(date -u +%H:%M:%S))"
go test -p 2 -count=1 -v -timeout 80m -run '^$' . -args -build-only
built=$(date +%s)

echo "=== e2e: tests ($(date -u +%H:%M:%S))"
status=0
# -parallel above the number of tests that call t.Parallel (10): they run all at once, after
# the serial ones, which measure the latencies alone (see "Tests in parallel" in
# main_test.go). Go's default, GOMAXPROCS, would run them two at a time on 2 cores.
go test -p 2 -count=1 -timeout 25m -parallel 16 -v . "$@" || status=$?
end=$(date +%s)
echo "=== e2e: builds $((built - start)) s, tests $((end - built)) s, total $((end - start)) s (exit $status)"
exit $status
