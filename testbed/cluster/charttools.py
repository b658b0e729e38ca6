"""helm and kustomize, built by tools/build-helm.sh, for the chart and manifest tests.

A missing binary is an error, never a reason to skip: the message names the build script.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from testbed.cluster.binaries import K8S_VERSION

HELM_VERSION = "v3.20.2"
REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "tools" / "build-helm.sh"
CHART = REPO_ROOT / "charts" / "fracgpu"


class ChartToolMissingError(RuntimeError):
    """helm or kustomize has not been built."""


def tools_dir() -> Path:
    """Where tools/build-helm.sh puts them (``$FRACGPU_HELM_CACHE`` overrides it)."""
    override = os.environ.get("FRACGPU_HELM_CACHE")
    return Path(override) if override else Path.home() / ".cache" / "fracgpu" / f"helm-{HELM_VERSION}"


def tool(name: str) -> Path:
    path = tools_dir() / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise ChartToolMissingError(
            f"{name} not found at {path}. The chart and manifest tests run helm {HELM_VERSION} and kustomize built "
            f"from Go modules: build them with `make chart-tools` (runs {BUILD_SCRIPT}; under a minute with a warm "
            "Go build cache). Set FRACGPU_HELM_CACHE to use another directory.")
    return path


def run(name: str, args: Sequence[str], timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    """Run helm or kustomize without any user or cluster configuration leaking in."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tools_dir()),
           "HELM_CACHE_HOME": str(tools_dir() / ".helm-cache"), "HELM_CONFIG_HOME": str(tools_dir() / ".helm-config"),
           "HELM_DATA_HOME": str(tools_dir() / ".helm-data")}
    result = subprocess.run([str(tool(name)), *args], capture_output=True, text=True, timeout=timeout, env=env)
    if check and result.returncode != 0:
        raise RuntimeError(f"{name} {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def kustomize_build(directory: Path | str) -> list[dict[str, Any]]:
    return documents(run("kustomize", ["build", str(directory)]).stdout)


def helm_template(values_files: Sequence[Path | str] = (), settings: Sequence[str] = (), release: str = "fracgpu",
                  namespace: str = "fracgpu-system", kube_version: str = K8S_VERSION) -> list[dict[str, Any]]:
    """`helm template` as the chart renders for a cluster of ``kube_version`` (default: the test bed's version)."""
    args = ["template", release, str(CHART), "--namespace", namespace, "--kube-version", kube_version]
    for values in values_files:
        args += ["--values", str(values)]
    for setting in settings:
        args += ["--set", setting]
    return documents(run("helm", args).stdout)
