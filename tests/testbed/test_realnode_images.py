"""The real nodes' container images (testbed/realnodes/images.py): OCI layouts whose digests add up, root file
systems that run on their own under chroot, a cache that rebuilds only on changed inputs, and containerd importing
all three. Root is needed (chroot, containerd); missing tools fail, never skip."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from testbed.realnodes import images
from testbed.realnodes.images import PAUSE_IMAGE, RESERVATION_IMAGE, WORKLOAD_IMAGE, ImageBuildError, build_all
from testbed.realnodes.throwaway import throwaway_containerd

NAMES = (PAUSE_IMAGE, WORKLOAD_IMAGE, RESERVATION_IMAGE)
CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"
RESERVATION_IMPORTS = ("import binder.reservation.program, urllib3, yaml, pynvml, ssl, json;"
                       " from yaml import CSafeLoader; print('ok')")


@dataclass
class Layout:
    index: dict[str, Any]
    manifest: dict[str, Any]
    config: dict[str, Any]
    blobs: dict[str, bytes]  # digest -> content
    files: dict[str, bytes]  # every file in the tarball, by name


@dataclass
class Built:
    cache: Path
    tarballs: dict[str, Path]  # image name -> tarball
    seconds: float


def read_layout(tarball: Path) -> Layout:
    with tarfile.open(tarball) as tar:
        files = {member.name: tar.extractfile(member).read() for member in tar.getmembers() if member.isfile()}
    blobs = {f"sha256:{name.rsplit('/', 1)[1]}": data for name, data in files.items() if name.startswith("blobs/")}
    index = json.loads(files["index.json"])
    manifest = json.loads(blobs[index["manifests"][0]["digest"]])
    return Layout(index, manifest, json.loads(blobs[manifest["config"]["digest"]]), blobs, files)


def image_env(layout: Layout) -> dict[str, str]:
    return dict(item.split("=", 1) for item in layout.config["config"].get("Env", []))


def has_pt_interp(path: Path) -> bool:
    """Read the ELF64 program headers: is there a PT_INTERP (3), i.e. a dynamic loader?"""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2, f"{path} is not an ELF64 file"
    phoff = int.from_bytes(data[0x20:0x28], "little")
    entry_size, count = int.from_bytes(data[0x36:0x38], "little"), int.from_bytes(data[0x38:0x3A], "little")
    types = [int.from_bytes(data[phoff + i * entry_size:phoff + i * entry_size + 4], "little") for i in range(count)]
    return 3 in types


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    cache = tmp_path_factory.mktemp("image-cache")
    started = time.monotonic()
    result = build_all(cache)
    seconds = time.monotonic() - started
    assert [image.name for image in result] == list(NAMES)
    return Built(cache, {image.name: image.tarball for image in result}, seconds)


@pytest.fixture(scope="module")
def rootfs(built: Built, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each image's layer, extracted as root would (modes, owners, symlinks as they are)."""
    roots = {}
    for name, tarball in built.tarballs.items():
        layout = read_layout(tarball)
        root = tmp_path_factory.mktemp(name.rsplit("/", 1)[1].replace(":", "-"))
        root.chmod(0o755)  # as a container's root is; mktemp's 0700 would lock the image's own user out
        layer = layout.blobs[layout.manifest["layers"][0]["digest"]]
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(layer))) as tar:
            tar.extractall(root, filter="fully_trusted")
        roots[name] = root
    return roots


def chroot(root: Path, argv: list[str], env: dict[str, str], user: str | None = None,
           timeout: float = 60) -> subprocess.CompletedProcess[str]:
    userspec = [f"--userspec={user}"] if user else []
    return subprocess.run([CHROOT, *userspec, str(root), *argv], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.mark.parametrize("name", NAMES)
def test_layout_digests_sizes_and_diff_ids_add_up(built: Built, name: str) -> None:
    layout = read_layout(built.tarballs[name])
    assert json.loads(layout.files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    for digest, data in layout.blobs.items():
        assert digest == f"sha256:{hashlib.sha256(data).hexdigest()}", f"blob {digest} does not match its content"
    [entry] = layout.index["manifests"]
    assert entry["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert entry["annotations"] == {"io.containerd.image.name": name,
                                    "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}
    assert entry["size"] == len(layout.blobs[entry["digest"]])
    assert layout.manifest["schemaVersion"] == 2
    assert layout.manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    config_descriptor, [layer_descriptor] = layout.manifest["config"], layout.manifest["layers"]
    assert config_descriptor["mediaType"] == "application/vnd.oci.image.config.v1+json"
    assert config_descriptor["size"] == len(layout.blobs[config_descriptor["digest"]])
    assert layer_descriptor["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"
    layer = layout.blobs[layer_descriptor["digest"]]
    assert layer_descriptor["size"] == len(layer)
    assert layout.config["architecture"] == "amd64" and layout.config["os"] == "linux"
    assert layout.config["rootfs"] == {"type": "layers",
                                       "diff_ids": [f"sha256:{hashlib.sha256(gzip.decompress(layer)).hexdigest()}"]}


@pytest.mark.parametrize("name", NAMES)
def test_layer_is_deterministic_and_owned_by_root(built: Built, name: str) -> None:
    layout = read_layout(built.tarballs[name])
    layer = layout.blobs[layout.manifest["layers"][0]["digest"]]
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(layer))) as tar:
        members = tar.getmembers()
    names = [member.name for member in members]
    assert names == sorted(names)
    assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 for m in members)
    if name != PAUSE_IMAGE:
        assert next(m for m in members if m.name == "tmp").mode == 0o1777


def test_reservation_rootfs_is_self_contained(built: Built, rootfs: dict[str, Path]) -> None:
    root, layout = rootfs[RESERVATION_IMAGE], read_layout(built.tarballs[RESERVATION_IMAGE])
    env = image_env(layout)
    assert env["FRACGPU_FAKE_GPU"] == "true" and env["LD_LIBRARY_PATH"] == "/usr/local/lib"
    # -W error: a module that fails to load its C part (and warns instead) fails here.
    result = chroot(root, ["/usr/local/bin/python3", "-W", "error", "-c", RESERVATION_IMPORTS], env, user="65532:65532")
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
    result = chroot(root, ["/usr/local/bin/python3", "-c",
                           "import common.version, sys; print(common.version.version(), sys.prefix)"], env)
    assert result.stdout.split() == ["0.1.0", "/usr/local"], result.stderr
    stdlib = root / "usr" / "local" / "lib" / "python3.11"
    for left_out in ("site-packages", "test", "idlelib", "tkinter", "ensurepip", "lib2to3", "turtledemo"):
        assert not (stdlib / left_out).exists(), left_out
    assert not list(root.rglob("__pycache__"))
    assert (root / "lib64" / "ld-linux-x86-64.so.2").is_symlink()
    size = sum(path.lstat().st_size for path in root.rglob("*"))
    assert size < 80e6, f"the reservation image is {size / 1e6:.0f} MB uncompressed"


def test_reservation_entrypoint_runs_the_program_as_the_dockerfile_says(built: Built, rootfs: dict[str, Path]) -> None:
    config = read_layout(built.tarballs[RESERVATION_IMAGE]).config["config"]
    dockerfile = (images.REPO / "Dockerfile").read_text()
    stage = re.search(r"^FROM \S+ AS reservation\n(.*?)^FROM ", dockerfile, re.M | re.S)
    assert stage, "no reservation stage in the Dockerfile"
    instruction = {word: re.search(rf"^{word} (.*)$", stage.group(1), re.M).group(1)
                   for word in ("ENTRYPOINT", "CMD", "USER", "WORKDIR")}
    assert config["Entrypoint"] == json.loads(instruction["ENTRYPOINT"])
    assert config["Cmd"] == json.loads(instruction["CMD"])
    assert (config["User"], config["WorkingDir"]) == (instruction["USER"], instruction["WORKDIR"])
    env_block = re.search(r"^ENV ((?:.*\\\n)*.*)$", stage.group(1), re.M).group(1)
    for setting in env_block.replace("\\\n", " ").split():
        assert setting in config["Env"]
    env = image_env(read_layout(built.tarballs[RESERVATION_IMAGE]))
    result = chroot(rootfs[RESERVATION_IMAGE], [*config["Entrypoint"], *config["Cmd"], "--help"], env,
                    user=config["User"])
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout and "--fake-gpu" in result.stdout


def test_workload_shell_prints_its_environment_and_stops_on_sigterm(built: Built, rootfs: dict[str, Path],
                                                                    tmp_path: Path) -> None:
    root, config = rootfs[WORKLOAD_IMAGE], read_layout(built.tarballs[WORKLOAD_IMAGE]).config["config"]
    env = {**image_env(read_layout(built.tarballs[WORKLOAD_IMAGE])), "ZZ_LAST": "z", "AA_FIRST": "a"}
    result = chroot(root, ["/bin/sh", "-c", "env | sort"], env)
    lines = result.stdout.splitlines()
    assert result.returncode == 0 and lines == sorted(lines), result.stderr
    assert {"AA_FIRST=a", "ZZ_LAST=z", f"PATH={env['PATH']}"} <= set(lines)
    for tool in ("env", "wget", "nslookup", "grep", "cat", "ls", "sleep", "echo"):
        assert os.readlink(root / "bin" / tool) == "busybox"
    assert chroot(root, ["/bin/cat", "/etc/passwd"], env).stdout.startswith("root:x:0:0:")
    # The default command: print the environment, sleep, and exit 0 at once on SIGTERM. Its `sleep &` reads
    # /dev/null, which a container runtime provides.
    (root / "dev").mkdir(exist_ok=True)
    if not (root / "dev" / "null").exists():
        os.mknod(root / "dev" / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    output = tmp_path / "out"
    with open(output, "w") as out:
        process = subprocess.Popen([CHROOT, str(root), *config["Entrypoint"], *config["Cmd"]], env=env, stdout=out)
    try:
        deadline = time.monotonic() + 20
        while "ZZ_LAST=z" not in output.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process.poll() is None, "the default command should keep sleeping"
        assert output.read_text().splitlines() == sorted(output.read_text().splitlines())
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=5) == 0
        assert time.monotonic() - started < 2
    finally:
        process.kill()
        process.wait()


def test_pause_is_static_runs_and_exits_0_on_sigterm_and_sigint(built: Built, rootfs: dict[str, Path]) -> None:
    root, config = rootfs[PAUSE_IMAGE], read_layout(built.tarballs[PAUSE_IMAGE]).config["config"]
    assert config["Entrypoint"] == ["/pause"]
    assert not has_pt_interp(root / "pause")
    ldd = subprocess.run(["ldd", str(root / "pause")], capture_output=True, text=True, check=False)
    assert "not a dynamic executable" in ldd.stdout + ldd.stderr or "statically linked" in ldd.stdout
    assert chroot(root, ["/pause", "-v"], {}).stdout.strip() == "fracgpu pause"
    for sig in (signal.SIGTERM, signal.SIGINT):
        process = subprocess.Popen([CHROOT, f"--userspec={config['User']}", str(root), "/pause"], env={})
        try:
            time.sleep(0.3)
            assert process.poll() is None, "pause should block until signalled"
            process.send_signal(sig)
            assert process.wait(timeout=5) == 0
        finally:
            process.kill()
            process.wait()


def test_second_build_reuses_the_cache(built: Built) -> None:
    mtimes = {name: path.stat().st_mtime_ns for name, path in built.tarballs.items()}
    started = time.monotonic()
    again = build_all(built.cache)
    seconds = time.monotonic() - started
    assert {image.name: image.tarball for image in again} == built.tarballs
    assert {name: path.stat().st_mtime_ns for name, path in built.tarballs.items()} == mtimes
    assert seconds < 2, f"a warm build took {seconds:.1f} s (cold: {built.seconds:.1f} s)"
    assert sorted(path.name for path in built.cache.iterdir()) == sorted(p.name for p in built.tarballs.values())


def test_a_changed_input_rebuilds_only_its_image(built: Built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(built.cache, cache)
    source = tmp_path / "pause.c"
    source.write_text(images.PAUSE_SOURCE.read_text() + "/* changed */\n")
    monkeypatch.setattr(images, "PAUSE_SOURCE", source)
    rebuilt = {image.name: image.tarball for image in build_all(cache)}
    assert rebuilt[PAUSE_IMAGE].name != built.tarballs[PAUSE_IMAGE].name
    for name in (WORKLOAD_IMAGE, RESERVATION_IMAGE):
        assert rebuilt[name].name == built.tarballs[name].name
    assert not (cache / built.tarballs[PAUSE_IMAGE].name).exists(), "the stale pause tarball should be gone"
    assert read_layout(rebuilt[PAUSE_IMAGE]).index["manifests"][0]["annotations"]["io.containerd.image.name"] \
        == PAUSE_IMAGE


def test_missing_tools_fail_with_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(images, "BUSYBOX", tmp_path / "no-busybox")
    with pytest.raises(ImageBuildError, match=r"workload.*apt-get install busybox-static"):
        build_all(tmp_path / "cache-1")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ImageBuildError, match=r"pause.*gcc not found: apt-get install gcc"):
        build_all(tmp_path / "cache-2")
    leftovers = [path.name for path in (tmp_path / "cache-1").iterdir() if path.name.startswith(".")]
    assert not leftovers, f"failed builds left {leftovers}"


def test_containerd_imports_all_three(built: Built, tmp_path: Path) -> None:
    with throwaway_containerd(tmp_path) as ctr:
        for tarball in built.tarballs.values():
            result = subprocess.run([*ctr, "images", "import", "--all-platforms", "--snapshotter", "overlayfs",
                                     str(tarball)], capture_output=True, text=True, timeout=300, check=False)
            assert result.returncode == 0, f"ctr images import {tarball}: {result.stderr}"
        listed = subprocess.run([*ctr, "images", "ls", "-q"], capture_output=True, text=True, check=True)
        check = subprocess.run([*ctr, "images", "check"], capture_output=True, text=True, check=True)
    assert set(NAMES) <= set(listed.stdout.split())
    for name in NAMES:
        [line] = [line for line in check.stdout.splitlines() if line.startswith(f"{name} ")]
        assert "complete" in line and line.split()[-1] == "true", f"{name} is not complete and unpacked: {line}"
