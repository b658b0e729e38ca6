"""Locating the control-plane binaries built by tools/build-k8s.sh.

A missing binary is an error, never a reason to skip: the message names the build script.
"""

from __future__ import annotations

import os
from pathlib import Path

K8S_VERSION = "v1.35.4"
REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "tools" / "build-k8s.sh"


class BinariesMissingError(RuntimeError):
    """The kube-apiserver / etcd / kube-controller-manager binaries have not been built."""


def binaries_dir() -> Path:
    """The directory tools/build-k8s.sh builds into (``$FRACGPU_K8S_CACHE`` overrides it)."""
    override = os.environ.get("FRACGPU_K8S_CACHE")
    if override:
        return Path(override)
    return Path.home() / ".cache" / "fracgpu" / f"k8s-{K8S_VERSION}"


def find_binary(name: str, directory: Path | None = None) -> Path:
    """Return the path of an executable built by tools/build-k8s.sh, or raise loudly."""
    directory = directory or binaries_dir()
    path = directory / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise BinariesMissingError(
            f"{name} not found at {path}.  The fracgpu test bed runs a real kube-apiserver and etcd "
            f"({K8S_VERSION}) built from Go modules; build them with `make k8s-binaries` "
            f"(runs {BUILD_SCRIPT}; 10-25 min cold on 2 cores, instant when cached).  "
            "Set FRACGPU_K8S_CACHE to use another directory."
        )
    return path


PROMETHEUS_VERSION = "3.16.0"
PROMTOOL_BUILD_SCRIPT = REPO_ROOT / "tools" / "build-promtool.sh"


def find_promtool() -> Path:
    """promtool built by tools/build-promtool.sh (``$FRACGPU_PROMTOOL_CACHE`` overrides its directory), or raise."""
    directory = Path(os.environ.get("FRACGPU_PROMTOOL_CACHE")
                     or Path.home() / ".cache" / "fracgpu" / f"promtool-v{PROMETHEUS_VERSION}")
    path = directory / "promtool"
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise BinariesMissingError(
            f"promtool not found at {path}.  The alert rules are checked with promtool v{PROMETHEUS_VERSION} "
            f"built from its Go module; build it with `make promtool` (runs {PROMTOOL_BUILD_SCRIPT}; about "
            "2 min cold on 2 cores, instant when cached).  Set FRACGPU_PROMTOOL_CACHE to use another directory."
        )
    return path
