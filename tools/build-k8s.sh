#!/usr/bin/env bash
# Build the Kubernetes binaries the fracgpu test bed runs (docs/testing.md, docs/compatibility.md):
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy (k8s.io/kubernetes, tools/k8s/<version>)
#   etcd (go.etcd.io/etcd/server/v3, tools/etcd/<etcd version>: the one that Kubernetes release is tested with)
# for one Kubernetes version, into ${FRACGPU_K8S_CACHE:-$HOME/.cache/fracgpu/k8s-<version>}/.
#
# The version: FRACGPU_K8S_VERSION, or the row of tools/k8s/versions.tsv marked default (v1.37.2); the
# compatibility version (v1.35.4) on request. Each version has its own cache directory, so both sit side by side.
# A version that tools/k8s/versions.tsv does not list is refused, naming the supported ones.
#
# Idempotent: a binary already in the cache is not rebuilt; when all are present this does nothing.
# `--force` rebuilds everything. A cache directory that holds another version's binaries (the VERSION stamp
# written after each build, or a binary's own --version) is refused with both versions named, never reused.
# Builds are static (CGO_ENABLED=0), -trimpath, and carry the version stamp, so `kube-apiserver --version`
# prints "Kubernetes <version>". Go parallelism is capped (-p, default 2) because the machine is shared;
# override with FRACGPU_BUILD_P.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$ROOT/lib/k8s-version.sh"
source "$ROOT/lib/gobuild.sh"
k8s_version_select || exit 2

CACHE="${FRACGPU_K8S_CACHE:-$HOME/.cache/fracgpu/k8s-${K8S_VERSION}}"
PARALLEL="${FRACGPU_BUILD_P:-2}"
FORCE=0
if [[ "${1:-}" == "--force" ]]; then
    FORCE=1
elif [[ $# -gt 0 ]]; then
    echo "usage: [FRACGPU_K8S_VERSION=<version>] $0 [--force]" >&2
    exit 2
fi

# name|module dir|package
TARGETS=(
    "etcd|etcd/${ETCD_VERSION}|go.etcd.io/etcd/server/v3"
    "kube-apiserver|k8s/${K8S_VERSION}|k8s.io/kubernetes/cmd/kube-apiserver"
    "kube-controller-manager|k8s/${K8S_VERSION}|k8s.io/kubernetes/cmd/kube-controller-manager"
    "kube-scheduler|k8s/${K8S_VERSION}|k8s.io/kubernetes/cmd/kube-scheduler"
    "kubelet|k8s/${K8S_VERSION}|k8s.io/kubernetes/cmd/kubelet"
    "kube-proxy|k8s/${K8S_VERSION}|k8s.io/kubernetes/cmd/kube-proxy"
)

log() { echo "[build-k8s ${K8S_VERSION} $(date +%H:%M:%S)] $*"; }

# A cache that holds another version is refused before anything is built or reused (--force rebuilds it).
stamp="$CACHE/VERSION"
expected_stamp="kubernetes ${K8S_VERSION} etcd ${ETCD_VERSION}"
if [[ $FORCE -eq 0 && -d "$CACHE" ]]; then
    if [[ -f "$stamp" ]]; then
        found="$(cat "$stamp")"
        if [[ "$found" != "$expected_stamp" ]]; then
            echo "build-k8s: $CACHE holds '$found', expected '$expected_stamp'; point FRACGPU_K8S_CACHE elsewhere or rebuild with --force" >&2
            exit 1
        fi
    elif [[ -x "$CACHE/kube-apiserver" ]]; then
        # A cache from before the VERSION stamp: the binary's own version decides.
        found="$("$CACHE/kube-apiserver" --version 2>/dev/null | awk '{print $2}')"
        if [[ "$found" != "$K8S_VERSION" ]]; then
            echo "build-k8s: $CACHE/kube-apiserver is Kubernetes ${found:-of no known version}, expected $K8S_VERSION; point FRACGPU_K8S_CACHE elsewhere or rebuild with --force" >&2
            exit 1
        fi
    fi
fi

missing=()
for t in "${TARGETS[@]}"; do
    name="${t%%|*}"
    if [[ $FORCE -eq 1 || ! -x "$CACHE/$name" ]]; then
        missing+=("$t")
    fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
    [[ -f "$stamp" ]] || echo "$expected_stamp" >"$stamp"
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
rm -f "$stamp"  # written again only once every binary is in place
total_start=$SECONDS
log "building ${#missing[@]} binaries into $CACHE with $(go version | cut -d' ' -f3), -p $PARALLEL"
for t in "${missing[@]}"; do
    IFS='|' read -r name moddir pkg <<<"$t"
    ldflags="-s -w"
    if [[ "$moddir" == k8s/* ]]; then
        ldflags+="$version_ldflags"
    fi
    go_build_binary "$name" "$ROOT/$moddir" "$pkg" "$CACHE" -ldflags "$ldflags" || exit 1
done
rmdir "$CACHE/.partial" 2>/dev/null || true
"$CACHE/kube-apiserver" --version
"$CACHE/etcd" --version | head -1
echo "$expected_stamp" >"$stamp"
log "done in $((SECONDS - total_start)) s"
