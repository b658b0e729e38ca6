#!/usr/bin/env bash
# Build the chart tools the fracgpu tests run (docs/testing.md):
#   helm       helm.sh/helm/v3/cmd/helm v3.20.2
#   kustomize  sigs.k8s.io/kustomize/kustomize/v5 v5.7.1 (the kustomize kubectl v1.35 embeds)
# from the wrapper module tools/helm into ${FRACGPU_HELM_CACHE:-$HOME/.cache/fracgpu/helm-v3.20.2}/.
#
# Same rules as build-k8s.sh: idempotent (a binary already in the cache is not rebuilt; `--force` rebuilds),
# static (CGO_ENABLED=0), -trimpath, moved into place only once complete, Go parallelism capped by
# FRACGPU_BUILD_P (default 2). helm's Kubernetes libraries are pinned in tools/helm/go.mod to v0.35.4, the
# test bed's version, so its client is the apiserver's own and tools/k8s's Go build cache is reused.
set -euo pipefail

HELM_VERSION="v3.20.2"
KUSTOMIZE_VERSION="v5.7.1"
# The Kubernetes minor helm assumes when no cluster is asked (`helm template`, `helm lint`): the test bed's.
K8S_MAJOR="1"
K8S_MINOR="35"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$ROOT/lib/gobuild.sh"
CACHE="${FRACGPU_HELM_CACHE:-$HOME/.cache/fracgpu/helm-${HELM_VERSION}}"
PARALLEL="${FRACGPU_BUILD_P:-2}"
FORCE=0
if [[ "${1:-}" == "--force" ]]; then
    FORCE=1
elif [[ $# -gt 0 ]]; then
    echo "usage: $0 [--force]" >&2
    exit 2
fi

# name|package|ldflags
TARGETS=(
    "helm|helm.sh/helm/v3/cmd/helm|-X helm.sh/helm/v3/internal/version.version=${HELM_VERSION} -X helm.sh/helm/v3/internal/version.gitTreeState=clean -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=${K8S_MAJOR} -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=${K8S_MINOR} -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=${K8S_MAJOR} -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=${K8S_MINOR}"
    "kustomize|sigs.k8s.io/kustomize/kustomize/v5|"
)

log() { echo "[build-helm $(date +%H:%M:%S)] $*"; }

missing=()
for t in "${TARGETS[@]}"; do
    name="${t%%|*}"
    if [[ $FORCE -eq 1 || ! -x "$CACHE/$name" ]]; then
        missing+=("$t")
    fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
    log "helm and kustomize present in $CACHE; nothing to do"
    exit 0
fi

command -v go >/dev/null || { echo "build-helm: the go command is required (Go >= 1.26)" >&2; exit 1; }

total_start=$SECONDS
log "building ${#missing[@]} binaries into $CACHE with $(go version | cut -d' ' -f3), -p $PARALLEL"
for t in "${missing[@]}"; do
    IFS='|' read -r name pkg extra <<<"$t"
    go_build_binary "$name" "$ROOT/helm" "$pkg" "$CACHE" -ldflags "-s -w $extra" || exit 1
done
rmdir "$CACHE/.partial" 2>/dev/null || true
"$CACHE/helm" version --short
"$CACHE/kustomize" version
log "done in $((SECONDS - total_start)) s"
