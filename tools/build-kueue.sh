#!/usr/bin/env bash
# Build Kueue's manager (sigs.k8s.io/kueue v0.17.0, cmd/kueue) from the wrapper module tools/kueue into
# ${FRACGPU_KUEUE_CACHE:-$HOME/.cache/fracgpu/kueue-v0.17.0}/kueue, and copy beside it Kueue's own install (the
# kustomizations under config/ of the same module), from which the test bed renders its CRDs, RBAC and webhook
# configurations unchanged. tests/extender/e2e/test_stock_kueue.py runs it against the test bed's API server
# (docs/testing.md).
#
# Same rules as the other builds: idempotent (nothing is done when the binary and the manifests are there;
# `--force` rebuilds), static (CGO_ENABLED=0), -trimpath, moved into place only once complete, Go parallelism
# capped by FRACGPU_BUILD_P (default 2).
set -euo pipefail

KUEUE_VERSION="v0.17.0"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$ROOT/lib/gobuild.sh"
CACHE="${FRACGPU_KUEUE_CACHE:-$HOME/.cache/fracgpu/kueue-${KUEUE_VERSION}}"
PARALLEL="${FRACGPU_BUILD_P:-2}"
if [[ "${1:-}" == "--force" ]]; then
    rm -rf "$CACHE/kueue" "$CACHE/config"
elif [[ $# -gt 0 ]]; then
    echo "usage: $0 [--force]" >&2
    exit 2
fi

log() { echo "[build-kueue $(date +%H:%M:%S)] $*"; }

if [[ -x "$CACHE/kueue" && -f "$CACHE/config/.complete" ]]; then
    log "kueue and its manifests present in $CACHE; nothing to do"
    exit 0
fi
command -v go >/dev/null || { echo "build-kueue: the go command is required (Go >= 1.26)" >&2; exit 1; }
mkdir -p "$CACHE"
start=$SECONDS

if [[ ! -f "$CACHE/config/.complete" ]]; then
    module_dir="$(cd "$ROOT/kueue" && go mod download sigs.k8s.io/kueue && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)"
    [[ -d "$module_dir/config/default" ]] || { echo "build-kueue: no Kueue module source at '$module_dir'" >&2; exit 1; }
    rm -rf "$CACHE/config.partial"
    cp -r "$module_dir/config" "$CACHE/config.partial"
    chmod -R u+w "$CACHE/config.partial"
    touch "$CACHE/config.partial/.complete"
    rm -rf "$CACHE/config"
    mv "$CACHE/config.partial" "$CACHE/config"
    log "copied Kueue's install (config/) from $module_dir"
fi

if [[ ! -x "$CACHE/kueue" ]]; then
    log "building kueue ${KUEUE_VERSION} into $CACHE with $(go version | cut -d' ' -f3), -p $PARALLEL"
    go_build_binary kueue "$ROOT/kueue" sigs.k8s.io/kueue/cmd/kueue "$CACHE" \
        -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=${KUEUE_VERSION}"
fi
log "done in $((SECONDS - start)) s"
