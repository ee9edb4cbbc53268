#!/usr/bin/env bash
# Renders the Helm charts deploy/helm/gpuscaler and deploy/helm/gpuscaler-gateway into
# the committed plain manifests (deploy/manifests/*.yaml), the inference example's
# gateway (examples/inference-scale-to-zero/gateway.yaml) and test/manifests' golden
# files, one per case in deploy/render/render.go. The renderer, deploy/render (a module
# of its own), is Helm's own library at the version pinned in deploy/render/go.mod (Go
# fetches it on first use), so no helm binary is needed and the output is what
# `helm template gpuscaler deploy/helm/gpuscaler -n gpuscaler` prints.
#
#   deploy/render.sh           write them
#   deploy/render.sh --check   fail, naming them, when a committed file is stale
set -euo pipefail
cd "$(dirname "$0")/.."

args=(-root ../..)
case "${1:-}" in
  --check) args+=(-check) ;;
  "") ;;
  *) echo "usage: deploy/render.sh [--check]" >&2; exit 2 ;;
esac

cd deploy/render
go run ./cmd/render "${args[@]}"
