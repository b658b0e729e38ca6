"""The Dockerfile's two images, built as `make images` builds them (buildah from Debian, no Docker daemon, no
registry: testbed/images), imported into a containerd of their own and run as a kubelet runs them: the image's own
user and entry point, a read-only root file system and a tmpfs on /tmp. Linux and root; a missing builder or
runtime fails, never skips."""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.images import Image, ImageBuildError, build_images, image_names, version
from testbed.images.buildah import Buildah
from testbed.images.context import pip_trust
from testbed.realnodes.throwaway import throwaway_containerd

# Every program of each image: the manifests' first arguments, and the default command (the reservation program).
PROGRAMS = {"fracgpu": ("admission", "binder", "extender", "certs", "binder.reservation"),
            "reservation": ("binder.reservation",)}
# A cold build takes minutes (docs/testing.md); `make test` builds the images before pytest starts.
pytestmark = pytest.mark.timeout(1800)
TMP = "type=tmpfs,src=tmpfs,dst=/tmp,options=rw:nosuid:nodev:mode=1777"  # as an emptyDir on /tmp


@pytest.fixture(scope="module")
def images() -> dict[str, Image]:
    started = time.monotonic()
    try:
        built = build_images(report=print)
    except ImageBuildError as error:
        pytest.fail(f"make images failed: {error}")
    print(f"images ready in {time.monotonic() - started:.1f} s")
    return built


@pytest.fixture(scope="module")
def ctr(images: dict[str, Image], tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """A throwaway containerd with both archives imported, as a node's containerd imports them."""
    with throwaway_containerd(tmp_path_factory.mktemp("containerd")) as command:
        for image in images.values():
            started = time.monotonic()
            result = subprocess.run([*command, "images", "import", "--snapshotter", "overlayfs", str(image.tarball)],
                                    capture_output=True, text=True, timeout=300, check=False)
            assert result.returncode == 0, f"ctr images import {image.tarball}: {result.stderr}"
            print(f"imported {image.name} in {time.monotonic() - started:.1f} s")
        yield command


def image_config(image: Image) -> dict:
    with tarfile.open(image.tarball) as archive:
        blob = lambda digest: json.load(archive.extractfile(f"blobs/sha256/{digest.split(':')[1]}"))  # noqa: E731
        index = json.load(archive.extractfile("index.json"))
        manifest = blob(index["manifests"][0]["digest"])
        return blob(manifest["config"]["digest"])["config"]


def run(ctr: list[str], image: Image, container: str, argv: list[str], read_only: bool) -> subprocess.CompletedProcess:
    """`ctr run` with the image's config (user, env, working directory), argv as the process, /tmp a tmpfs."""
    flags = ["--rm", "--read-only"] if read_only else []
    return subprocess.run([*ctr, "run", *flags, "--mount", TMP, image.name, container, *argv],
                          capture_output=True, text=True, timeout=120, check=False)


def written_outside_tmp(ctr: list[str], container: str) -> list[str]:
    """What the container's processes wrote to its root file system: the files of its snapshot's upper layer."""
    mounts = subprocess.run([*ctr, "snapshots", "--snapshotter", "overlayfs", "mounts", "/", container],
                            capture_output=True, text=True, check=True).stdout
    upper = next(option.removeprefix("upperdir=") for option in mounts.replace(" ", ",").split(",")
                 if option.startswith("upperdir="))
    written = sorted(str(path.relative_to(upper)) for path in Path(upper).rglob("*") if not path.is_dir())
    subprocess.run([*ctr, "containers", "rm", container], capture_output=True, check=True)
    return written


def test_both_archives_import_under_the_names_the_manifests_use(images: dict[str, Image], ctr: list[str]) -> None:
    assert {target: image.name for target, image in images.items()} == image_names()
    # The manifests say fracgpu/fracgpu:<version>: a kubelet asks containerd for docker.io/fracgpu/fracgpu:<version>.
    assert images["fracgpu"].name == f"docker.io/fracgpu/fracgpu:{version()}"
    check = subprocess.run([*ctr, "images", "check"], capture_output=True, text=True, check=True).stdout
    for image in images.values():
        [line] = [line for line in check.splitlines() if line.startswith(f"{image.name} ")]
        assert "complete" in line and line.split()[-1] == "true", f"{image.name} is not complete and unpacked: {line}"


@pytest.mark.parametrize("target", sorted(PROGRAMS))
def test_every_program_prints_its_version_as_65532_on_a_read_only_root(
        images: dict[str, Image], ctr: list[str], target: str) -> None:
    image = images[target]
    config = image_config(image)
    assert config["User"] == "65532:65532" and config["WorkingDir"] == "/tmp"
    assert config["Entrypoint"] == ["python", "-m"] and config["Cmd"] == ["binder.reservation"]
    who = run(ctr, image, f"{target}-who", ["python", "-c", "import os; print(os.getuid(), os.getgid(), "
                                            "os.access('/', os.W_OK), os.access('/tmp', os.W_OK))"], read_only=True)
    assert who.returncode == 0 and who.stdout.split() == ["65532", "65532", "False", "True"], who
    for program in PROGRAMS[target]:
        started = time.monotonic()
        result = run(ctr, image, f"{target}-{program.replace('.', '-')}-ro",
                     [*config["Entrypoint"], program, "--version"], read_only=True)
        assert result.returncode == 0, f"{program} --version in {image.name}: {result.stdout}{result.stderr}"
        assert f" {version()} " in result.stdout, result.stdout
        print(f"{image.name}: {result.stdout.strip()} ({time.monotonic() - started:.1f} s)")


@pytest.mark.parametrize("target", sorted(PROGRAMS))
def test_no_program_writes_a_file_outside_tmp(images: dict[str, Image], ctr: list[str], target: str) -> None:
    """Run once more on a writable root, and read what landed in the container's own layer: it must be nothing."""
    image = images[target]
    # The check itself: a write the root file system takes is seen.
    probe = run(ctr, image, f"{target}-probe", ["python", "-c", "open('/var/tmp/probe', 'w').write('x')"],
                read_only=False)
    assert probe.returncode == 0, probe
    assert written_outside_tmp(ctr, f"{target}-probe") == ["var/tmp/probe"]
    for program in PROGRAMS[target]:
        container = f"{target}-{program.replace('.', '-')}-rw"
        result = run(ctr, image, container, ["python", "-m", program, "--version"], read_only=False)
        assert result.returncode == 0, f"{program} --version in {image.name}: {result.stdout}{result.stderr}"
        assert written_outside_tmp(ctr, container) == [], f"{program} wrote outside /tmp"


def test_the_build_trusts_this_machine_without_baking_its_pip_settings_in(images: dict[str, Image]) -> None:
    """pip.conf and the CA bundle were mounted into the RUN steps: no layer the build added holds either of them.

    The base's own layer is left out: it is Debian's, and on a machine that added no CA of its own, Debian's bundle
    is byte for byte the machine's."""
    trust = pip_trust()
    host = {hashlib.sha256(path.read_bytes()).hexdigest(): str(path) for path in trust.files if path.is_file()}
    host[hashlib.sha256(trust.conf.encode()).hexdigest()] = "the build's pip.conf"
    for image in images.values():
        with tarfile.open(image.tarball) as archive:
            index = json.load(archive.extractfile("index.json"))
            manifest = json.load(archive.extractfile(f"blobs/sha256/{index['manifests'][0]['digest'][7:]}"))
            assert len(manifest["layers"]) >= 2, f"{image.name}: no layer above the base"
            for layer in manifest["layers"][1:]:
                blob = archive.extractfile(f"blobs/sha256/{layer['digest'][7:]}")
                with tarfile.open(fileobj=gzip.GzipFile(fileobj=blob), mode="r|") as files:
                    for member in files:
                        assert member.name.lstrip("./") not in ("etc/pip.conf", "etc/xdg/pip/pip.conf"), image.name
                        if member.isfile() and member.size < 4 << 20:
                            digest = hashlib.sha256(files.extractfile(member).read()).hexdigest()
                            assert digest not in host, f"{image.name} holds {host.get(digest)} as {member.name}"


def test_unchanged_inputs_reuse_the_archives() -> None:
    # Two calls back to back: on a shared working tree another developer's edit may change the inputs between the
    # module's first build and this test, but hardly within the half second between these two calls.
    first = build_images()
    started = time.monotonic()
    again = build_images()
    seconds = time.monotonic() - started
    print(f"cached build: {seconds:.1f} s")
    assert again == first and seconds < 15


def test_a_missing_builder_stops_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ImageBuildError, match=r"buildah is not installed; fix: make image-tools"):
        build_images(tmp_path / "cache")


def test_a_base_image_not_on_this_machine_fails_at_once_without_asking_a_registry(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM registry.invalid/fracgpu/absent:1 AS absent\nRUN true\n")
    buildah = Buildah(tmp_path / "storage")
    started = time.monotonic()
    with pytest.raises(ImageBuildError, match=r"step: buildah bud --target absent") as failed:
        buildah.build(tmp_path, "absent", "localhost/absent:1", {}, [], tmp_path / "build.log")
    assert "registry.invalid/fracgpu/absent:1" in str(failed.value)
    assert time.monotonic() - started < 30
