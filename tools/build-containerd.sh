#!/usr/bin/env bash
# Build the container runtime the fracgpu test bed's real nodes run (testbed/realnodes, docs/testing.md):
#   containerd, containerd-shim-runc-v2 and ctr (github.com/containerd/containerd/v2, tools/containerd)
# into ${FRACGPU_CONTAINERD_CACHE:-$HOME/.cache/fracgpu/containerd-<version>}/. runc stays Debian's (apt, /usr/sbin/runc).
#
# The version is the one tools/containerd/go.mod requires (the single place to change it). containerd 2.x because
# Kubernetes v1.36+ kubelets drop containerd 1.x, and DRA drivers need the CRI's CDI device edits.
#
# Idempotent: a binary already in the cache is not rebuilt; when all are present this does nothing.
# `--force` rebuilds everything. A cache directory that holds another version (the VERSION stamp written after
# each build, or `containerd --version`) is refused with both versions named, never reused.
# Builds are static (CGO_ENABLED=0, with the tags of containerd's own `make STATIC=1`; btrfs needs cgo, so it is
# left out, as the nodes' config disables it anyway), -trimpath, and carry the version stamp, so `containerd
# --version` prints it. Go parallelism is capped (-p, default 2) because the machine is shared; override with
# FRACGPU_BUILD_P.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$ROOT/lib/gobuild.sh"
MODULE_DIR="$ROOT/containerd"
MODULE="github.com/containerd/containerd/v2"
VERSION="$(awk -v m="$MODULE" '$1 == m {print $2; exit}' "$MODULE_DIR/go.mod")"
[[ -n "$VERSION" ]] || { echo "build-containerd: $MODULE_DIR/go.mod requires no $MODULE" >&2; exit 1; }

CACHE="${FRACGPU_CONTAINERD_CACHE:-$HOME/.cache/fracgpu/containerd-${VERSION}}"
PARALLEL="${FRACGPU_BUILD_P:-2}"
FORCE=0
if [[ "${1:-}" == "--force" ]]; then
    FORCE=1
elif [[ $# -gt 0 ]]; then
    echo "usage: $0 [--force]" >&2
    exit 2
fi

# containerd's Makefile: urfave_cli_no_docs always, osusergo netgo static_build for STATIC=1, no_grpc for the shim.
TAGS="urfave_cli_no_docs osusergo netgo static_build no_btrfs"
# name|package|extra tags
TARGETS=(
    "containerd|$MODULE/cmd/containerd|"
    "containerd-shim-runc-v2|$MODULE/cmd/containerd-shim-runc-v2| no_grpc"
    "ctr|$MODULE/cmd/ctr|"
)

log() { echo "[build-containerd ${VERSION} $(date +%H:%M:%S)] $*"; }

# A cache that holds another version is refused before anything is built or reused (--force rebuilds it).
stamp="$CACHE/VERSION"
expected_stamp="containerd ${VERSION}"
if [[ $FORCE -eq 0 && -d "$CACHE" ]]; then
    if [[ -f "$stamp" ]]; then
        found="$(cat "$stamp")"
        if [[ "$found" != "$expected_stamp" ]]; then
            echo "build-containerd: $CACHE holds '$found', expected '$expected_stamp'; point FRACGPU_CONTAINERD_CACHE elsewhere or rebuild with --force" >&2
            exit 1
        fi
    elif [[ -x "$CACHE/containerd" ]]; then
        # No stamp (an interrupted first build, or a directory of other binaries): the binary's own version decides.
        found="$("$CACHE/containerd" --version 2>/dev/null | awk '{print $3}')"
        if [[ "$found" != "$VERSION" ]]; then
            echo "build-containerd: $CACHE/containerd is containerd ${found:-of no known version}, expected $VERSION; point FRACGPU_CONTAINERD_CACHE elsewhere or rebuild with --force" >&2
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

command -v go >/dev/null || { echo "build-containerd: the go command is required (Go >= 1.26)" >&2; exit 1; }

ldflags="-s -w -X ${MODULE}/version.Version=${VERSION} -X ${MODULE}/version.Package=${MODULE}"

mkdir -p "$CACHE"
rm -f "$stamp"  # written again only once every binary is in place
total_start=$SECONDS
log "building ${#missing[@]} binaries into $CACHE with $(go version | cut -d' ' -f3), -p $PARALLEL"
for t in "${missing[@]}"; do
    IFS='|' read -r name pkg extra_tags <<<"$t"
    go_build_binary "$name" "$MODULE_DIR" "$pkg" "$CACHE" -tags "${TAGS}${extra_tags}" -ldflags "$ldflags" || exit 1
done
rmdir "$CACHE/.partial" 2>/dev/null || true
"$CACHE/containerd" --version
echo "$expected_stamp" >"$stamp"
log "done in $((SECONDS - total_start)) s"
