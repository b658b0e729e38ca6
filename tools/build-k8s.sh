#!/usr/bin/env bash
# Build the control-plane binaries the fracgpu test bed runs (docs/testing.md):
#   kube-apiserver, kube-controller-manager, kube-scheduler (k8s.io/kubernetes v1.35.4, tools/k8s)
#   kubelet and kube-proxy for the test bed's real nodes (testbed/realnodes, same module)
#   etcd (go.etcd.io/etcd/server/v3, tools/etcd)
# into ${FRACGPU_K8S_CACHE:-$HOME/.cache/fracgpu/k8s-v1.35.4}/.
#
# Idempotent: a binary already in the cache is not rebuilt; when all are present this
# does nothing.  `--force` rebuilds everything.  Builds are static (CGO_ENABLED=0),
# -trimpath, and carry the v1.35.4 version stamp, so `kube-apiserver --version`
# prints "Kubernetes v1.35.4".  Go parallelism is capped (-p, default 2) because the
# machine is shared; override with FRACGPU_BUILD_P.
set -euo pipefail

K8S_VERSION="v1.35.4"
K8S_MAJOR="1"
K8S_MINOR="35"
# Release time of k8s.io/kubernetes v1.35.4 (from the module proxy's .info), used as the
# build date so that builds are reproducible.
K8S_BUILD_DATE="2026-04-15T18:01:22Z"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${FRACGPU_K8S_CACHE:-$HOME/.cache/fracgpu/k8s-${K8S_VERSION}}"
PARALLEL="${FRACGPU_BUILD_P:-2}"
FORCE=0
if [[ "${1:-}" == "--force" ]]; then
    FORCE=1
elif [[ $# -gt 0 ]]; then
    echo "usage: $0 [--force]" >&2
    exit 2
fi

# name|module dir|package
TARGETS=(
    "etcd|etcd|go.etcd.io/etcd/server/v3"
    "kube-apiserver|k8s|k8s.io/kubernetes/cmd/kube-apiserver"
    "kube-controller-manager|k8s|k8s.io/kubernetes/cmd/kube-controller-manager"
    "kube-scheduler|k8s|k8s.io/kubernetes/cmd/kube-scheduler"
    "kubelet|k8s|k8s.io/kubernetes/cmd/kubelet"
    "kube-proxy|k8s|k8s.io/kubernetes/cmd/kube-proxy"
)

log() { echo "[build-k8s $(date +%H:%M:%S)] $*"; }

missing=()
for t in "${TARGETS[@]}"; do
    name="${t%%|*}"
    if [[ $FORCE -eq 1 || ! -x "$CACHE/$name" ]]; then
        missing+=("$t")
    fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
    log "all binaries present in $CACHE; nothing to do"
    exit 0
fi

command -v go >/dev/null || { echo "build-k8s: the go command is required (Go >= 1.26)" >&2; exit 1; }

version_ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    version_ldflags+=" -X '${pkg}.gitVersion=${K8S_VERSION}'"
    version_ldflags+=" -X '${pkg}.gitMajor=${K8S_MAJOR}'"
    version_ldflags+=" -X '${pkg}.gitMinor=${K8S_MINOR}'"
    version_ldflags+=" -X '${pkg}.buildDate=${K8S_BUILD_DATE}'"
done

mkdir -p "$CACHE"
partial="$CACHE/.partial"
mkdir -p "$partial"
total_start=$SECONDS
log "building ${#missing[@]} binaries into $CACHE with $(go version | cut -d' ' -f3), -p $PARALLEL"
for t in "${missing[@]}"; do
    IFS='|' read -r name moddir pkg <<<"$t"
    start=$SECONDS
    log "building $name ($pkg) ..."
    ldflags="-s -w"
    if [[ "$moddir" == "k8s" ]]; then
        ldflags+="$version_ldflags"
    fi
    # A heartbeat, so a first build that takes minutes never looks hung.
    ( while sleep 30; do log "... still building $name ($((SECONDS - start)) s so far)"; done ) &
    heartbeat=$!
    (
        cd "$ROOT/$moddir"
        CGO_ENABLED=0 go build -p "$PARALLEL" -trimpath -ldflags "$ldflags" -o "$partial/$name" "$pkg"
    ) || { kill "$heartbeat" 2>/dev/null; exit 1; }
    kill "$heartbeat" 2>/dev/null || true
    wait "$heartbeat" 2>/dev/null || true
    # Move into place only when complete, so an interrupted build never leaves a
    # binary that the idempotency check would accept.
    mv -f "$partial/$name" "$CACHE/$name"
    log "built $name in $((SECONDS - start)) s"
done
rmdir "$partial" 2>/dev/null || true
"$CACHE/kube-apiserver" --version
"$CACHE/etcd" --version | head -1
log "done in $((SECONDS - total_start)) s"
