"""requirements/*.lock: hash-locked dependencies of the images and of CI, and the SBOM made from them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = ROOT / "requirements"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def pins(lock: str) -> dict[str, tuple[str, set[str]]]:
    """canonical name -> (version, sha256 hashes) of every requirement of requirements/<lock>.lock."""
    found: dict[str, tuple[str, set[str]]] = {}
    text = re.sub(r"\\\n\s*", " ", (REQUIREMENTS / f"{lock}.lock").read_text())
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
        assert match, f"{lock}.lock: not an exact pin: {line[:80]}"
        found[canonicalize_name(match[1])] = (match[2], set(re.findall(r"--hash=sha256:([0-9a-f]{64})", line)))
    return found


@pytest.mark.parametrize(("lock", "requirements"), [
    ("runtime", PYPROJECT["project"]["dependencies"]),
    ("test", PYPROJECT["project"]["dependencies"] + PYPROJECT["project"]["optional-dependencies"]["test"]),
    ("build", PYPROJECT["build-system"]["requires"]),
])
def test_every_declared_dependency_is_pinned_within_its_range(lock, requirements):
    pinned = pins(lock)
    for text in requirements:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{requirement.name} is missing from requirements/{lock}.lock: run `make lock`"
        assert requirement.specifier.contains(pinned[name][0], prereleases=True), (text, pinned[name][0])


@pytest.mark.parametrize("lock", ["runtime", "reservation", "build", "test"])
def test_every_pin_carries_the_hashes_of_its_files(lock):
    for name, (_, hashes) in pins(lock).items():
        assert hashes, f"{name} in requirements/{lock}.lock has no --hash"


def test_locks_pin_the_same_versions_and_the_images_carry_no_kubernetes():
    runtime = pins("runtime")
    for lock in ("reservation", "test"):
        for name, (version, _) in pins(lock).items():
            if name in runtime:
                assert version == runtime[name][0], f"{name}: {lock}.lock {version}, runtime.lock {runtime[name][0]}"
    assert "kubernetes" not in runtime
    assert set(pins("reservation")) < set(runtime)


def test_make_install_installs_the_test_lock_with_hashes_and_resolves_nothing():
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^install:\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert recipe, "Makefile has no install target"
    lines = recipe[1].splitlines()
    assert any("--require-hashes" in line and "-r requirements/test.lock" in line for line in lines), lines
    assert all("--no-deps" in line for line in lines if "install" in line), lines


@pytest.mark.parametrize(("lock", "sbom"), [("runtime", "sbom-fracgpu.cdx.json"),
                                            ("reservation", "sbom-fracgpu-reservation.cdx.json")])
def test_make_sbom_lists_every_locked_package_with_its_hashes(tmp_path, lock, sbom):
    result = subprocess.run(["make", "-s", "sbom", f"PYTHON={sys.executable}", f"SBOM_DIR={tmp_path}"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    document = json.loads((tmp_path / sbom).read_text())
    assert document["bomFormat"] == "CycloneDX"
    root = document["metadata"]["component"]
    assert (root["name"], root["version"]) == ("fracgpu", PYPROJECT["project"]["version"])
    listed = {}
    for component in document["components"]:
        hashes = {h["content"] for ref in component.get("externalReferences", []) for h in ref.get("hashes", [])}
        listed[canonicalize_name(component["name"])] = (component["version"], hashes)
        assert component["purl"] == f"pkg:pypi/{component['name']}@{component['version']}"
    locked = pins(lock)
    assert {name: version for name, (version, _) in listed.items()} == \
        {name: version for name, (version, _) in locked.items()}
    for name, (_, hashes) in listed.items():
        assert hashes and hashes <= locked[name][1], name
