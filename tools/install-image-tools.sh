#!/usr/bin/env bash
# What `make images` (testbed/images) needs to build the Dockerfile's images with no Docker daemon and no registry,
# idempotently, from Debian's packages:
#   buildah     builds the Dockerfile as root (vfs storage driver, chroot isolation)
#   mmdebstrap  makes the stand-in base image (Debian bookworm's python3) where PYTHON_IMAGE cannot be pulled
# (--no-install-recommends: buildah's fuse-overlayfs, slirp4netns and runc serve rootless or overlay builds, which
# a root build with vfs and chroot never uses.) containerd and runc, which the image test runs the images with,
# come from tools/install-real-node-deps.sh. Needs Linux and root; elsewhere it stops and says so.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/apt.sh"

if [[ "$(uname -s)" != "Linux" || "$(id -u)" != "0" ]]; then
    echo "image-tools: building the images needs Linux and root (buildah runs as root with chroot isolation);" \
         "run make images as root on Linux" >&2
    exit 1
fi
apt_install_missing image-tools "buildah|/usr/bin/buildah" "mmdebstrap|/usr/bin/mmdebstrap"
