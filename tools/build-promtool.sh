#!/usr/bin/env bash
# Build promtool (Prometheus v3.16.0, Go module github.com/prometheus/prometheus v0.316.0, tools/promtool)
# into ${FRACGPU_PROMTOOL_CACHE:-$HOME/.cache/fracgpu/promtool-v3.16.0}/promtool. The tests use it to check
# and unit-test the alert rules of manifests/components/monitoring (docs/testing.md).
#
# Idempotent: does nothing when the binary is there; `--force` rebuilds. Built with the `remove_all_sd` tag
# (no cloud service-discovery plugins: promtool's rule checks and rule tests do not need them), which halves
# the build. Go parallelism is capped (-p, default 2) because the machine is shared; FRACGPU_BUILD_P
# overrides it.
set -euo pipefail

PROMETHEUS_VERSION="3.16.0"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${FRACGPU_PROMTOOL_CACHE:-$HOME/.cache/fracgpu/promtool-v${PROMETHEUS_VERSION}}"
PARALLEL="${FRACGPU_BUILD_P:-2}"
if [[ "${1:-}" == "--force" ]]; then
    rm -f "$CACHE/promtool"
elif [[ $# -gt 0 ]]; then
    echo "usage: $0 [--force]" >&2
    exit 2
fi

log() { echo "[build-promtool $(date +%H:%M:%S)] $*"; }

if [[ -x "$CACHE/promtool" ]]; then
    log "promtool present in $CACHE; nothing to do"
    exit 0
fi
command -v go >/dev/null || { echo "build-promtool: the go command is required (Go >= 1.26)" >&2; exit 1; }

mkdir -p "$CACHE"
partial="$CACHE/.partial"
mkdir -p "$partial"
start=$SECONDS
log "building promtool v${PROMETHEUS_VERSION} into $CACHE with $(go version | cut -d' ' -f3), -p $PARALLEL"
( while sleep 30; do log "... still building ($((SECONDS - start)) s so far)"; done ) &
heartbeat=$!
trap 'kill "$heartbeat" 2>/dev/null || true' EXIT
(
    cd "$ROOT/promtool"
    CGO_ENABLED=0 go build -p "$PARALLEL" -tags remove_all_sd -trimpath \
        -ldflags "-s -w -X github.com/prometheus/common/version.Version=${PROMETHEUS_VERSION}" \
        -o "$partial/promtool" github.com/prometheus/prometheus/cmd/promtool
)
# Moved into place only when complete, so an interrupted build never leaves a binary the check above accepts.
mv -f "$partial/promtool" "$CACHE/promtool"
rmdir "$partial" 2>/dev/null || true
"$CACHE/promtool" --version | head -1
log "done in $((SECONDS - start)) s"
