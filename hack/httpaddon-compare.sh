#!/usr/bin/env bash
# Measures gpuscaler's gateway beside the KEDA HTTP add-on's interceptor and scaler
# (test/e2e/cmd/httpaddon-compare) and writes the table into docs/gateway.md, between
# "<!-- httpaddon-compare:start -->" and "<!-- httpaddon-compare:end -->". Not part of
# CI: the add-on's first build takes minutes, the run about four more.
#
# It needs root, unshare (util-linux) and ip (iproute2): the run gets a network and
# mount namespace of its own, where 10.244.0.10 and 10.244.0.20 are local addresses and
# llm.bench names the second, because the add-on's scaler finds its interceptor by an
# EndpointSlice address (the API server refuses loopback ones) and its interceptor dials
# a Service by name. Nothing outside the namespace changes.
#
#   hack/httpaddon-compare.sh            # run and rewrite docs/gateway.md
#   hack/httpaddon-compare.sh --print    # run and print the table only
#   hack/httpaddon-compare.sh --print -- --trials 10 --serve 5ms   # the harness's flags after --
set -euo pipefail
cd "$(dirname "$0")/.."
print=
if [ "${1:-}" = --print ]; then print=1; shift; fi
if [ "${1:-}" = -- ]; then shift; fi
if [ "$(id -u)" != 0 ]; then echo "httpaddon-compare: needs root, to make a network namespace" >&2; exit 1; fi
for tool in unshare ip mount; do
  command -v "$tool" >/dev/null || { echo "httpaddon-compare: needs $tool (apt-get install util-linux iproute2)" >&2; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd test/e2e && go build -o "$tmp/compare" ./cmd/httpaddon-compare && "$tmp/compare" --build-only)
{ cat /etc/hosts; echo "10.244.0.20 llm.bench llm.bench.svc"; } >"$tmp/hosts"
# The namespace has no route out: nothing in it may reach the module proxy.
(cd test/e2e && GOPROXY=off unshare --net --mount --fork -- sh -c '
  ip link set lo up &&
  ip addr add 10.244.0.10/32 dev lo &&
  ip addr add 10.244.0.20/32 dev lo &&
  mount --bind "$1" /etc/hosts &&
  shift && exec "$@"' sh "$tmp/hosts" "$tmp/compare" "$@") >"$tmp/table"
if [ -n "$print" ]; then
  cat "$tmp/table"
  exit 0
fi
doc=docs/gateway.md
awk -v table="$(cat "$tmp/table")" '
  /<!-- httpaddon-compare:start -->/ { print; print table; skip = 1; next }
  /<!-- httpaddon-compare:end -->/ { skip = 0 }
  !skip { print }
' "$doc" >"$doc.new"
mv "$doc.new" "$doc"
echo "wrote the comparison into $doc"
