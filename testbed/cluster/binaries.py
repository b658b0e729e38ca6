"""Locating the Kubernetes binaries built by tools/build-k8s.sh, for the chosen Kubernetes version.

tools/k8s/versions.tsv lists the versions the test bed supports; ``FRACGPU_K8S_VERSION`` chooses one (the row
marked default otherwise), and ``make``, the test bed, the demo and the benchmarks all read it. Each version's
binaries live in a directory of their own. A missing binary is an error, never a reason to skip: the message
names the build script. A binary of another version is refused, naming the version found and the one expected,
and every binary the test bed starts is announced with its version on stderr, so a stale one never runs silently.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "tools" / "build-k8s.sh"
VERSIONS_TABLE = REPO_ROOT / "tools" / "k8s" / "versions.tsv"
VERSION_ENV = "FRACGPU_K8S_VERSION"


class BinariesMissingError(RuntimeError):
    """The kube-apiserver / etcd / kube-controller-manager binaries have not been built."""


class UnsupportedVersionError(BinariesMissingError):
    """FRACGPU_K8S_VERSION names a version the test bed does not build, or a binary is of another version."""


@dataclass(frozen=True)
class KubernetesRelease:
    """One row of tools/k8s/versions.tsv."""

    version: str  # "v1.37.2"
    build_date: str
    etcd: str  # "v3.7.0"
    role: str  # "default" or "compatibility"

    @property
    def minor(self) -> int:
        return int(self.version.split(".")[1])


def supported_releases() -> list[KubernetesRelease]:
    releases = []
    for line in VERSIONS_TABLE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            version, build_date, etcd, role = line.split("\t")
            releases.append(KubernetesRelease(version, build_date, etcd, role))
    return releases


def selected_release(wanted: str | None = None) -> KubernetesRelease:
    """The release ``wanted`` (default: $FRACGPU_K8S_VERSION, else the table's default row) names, or raise."""
    wanted = os.environ.get(VERSION_ENV, "") if wanted is None else wanted
    releases = supported_releases()
    for release in releases:
        if (not wanted and release.role == "default") or wanted in (release.version, release.version[1:]):
            return release
    raise UnsupportedVersionError(
        f"{VERSION_ENV}={wanted} is not a supported Kubernetes version; expected one of: "
        f"{', '.join(r.version for r in releases)} ({VERSIONS_TABLE.relative_to(REPO_ROOT)})")


RELEASE = selected_release()
K8S_VERSION = RELEASE.version
ETCD_VERSION = RELEASE.etcd
DEFAULT_RELEASE = next(r for r in supported_releases() if r.role == "default")


def binaries_dir() -> Path:
    """The directory tools/build-k8s.sh builds this version into (``$FRACGPU_K8S_CACHE`` overrides it)."""
    override = os.environ.get("FRACGPU_K8S_CACHE")
    if override:
        return Path(override)
    return Path.home() / ".cache" / "fracgpu" / f"k8s-{K8S_VERSION}"


_versions_seen: dict[tuple[str, int], str] = {}


def binary_version(path: Path) -> str:
    """What ``path --version`` reports: "v1.37.2" for the Kubernetes binaries, "v3.7.0" for etcd."""
    key = (str(path), path.stat().st_mtime_ns)
    if key not in _versions_seen:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=30).stdout
        words = out.split()
        if path.name == "etcd":  # "etcd Version: 3.7.0\nGit SHA: ..."
            version = "v" + words[2] if len(words) > 2 else ""
        else:  # "Kubernetes v1.37.2"
            version = words[1] if len(words) > 1 else ""
        _versions_seen[key] = version or "unknown"
    return _versions_seen[key]


def find_binary(name: str, directory: Path | None = None) -> Path:
    """The path of an executable built by tools/build-k8s.sh for the chosen version, or raise loudly.

    Checks its version, and announces it on stderr: every caller is about to start it.
    """
    directory = directory or binaries_dir()
    path = directory / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise BinariesMissingError(
            f"{name} not found at {path}.  The fracgpu test bed runs a real kube-apiserver and etcd "
            f"({K8S_VERSION}) built from Go modules; build them with `make k8s-binaries` "
            f"(runs {BUILD_SCRIPT}; 10-25 min cold on 2 cores, instant when cached).  "
            f"Set FRACGPU_K8S_CACHE to use another directory, {VERSION_ENV} to choose another version."
        )
    expected = ETCD_VERSION if name == "etcd" else K8S_VERSION
    found = binary_version(path)
    if found != expected:
        raise UnsupportedVersionError(
            f"{path} is version {found}, expected {expected} (Kubernetes {K8S_VERSION}): the binary cache holds "
            f"another version's binaries; run `make k8s-binaries` or point FRACGPU_K8S_CACHE at the {K8S_VERSION} "
            "cache.")
    print(f"[testbed] {name} {found} ({path})", file=sys.stderr, flush=True)
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
