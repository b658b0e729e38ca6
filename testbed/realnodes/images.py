"""The container images the test bed's real nodes run, built with no registry and no Docker.

Each image is an OCI image-layout tarball (oci-layout, index.json, blobs/sha256/) with one gzip layer, which
`ctr -n k8s.io images import <tar>` takes:

  pause        pause.c, compiled static: the pod sandbox (containerd's sandbox_image).
  workload     busybox-static; `sh -c` prints its environment, then sleeps until SIGTERM. Tests override the script.
  reservation  the Dockerfile's `reservation` target in fake-GPU mode: the reservation pod program and the packages
               of requirements/reservation.lock, on this machine's Python 3.11 and the shared libraries it loads.

Builds are cached (default ~/.cache/fracgpu/images/) under a hash of their inputs: a changed input rebuilds, an
unchanged one costs a few stat() calls. `python -m testbed.realnodes.images [--cache DIR]` builds all three.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PAUSE_IMAGE = "fracgpu.local/pause:3.10"
WORKLOAD_IMAGE = "fracgpu.local/workload:1"
RESERVATION_IMAGE = "fracgpu.local/fracgpu-reservation:fake-gpu"

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PAUSE_SOURCE = HERE / "pause.c"
BUSYBOX = Path("/usr/bin/busybox")
RESERVATION_LOCK = REPO / "requirements" / "reservation.lock"
FRACGPU_PACKAGES = ("common", "binder")  # all that `python -m binder.reservation` imports of ours
DEFAULT_CACHE = Path.home() / ".cache" / "fracgpu" / "images"
DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64"}
WORKLOAD_APPLETS = ("sh", "env", "sleep", "cat", "echo", "ls", "wget", "nslookup", "grep", "sort", "kill", "ps")
STDLIB_SKIP = {"site-packages", "test", "idlelib", "tkinter", "ensurepip", "lib2to3", "turtledemo"}
DYNLOAD_SKIP = ("_test", "_ctypes_test", "_xxtestfuzz", "xxlimited", "_tkinter")


class ImageBuildError(RuntimeError):
    """An image could not be built; the message names the step and, where it helps, what to install."""


@dataclass(frozen=True)
class Image:
    name: str  # e.g. "fracgpu.local/pause:3.10"
    tarball: Path  # OCI image layout, for `ctr images import`


@dataclass(frozen=True)
class _Spec:
    name: str
    config: dict[str, Any]  # the image config's "config": Env, Entrypoint, Cmd, User, WorkingDir
    inputs: Callable[[], list[str]]  # what the cache key covers besides this file and `config`
    populate: Callable[[Path], None]  # fills the root file system


def build_all(cache_dir: Path | None = None) -> list[Image]:
    """Build the pause, workload and reservation images, or reuse them from the cache."""
    cache = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE
    cache.mkdir(parents=True, exist_ok=True)
    return [_build(spec, cache) for spec in _specs()]


def _specs() -> list[_Spec]:
    python_env = [DEFAULT_PATH, "LD_LIBRARY_PATH=/usr/local/lib", "PYTHONPATH=/opt/fracgpu",
                  "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1", "FRACGPU_FAKE_GPU=true"]
    return [
        # As registry.k8s.io/pause: its own numeric user.
        _Spec(PAUSE_IMAGE, {"Entrypoint": ["/pause"], "User": "65535:65535", "WorkingDir": "/"},
              lambda: [PAUSE_SOURCE.read_text(), _stat(shutil.which("gcc")), _stat("/var/lib/dpkg/status")],
              _pause_rootfs),
        # `sleep & wait`: sh runs its TERM trap at once, not after a foreground sleep ends.
        _Spec(WORKLOAD_IMAGE, {"Env": [DEFAULT_PATH], "Entrypoint": ["/bin/sh", "-c"], "WorkingDir": "/",
                               "Cmd": ["trap 'exit 0' TERM; env | sort; sleep 2147483647 & wait"]},
              lambda: [_stat(BUSYBOX)], _workload_rootfs),
        # The Dockerfile's reservation target: USER 65532:65532, WORKDIR /tmp, ENTRYPOINT python -m, CMD the program.
        _Spec(RESERVATION_IMAGE, {"Env": python_env, "Entrypoint": ["python", "-m"], "Cmd": ["binder.reservation"],
                                  "User": "65532:65532", "WorkingDir": "/tmp"},
              _reservation_inputs, _reservation_rootfs),
    ]


def _build(spec: _Spec, cache: Path) -> Image:
    key = hashlib.sha256()
    for part in [Path(__file__).read_text(), spec.name, json.dumps(spec.config), *spec.inputs()]:
        key.update(part.encode() + b"\0")
    slug = spec.name.rsplit("/", 1)[-1].replace(":", "-")
    tarball = cache / f"{slug}-{key.hexdigest()[:24]}.tar"
    if tarball.is_file():
        return Image(spec.name, tarball)
    try:
        with tempfile.TemporaryDirectory(prefix=f".{slug}-", dir=cache) as work:
            root = Path(work) / "rootfs"
            root.mkdir()
            spec.populate(root)
            _write_layout(spec, root, Path(work) / "layer.tar.gz", Path(work) / "image.tar")
            os.replace(Path(work) / "image.tar", tarball)  # atomic: a reader sees no tarball or a whole one
    except (ImageBuildError, OSError) as error:
        raise ImageBuildError(f"building {spec.name}: {error}") from error
    for stale in cache.glob(f"{slug}-*.tar"):  # older builds of this image
        if stale != tarball:
            stale.unlink(missing_ok=True)
    return Image(spec.name, tarball)


def _pause_rootfs(root: Path) -> None:
    gcc = _tool("gcc", "apt-get install gcc libc6-dev")
    _run([gcc, "-static", "-O2", "-s", "-o", str(root / "pause"), str(PAUSE_SOURCE)],
         "compiling pause.c (a static binary needs libc6-dev's libc.a)")


def _workload_rootfs(root: Path) -> None:
    if not BUSYBOX.is_file() or is_dynamic(BUSYBOX):
        raise ImageBuildError(f"{BUSYBOX} is missing or not static: apt-get install busybox-static")
    applets = set(_run([str(BUSYBOX), "--list"], "busybox --list").stdout.split())
    if missing := sorted(set(WORKLOAD_APPLETS) - applets):
        raise ImageBuildError(f"{BUSYBOX} lacks applets {missing}: apt-get install busybox-static")
    (root / "bin").mkdir()
    shutil.copy(BUSYBOX, root / "bin" / "busybox")
    for applet in sorted(applets - {"busybox"}):
        if "/" not in applet:
            (root / "bin" / applet).symlink_to("busybox")
    _base_files(root)


def _reservation_inputs() -> list[str]:
    prefix, version = Path(sys.base_prefix), f"python{sys.version_info[0]}.{sys.version_info[1]}"
    parts = [RESERVATION_LOCK.read_text(), sys.version, sys.executable, _project_version()]
    for package in FRACGPU_PACKAGES:
        parts += [f"{path.relative_to(REPO)}\n{path.read_text()}" for path in sorted((REPO / package).rglob("*.py"))]
    runtime = [prefix / "bin" / version, *sorted((prefix / "lib").glob("libpython*")), prefix / "lib" / version,
               *sorted((prefix / "lib" / version / "lib-dynload").glob("*.so"))]
    # The system's shared libraries (and strip) come from Debian packages: any apt change rebuilds.
    return parts + [_stat(path) for path in runtime] + [_stat("/var/lib/dpkg/status")]


def _reservation_rootfs(root: Path) -> None:
    if sys.version_info[:2] != (3, 11):
        raise ImageBuildError(f"the reservation image is Python 3.11 (the Dockerfile's), this is {sys.version}")
    site = root / "opt" / "fracgpu"
    site.mkdir(parents=True)
    _run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
          "--root-user-action=ignore", "--require-hashes", "--no-deps", "--only-binary=:all:",
          "--target", str(site), "-r", str(RESERVATION_LOCK)],
         "pip install -r requirements/reservation.lock (it needs the package index, or the wheels in PIP_FIND_LINKS)")
    shutil.rmtree(site / "bin", ignore_errors=True)
    for package in FRACGPU_PACKAGES:
        shutil.copytree(REPO / package, site / package, ignore=_only_python)
    # What installing the fracgpu wheel leaves for importlib.metadata, so `--version` reports the real version.
    (site / f"fracgpu-{_project_version()}.dist-info").mkdir()
    (site / f"fracgpu-{_project_version()}.dist-info" / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: fracgpu\nVersion: {_project_version()}\n")
    _python_runtime(root)
    _base_files(root)
    for cache in sorted(root.rglob("__pycache__"), reverse=True):
        shutil.rmtree(cache)


def _python_runtime(root: Path) -> None:
    """This interpreter in /usr/local (binary, libpython, stdlib), and every shared library it or a module loads."""
    prefix, version = Path(sys.base_prefix), f"python{sys.version_info[0]}.{sys.version_info[1]}"
    local_bin, local_lib = root / "usr" / "local" / "bin", root / "usr" / "local" / "lib"
    local_bin.mkdir(parents=True)
    local_lib.mkdir(parents=True)
    shutil.copy(prefix / "bin" / version, local_bin / version)
    for alias in ("python3", "python"):
        (local_bin / alias).symlink_to(version)
    stdlib = prefix / "lib" / version
    shutil.copytree(stdlib, local_lib / version, symlinks=True, ignore=_stdlib_ignore(stdlib))
    elves = [local_bin / version, *sorted(root.rglob("*.so"))]  # lib-dynload and the wheels' extensions
    libraries = _ldd(elves)
    gcc_s = [path.parent / "libgcc_s.so.1" for path in libraries if path.name == "libc.so.6"]
    if gcc_s and gcc_s[0].exists():  # glibc dlopen()s it for pthread_exit() and pthread_cancel()
        libraries |= _ldd(gcc_s) | {gcc_s[0]}
    for library in sorted(libraries):
        if library.is_relative_to(prefix):  # libpython, which LD_LIBRARY_PATH=/usr/local/lib finds
            shutil.copy(library.resolve(), local_lib / library.name)
            elves.append(local_lib / library.name)
        else:
            _copy_host_path(library, root)
    if strip := shutil.which("strip"):  # a pyenv build's debug info would be half the image
        _run([strip, "--strip-debug", *map(str, elves)], "strip --strip-debug")


def _base_files(root: Path) -> None:
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/sbin/nologin\n"
                                         "nonroot:x:65532:65532:nonroot:/tmp:/sbin/nologin\n"
                                         "nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n")
    (root / "etc" / "group").write_text("root:x:0:\nnonroot:x:65532:\nnobody:x:65534:\n")
    (root / "etc" / "nsswitch.conf").write_text("passwd: files\ngroup: files\nhosts: files dns\n")
    (root / "tmp").mkdir(exist_ok=True)
    (root / "tmp").chmod(0o1777)


def _only_python(directory: str, names: list[str]) -> set[str]:
    return {name for name in names if name == "__pycache__"
            or (not name.endswith(".py") and not os.path.isdir(os.path.join(directory, name)))}


def _stdlib_ignore(stdlib: Path) -> Callable[[str, list[str]], set[str]]:
    def ignore(directory: str, names: list[str]) -> set[str]:
        skipped = {name for name in names if name == "__pycache__" or name.endswith((".pyc", ".exe"))}
        if Path(directory) == stdlib:
            skipped |= {name for name in names if name in STDLIB_SKIP or name.startswith("config-")}
        if Path(directory) == stdlib / "lib-dynload":
            skipped |= {name for name in names if name.startswith(DYNLOAD_SKIP)}
        return skipped

    return ignore


def _ldd(files: list[Path]) -> set[Path]:
    """The shared libraries (and the dynamic loader) the files need, as this machine resolves them."""
    libraries: set[Path] = set()
    for line in _run([_tool("ldd", "apt-get install libc-bin"), *map(str, files)], "ldd").stdout.splitlines():
        name, arrow, target = line.strip().partition(" => ")
        if arrow and target.startswith("not found"):
            raise ImageBuildError(f"ldd: {name} not found on this machine")
        path = target if arrow else name
        if path.startswith("/") and not path.endswith(":"):
            libraries.add(Path(path.split()[0]))
    return libraries


def _copy_host_path(host: Path, root: Path) -> None:
    """Copy a file to the same path under root; a symlink stays a symlink, and its target is copied too."""
    dest = root / str(host).lstrip("/")
    if dest.exists() or dest.is_symlink():
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    if host.is_symlink():
        dest.symlink_to(os.readlink(host))
        _copy_host_path(Path(os.path.normpath(host.parent / os.readlink(host))), root)
    else:
        shutil.copy(host, dest)


class _Hashing:
    """A write-only stream that counts and hashes what passes through it to `sink`."""

    def __init__(self, sink: Any) -> None:
        self.sink, self.sha, self.size = sink, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.sink.write(data)


def _write_layout(spec: _Spec, root: Path, layer_path: Path, out: Path) -> None:
    with open(layer_path, "wb") as raw:
        compressed = _Hashing(raw)
        with gzip.GzipFile(filename="", mode="wb", fileobj=compressed, mtime=0) as gz:
            uncompressed = _Hashing(gz)
            with tarfile.open(fileobj=uncompressed, mode="w|", format=tarfile.PAX_FORMAT) as layer:
                _add_tree(layer, root)
    arch = ARCHITECTURES.get(platform.machine(), platform.machine())
    config = _json({"architecture": arch, "os": "linux", "config": spec.config,
                    "rootfs": {"type": "layers", "diff_ids": [f"sha256:{uncompressed.sha.hexdigest()}"]}})
    layer_descriptor = {"mediaType": LAYER_TYPE, "digest": f"sha256:{compressed.sha.hexdigest()}",
                        "size": compressed.size}
    manifest = _json({"schemaVersion": 2, "mediaType": MANIFEST_TYPE, "config": _descriptor(CONFIG_TYPE, config),
                      "layers": [layer_descriptor]})
    names = {"io.containerd.image.name": spec.name, "org.opencontainers.image.ref.name": spec.name.rsplit(":", 1)[1]}
    index = _json({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
        {**_descriptor(MANIFEST_TYPE, manifest), "platform": {"architecture": arch, "os": "linux"},
         "annotations": names}]})
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        _add_entry(tar, "oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
        _add_entry(tar, "index.json", index)
        _add_entry(tar, "blobs", None)
        _add_entry(tar, "blobs/sha256", None)
        for blob in (config, manifest):
            _add_entry(tar, f"blobs/sha256/{hashlib.sha256(blob).hexdigest()}", blob)
        _add_entry(tar, f"blobs/sha256/{compressed.sha.hexdigest()}", layer_path)


def _add_tree(tar: tarfile.TarFile, root: Path) -> None:
    """Everything under root, sorted, owned by root, with mtime 0; modes and symlinks as they are."""
    names = []
    for directory, dirnames, filenames in os.walk(root):
        names += [os.path.relpath(os.path.join(directory, name), root) for name in dirnames + filenames]
    for name in sorted(names):
        info = tar.gettarinfo(str(root / name), arcname=name)
        info.uid, info.gid, info.uname, info.gname, info.mtime = 0, 0, "", "", 0
        if info.isreg():
            with open(root / name, "rb") as file:
                tar.addfile(info, file)
        else:
            tar.addfile(info)


def _add_entry(tar: tarfile.TarFile, name: str, content: bytes | Path | None) -> None:
    """A file (bytes, or a file's content) or, for None, a directory."""
    info = tarfile.TarInfo(name)
    info.mtime = 0
    if content is None:
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
        return
    with content.open("rb") if isinstance(content, Path) else io.BytesIO(content) as data:
        info.mode, info.size = 0o644, data.seek(0, io.SEEK_END)
        data.seek(0)
        tar.addfile(info, data)


def _json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _descriptor(media_type: str, data: bytes) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": f"sha256:{hashlib.sha256(data).hexdigest()}", "size": len(data)}


def is_dynamic(path: Path) -> bool:
    """Whether a 64-bit little-endian ELF file has a PT_INTERP program header (a dynamic loader to run it)."""
    data = path.read_bytes()
    if data[:6] != b"\x7fELF\x02\x01":
        raise ImageBuildError(f"{path} is not a 64-bit little-endian ELF file")
    phoff = int.from_bytes(data[0x20:0x28], "little")
    size, count = int.from_bytes(data[0x36:0x38], "little"), int.from_bytes(data[0x38:0x3A], "little")
    return any(data[phoff + i * size:phoff + i * size + 4] == b"\3\0\0\0" for i in range(count))


def _project_version() -> str:
    with open(REPO / "pyproject.toml", "rb") as file:
        return str(tomllib.load(file)["project"]["version"])


def _stat(path: str | Path | None) -> str:
    info = os.stat(path) if path and os.path.exists(path) else None
    return f"{path}:{info.st_size}:{info.st_mtime_ns}" if info else f"{path}:missing"


def _tool(name: str, install: str) -> str:
    if found := shutil.which(name):
        return found
    raise ImageBuildError(f"{name} not found: {install}")


def _run(argv: list[str], what: str) -> subprocess.CompletedProcess[str]:
    try:
        result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ImageBuildError(f"{what}: {error}") from error
    if result.returncode != 0:
        output = (result.stderr.strip() or result.stdout.strip())[-3000:]
        raise ImageBuildError(f"{what} failed (exit {result.returncode}): {output}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.realnodes.images", description=__doc__.split("\n")[0])
    parser.add_argument("--cache", type=Path, default=None, help=f"the image cache (default {DEFAULT_CACHE})")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        images = build_all(args.cache)
    except ImageBuildError as error:
        sys.exit(f"error: {error}")
    for image in images:
        print(f"{image.name}  {image.tarball}  {image.tarball.stat().st_size / 1e6:.1f} MB")
    print(f"built in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
