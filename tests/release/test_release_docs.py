"""Release hygiene: one version everywhere, a changelog that leads with operator action, a compatibility statement
that names what the test bed really runs, and documentation that stands on its own (no link out of the repository
into the spec folder users never see, no broken link)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from common.version import KAI_CONTRACT_COMMIT, version
from testbed.cluster.binaries import supported_releases
from testbed.cluster.manifests import MANIFESTS, render

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
DOCS = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIPPED_DIRS = {".git", "build", "dist", "__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis", ".venv"}
# Spelled in pieces so that this file does not match itself.
SPEC_POINTERS = re.compile("|".join([r"\.\./" + "shared/", "shared/" + "spec", "/work/" + "shared",
                                     r"\bDECISION" + r"S\b"]))


def project_files() -> list[Path]:
    found = []
    for path in ROOT.rglob("*"):
        if any(part in SKIPPED_DIRS or part.endswith(".egg-info") for part in path.relative_to(ROOT).parts):
            continue
        if path.is_file() and (path.suffix in {".md", ".py", ".yaml", ".yml", ".toml", ".json", ".sh", ".in", ".tpl"}
                               or path.name in {"Makefile", "Dockerfile"}):
            found.append(path)
    return found


def test_nothing_links_or_points_into_the_spec_folder():
    offenders = []
    for path in project_files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if SPEC_POINTERS.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not offenders, "users never see the spec folder; cite docs/decisions.md instead:\n" + "\n".join(offenders)


def slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
    return {slug(match) for match in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE)}


@pytest.mark.parametrize("document", DOCS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_relative_link_resolves(document):
    text = re.sub(r"```.*?```", "", document.read_text(), flags=re.DOTALL)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s):, mailto:
        file_part, _, anchor = target.partition("#")
        linked = (document.parent / file_part).resolve() if file_part else document
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with that anchor")
        if file_part and ROOT not in linked.parents and linked != ROOT:
            broken.append(f"{target}: outside the repository")
    assert not broken, broken


def test_the_package_reports_the_version_of_pyproject():
    assert version() == VERSION


def test_changelog_leads_each_release_with_operator_action():
    text = (ROOT / "CHANGELOG.md").read_text()
    releases = re.split(r"^## ", text, flags=re.MULTILINE)[1:]
    names = [release.splitlines()[0].strip() for release in releases]
    assert VERSION in names, f"CHANGELOG.md has no section for {VERSION}: {names}"
    assert all(name == "Unreleased" or re.fullmatch(r"\d+\.\d+\.\d+", name) for name in names), names
    for release in releases:
        subsections = re.findall(r"^### (.+)$", release, re.MULTILINE)
        assert subsections and subsections[0] == "Operator action required", (release.splitlines()[0], subsections)


def test_compatibility_statement_names_what_is_tested():
    text = (ROOT / "docs" / "compatibility.md").read_text()
    row = next((line for line in text.splitlines() if line.startswith(f"| {VERSION} |")), None)
    assert row, f"docs/compatibility.md has no row for {VERSION}"
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert KAI_CONTRACT_COMMIT in cells[1]
    releases = supported_releases()
    assert cells[2] == ", ".join(r.version for r in releases)  # every version the test bed builds and tests runs on
    table = text[text.index("### Tested versions"):text.index("### Supported, not tested")]
    for release in releases:
        row = next(line for line in table.splitlines() if line.startswith(f"| **{release.version}** ({release.role})"))
        assert f"| {release.etcd[1:]} |" in row
        if release.role == "compatibility":  # the command is the Makefile's compatibility set, word for word
            makefile = (ROOT / "Makefile").read_text()
            compat = re.search(r"^COMPAT_TESTS := (.*?)\n(?!\t)", makefile, re.MULTILINE | re.DOTALL)
            assert compat, "Makefile has no COMPAT_TESTS"
            marks = re.search(r"^COMPAT_MARKS := (.*)$", makefile, re.MULTILINE)
            assert marks, "Makefile has no COMPAT_MARKS"
            paths = compat.group(1).replace("\\\n\t", "").split()
            command = (f"FRACGPU_K8S_VERSION={release.version} python -m pytest -q -m \"{marks.group(1)}\" "
                       f"{' '.join(paths)}`")
            assert command in row, command


def test_shipped_manifests_run_the_image_of_this_version():
    tags = set()
    for directory in [MANIFESTS, *sorted((MANIFESTS / "overlays").iterdir())]:
        for document in render(directory):
            spec = document.get("spec") or {}
            template = (spec.get("jobTemplate") or {}).get("spec", {}).get("template") or spec.get("template")
            for container in (template or {}).get("spec", {}).get("containers", []):
                image = container["image"]
                if image.startswith("fracgpu/") and "@" not in image:
                    tags.add(image.rsplit(":", 1)[-1])
    assert tags == {VERSION}
