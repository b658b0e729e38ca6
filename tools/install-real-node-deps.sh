#!/usr/bin/env bash
# What the test bed's real nodes (testbed/realnodes, docs/testing.md) need on this machine, idempotently:
#   runc, CNI plugins, static busybox, iptables and conntrack (apt; skipped when present),
#   containerd 2.x with its runc shim and ctr (tools/build-containerd.sh, from the Go module proxy; a no-op when
#   cached: Debian bookworm's containerd 1.6 is too old for Kubernetes v1.36+ kubelets and has no CRI CDI edits),
#   and kubelet + kube-proxy v1.35.4 (tools/build-k8s.sh, a no-op when cached).
# Real nodes need Linux and root; elsewhere this says so and exits 0, and the real-node tests fail naming it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
log() { echo "[real-node-deps $(date +%H:%M:%S)] $*"; }

if [[ "$(uname -s)" != "Linux" || "$(id -u)" != "0" ]]; then
    log "real nodes need Linux and root; skipping their install (python -m testbed.demo --played-nodes runs here)"
    exit 0
fi
source "$ROOT/tools/lib/apt.sh"
apt_install_missing real-node-deps \
    "runc|/usr/sbin/runc" \
    "containernetworking-plugins|/usr/lib/cni/bridge" \
    "busybox-static|/usr/bin/busybox" \
    "iptables|/usr/sbin/iptables" \
    "conntrack|/usr/sbin/conntrack"
"$ROOT/tools/build-containerd.sh"
"$ROOT/tools/build-k8s.sh"
