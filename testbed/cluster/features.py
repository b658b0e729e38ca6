"""Feature gates of the test bed's Kubernetes version, read from that version's own source.

The binaries are built from k8s.io/kubernetes in the Go module cache (tools/build-k8s.sh), so the source of
pkg/features/kube_features.go is there beside them. Which gates are on by default changes between releases
(DRAExtendedResource: alpha and off in 1.35, GA and locked on in 1.37; DRAConsumableCapacity: off in 1.35, beta and
on from 1.36), and a gate passed to a release that has removed it stops the binary. So the test bed never assumes a
default: ``gate_flags`` gives the ``--feature-gates`` a component needs for the gates a test wants, and nothing for
a gate that is already at the wanted value.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from testbed.cluster.binaries import K8S_VERSION, BinariesMissingError


@dataclass(frozen=True)
class GateSpec:
    """What one gate is at one release: its default, its stage, whether it is locked to that default."""

    name: str
    default: bool
    stage: str  # "Alpha", "Beta", "GA", "Deprecated"
    locked: bool


def module_source(version: str = K8S_VERSION) -> Path:
    """k8s.io/kubernetes@<version> in the Go module cache, where tools/build-k8s.sh built the binaries from."""
    cache = os.environ.get("GOMODCACHE") or ""
    if not cache:
        try:
            cache = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True, timeout=30).stdout
        except OSError:
            cache = ""
        cache = cache.strip() or str(Path.home() / "go" / "pkg" / "mod")
    source = Path(cache) / f"k8s.io/kubernetes@{version}"
    if not (source / "pkg" / "features" / "kube_features.go").is_file():
        raise BinariesMissingError(f"the source of k8s.io/kubernetes {version} is not in the Go module cache "
                                   f"({source}); `make k8s-binaries` downloads it")
    return source


_SPEC = re.compile(r"\{(Version:[^{}]*)\}")  # one versioned spec; its fields come in any order
_FIELDS = {"version": re.compile(r"MustParse\(\"(\d+)\.(\d+)\"\)"), "default": re.compile(r"Default:\s*(true|false)"),
           "stage": re.compile(r"PreRelease:\s*featuregate\.(\w+)"), "locked": re.compile(r"LockToDefault:\s*(true)")}


@functools.cache
def gate_specs(version: str = K8S_VERSION) -> dict[str, GateSpec]:
    """Every Kubernetes gate of pkg/features/kube_features.go at ``version``: the last versioned spec not newer
    than the release's minor version (as component-base's versioned feature gates resolve it)."""
    text = (module_source(version) / "pkg" / "features" / "kube_features.go").read_text()
    start = text.index("var defaultVersionedKubernetesFeatureGates")
    table = text[start:text.index("\n}\n", start)]
    minor = int(version.split(".")[1])
    specs: dict[str, GateSpec] = {}
    for match in re.finditer(r"^\t(?:\w+\.)?(\w+):\s*\{(.*?)^\t\},", table, re.MULTILINE | re.DOTALL):
        name, body = match.groups()
        current = None
        for spec in _SPEC.findall(body):
            fields = {key: pattern.search(spec) for key, pattern in _FIELDS.items()}
            if not (fields["version"] and fields["default"] and fields["stage"]):
                raise ValueError(f"cannot read the feature gate spec of {name} in Kubernetes {version}: {spec}")
            if (int(fields["version"].group(1)), int(fields["version"].group(2))) <= (1, minor):
                current = GateSpec(name, fields["default"].group(1) == "true", fields["stage"].group(1),
                                   fields["locked"] is not None)
        if current is not None:
            specs[name] = current
    return specs


def gate_flags(wanted: dict[str, bool], version: str = K8S_VERSION) -> list[str]:
    """``--feature-gates`` setting each wanted gate that is not already at its value; [] when all are. Raises for
    a gate the release does not know or has locked to the other value."""
    specs = gate_specs(version)
    settings = []
    for name, value in sorted(wanted.items()):
        spec = specs.get(name)
        if spec is None:
            raise ValueError(f"Kubernetes {version} has no feature gate {name}")
        if spec.default == value:
            continue
        if spec.locked:
            raise ValueError(f"Kubernetes {version} locks {name} to {str(spec.default).lower()}")
        settings.append(f"{name}={str(value).lower()}")
    return [f"--feature-gates={','.join(settings)}"] if settings else []
