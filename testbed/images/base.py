"""The stand-in for the Dockerfile's base image (PYTHON_IMAGE), made from Debian bookworm's own packages.

The official `python:3.11.*-slim-bookworm` comes from a registry, which this machine, CI and the test bed never
reach. Debian bookworm's python3 is the same minor (3.11) on the same glibc (2.36), so the wheels the Dockerfile
picks for the official image (`--python-version 3.11`, manylinux up to glibc 2.36) run on it unchanged. mmdebstrap
makes its root file system from this machine's Debian package sources (about a minute); `python-is-python3` gives the
`python` command the Dockerfile and the image's entry point use, `python3-venv` its `python -m venv`.

The root file system is cached as a tarball keyed by the mmdebstrap command, and imported into buildah's storage
under a name that carries the same key, so a changed command makes a new base and the images built FROM it.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

from testbed.images.buildah import INSTALL, Buildah, run, tool

SUITE = "bookworm"
PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates")
# Documentation, manual pages and translations: nothing in an image reads them, and they are a fifth of its size.
DPKG_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*",
                 "/usr/share/lintian/*")
ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"]
NAME = "localhost/fracgpu-python"  # tagged 3.11-bookworm-<key>


def mmdebstrap_argv(target: Path) -> list[str]:
    argv = [tool("mmdebstrap"), "--variant=minbase", f"--include={','.join(PACKAGES)}", "--quiet"]
    argv += [f"--dpkgopt=path-exclude={pattern}" for pattern in DPKG_EXCLUDES]
    # copyright files are kept: the licences of what the image ships
    argv += ["--dpkgopt=path-include=/usr/share/doc/*/copyright", SUITE, str(target)]
    return argv


def base_key() -> str:
    """What the base depends on: the mmdebstrap command (not its target) and the mmdebstrap version."""
    key = hashlib.sha256()
    for part in [*mmdebstrap_argv(Path("-"))[1:], _mmdebstrap_version(), Path(__file__).read_text()]:
        key.update(part.encode() + b"\0")
    return key.hexdigest()[:24]


def ensure_base(buildah: Buildah, cache: Path) -> str:
    """The stand-in base's image name in buildah's storage, made (or re-imported from its tarball) when missing."""
    key = base_key()
    name = f"{NAME}:3.11-{SUITE}-{key[:12]}"
    if buildah.has_image(name):
        return name
    tarball = cache / f"python-{SUITE}-{key}.tar"
    if not tarball.is_file():
        with tempfile.TemporaryDirectory(prefix=".base-", dir=cache) as work:
            partial = Path(work) / "rootfs.tar"
            run(mmdebstrap_argv(partial), f"mmdebstrap {SUITE} (the stand-in base image)",
                "mmdebstrap needs Debian's package mirror (apt-get update must work here) and root; install it with "
                + INSTALL, timeout=900)
            os.replace(partial, tarball)
        for stale in cache.glob(f"python-{SUITE}-*.tar"):
            if stale != tarball:
                stale.unlink(missing_ok=True)
    buildah.import_rootfs(tarball, name, ENV, "python3")
    for old in buildah.tags(NAME):  # bases of older keys: vfs keeps each as a full copy
        if old != name:
            buildah.remove_image(old)
    return name


def _mmdebstrap_version() -> str:
    result = subprocess.run([tool("mmdebstrap"), "--version"], capture_output=True, text=True, check=False)
    return result.stdout.strip()
