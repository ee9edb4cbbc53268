#!/usr/bin/env bash
# Conformance with KEDA's own client: runs this module's tests, which drive a real
# `gpuscaler scaler` (built from this checkout) through github.com/kedacore/keda/v2
# v2.21.0's external and external-push scalers. Works from a clean clone: modules come
# through the Go module proxy, and the first run compiles KEDA's scalers package with the
# race detector (~15 min on 2 cores; cached after). Extra arguments go to `go test`
# (for example -run TestPushActivation).
set -euo pipefail
cd "$(dirname "$0")"
export PATH="$PATH:/usr/local/go/bin"

echo "== keda conformance: modules"
go mod download

echo "== keda conformance: gofmt and vet"
out=$(gofmt -l .)
if [ -n "$out" ]; then echo "gofmt needed:"; echo "$out"; exit 1; fi
# -race: vet type-checks against the same compiled packages as the tests below.
go vet -race -p 2 ./...

echo "== keda conformance: tests (race detector)"
go test -race -count=1 -p 2 -timeout 30m -v "$@" ./...
