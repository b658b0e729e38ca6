"""fracgpu's own images, built from the Dockerfile as users build them, with no Docker daemon and no registry.

`build_images()` (and `make images`, `python -m testbed.images`) builds both Dockerfile targets with buildah
(testbed/images/buildah.py) FROM a stand-in for PYTHON_IMAGE made from Debian bookworm's packages
(testbed/images/base.py), with this machine's pip configuration and CA bundle mounted into the RUN steps
(testbed/images/context.py), and writes each as an OCI archive that `ctr -n k8s.io images import` takes:

  fracgpu      docker.io/fracgpu/fracgpu:<version>              every program (the manifests' fracgpu/fracgpu)
  reservation  docker.io/fracgpu/fracgpu-reservation:<version>  the reservation pod program only

Builds are cached (default ~/.cache/fracgpu/dockerfile-images/, or $FRACGPU_IMAGE_CACHE) under a hash of their
inputs: the Dockerfile, .dockerignore and every file of the build context it admits, the base, buildah's version
and this package. An unchanged input costs a few file reads; a changed one rebuilds both targets. A failure stops
with an ImageBuildError that names the step and the fix.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

from testbed.images.base import base_key, ensure_base
from testbed.images.buildah import Buildah
from testbed.images.context import BUILD_PIP_CONF, context_files, pip_trust
from testbed.realnodes.images import ARCHITECTURES, Image, ImageBuildError

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CACHE = Path(os.environ.get("FRACGPU_IMAGE_CACHE", Path.home() / ".cache" / "fracgpu" / "dockerfile-images"))
TARGETS = ("fracgpu", "reservation")  # the Dockerfile's stages that are images
STALE_AFTER_S = 600
REPOSITORIES = {"fracgpu": "docker.io/fracgpu/fracgpu", "reservation": "docker.io/fracgpu/fracgpu-reservation"}


def version() -> str:
    with open(REPO / "pyproject.toml", "rb") as file:
        return str(tomllib.load(file)["project"]["version"])


def image_names() -> dict[str, str]:
    """Dockerfile target -> the name its archive carries (what a kubelet asks containerd for)."""
    return {target: f"{REPOSITORIES[target]}:{version()}" for target in TARGETS}


def build_images(cache_dir: Path | None = None, report: Callable[[str], None] = lambda _: None) -> dict[str, Image]:
    """Both targets' OCI archives, by target: from the cache when their inputs are unchanged, else built now."""
    cache = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second `make images` waits, then finds the first one's archives
        return _build_locked(cache, report)


def _build_locked(cache: Path, report: Callable[[str], None]) -> dict[str, Image]:
    buildah = Buildah(cache / "buildah")
    key = _key(buildah)
    names = image_names()
    archives = {target: cache / f"{_slug(names[target])}-{key}.tar" for target in TARGETS}
    if all(archive.is_file() for archive in archives.values()):
        return {target: Image(names[target], archives[target]) for target in TARGETS}
    started = time.monotonic()
    base = ensure_base(buildah, cache)
    report(f"base image {base} ready after {time.monotonic() - started:.0f} s")
    trust = pip_trust()
    with tempfile.TemporaryDirectory(prefix=".build-", dir=cache) as work:
        pip_conf = Path(work) / "pip.conf"
        pip_conf.write_text(trust.conf)
        volumes = [(pip_conf, BUILD_PIP_CONF), *((path, str(path)) for path in trust.files)]
        for target in TARGETS:
            if archives[target].is_file():
                continue
            tag = f"localhost/fracgpu-build/{target}:{key}"
            log = cache / f"build-{target}.log"
            began = time.monotonic()
            buildah.build(REPO, target, tag, {"PYTHON_IMAGE": base}, volumes, log)
            partial = Path(work) / f"{target}.tar"
            try:
                buildah.push_archive(tag, partial, names[target])
            finally:
                buildah.remove_image(tag)
            os.replace(partial, archives[target])  # atomic: a reader sees no archive or a whole one
            report(f"{names[target]} built in {time.monotonic() - began:.0f} s: {archives[target]}")
    # Older builds of the same image go, once no one can still be about to import them: another test run on this
    # machine may have been handed one a moment before this build replaced it.
    for target in TARGETS:
        for stale in cache.glob(f"{_slug(names[target])}-*.tar"):
            if stale != archives[target] and stale.stat().st_mtime < time.time() - STALE_AFTER_S:
                stale.unlink(missing_ok=True)
    return {target: Image(names[target], archives[target]) for target in TARGETS}


def _key(buildah: Buildah) -> str:
    key = hashlib.sha256()
    arch = ARCHITECTURES.get(platform.machine(), platform.machine())
    sources = sorted(Path(__file__).parent.glob("*.py"))
    for path in [*sources, REPO / "Dockerfile", REPO / ".dockerignore", *context_files(REPO)]:
        key.update(f"{path.relative_to(REPO)}\0".encode() + path.read_bytes() + b"\0")
    key.update(f"{buildah.version()}\0{arch}\0{base_key()}".encode())
    return key.hexdigest()[:24]


def _slug(name: str) -> str:
    """docker.io/fracgpu/fracgpu-reservation:0.1.0 -> fracgpu-reservation-0.1.0"""
    return name.rsplit("/", 1)[-1].replace(":", "-")


__all__ = ["DEFAULT_CACHE", "TARGETS", "Image", "ImageBuildError", "build_images", "image_names", "version"]
