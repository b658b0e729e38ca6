"""A containerd of its own, outside any node, for tests that import and run images (Linux and root).

Its root, state, socket and temporary files all live under one directory, so it shares nothing with a real node's
containerd or the machine's; its CRI plugin is off (no kubelet talks to it). `throwaway_containerd(directory)`
yields the `ctr` command line for it (namespace k8s.io, as a kubelet's images live there) and, on the way out, stops
it and unmounts whatever its snapshots left mounted.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from testbed.cluster.binaries import BinariesMissingError
from testbed.realnodes.host import find_containerd


class ContainerdError(RuntimeError):
    """The throwaway containerd could not start; the message says why and what to install."""


def mounts_under(directory: Path) -> list[str]:
    """Mount points at or below directory, deepest first (the order to unmount them in)."""
    points = [line.split()[4].replace("\\040", " ") for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return sorted((p for p in points if p == str(directory) or p.startswith(f"{directory}/")), key=len, reverse=True)


def _config(directory: Path, socket: Path) -> str:
    # containerd 2 splits the CRI into three plugins; NRI has nothing to serve without one.
    disabled = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images",
                "io.containerd.podsandbox.controller.v1.podsandbox", "io.containerd.nri.v1.nri",
                "io.containerd.internal.v1.tracing"] + [
        f"io.containerd.snapshotter.v1.{name}" for name in ("btrfs", "zfs", "devmapper", "aufs", "erofs", "blockfile")]
    return f"""version = 3
root = "{directory / 'root'}"
state = "{directory / 'state'}"
disabled_plugins = {json.dumps(disabled)}
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{directory / 'opt'}"
[plugins."io.containerd.snapshotter.v1.overlayfs"]
  root_path = "{directory / 'root' / 'overlayfs'}"
"""


@contextlib.contextmanager
def throwaway_containerd(directory: Path) -> Iterator[list[str]]:
    """Start a containerd under directory; yield `ctr --address ... -n k8s.io`; stop it and unmount its leftovers."""
    try:
        containerd, ctr_binary, _ = find_containerd()  # the real nodes' own build (tools/build-containerd.sh)
    except BinariesMissingError as error:
        raise ContainerdError(str(error)) from None
    socket = directory / "c.sock"
    config = directory / "config.toml"
    config.write_text(_config(directory, socket))
    (directory / "tmp").mkdir(exist_ok=True)
    log = directory / "containerd.log"
    ctr = [str(ctr_binary), "--address", str(socket), "-n", "k8s.io"]
    with open(log, "wb") as out:
        process = subprocess.Popen([str(containerd), "--config", str(config)], stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, "TMPDIR": str(directory / "tmp")}, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while subprocess.run([*ctr, "version"], capture_output=True, check=False).returncode != 0:
            if process.poll() is not None or time.monotonic() > deadline:
                raise ContainerdError(f"containerd did not start (exit {process.poll()}):\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
        yield ctr
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        for point in mounts_under(directory):
            subprocess.run(["umount", "--lazy", point], check=False)
        if left := mounts_under(directory):
            raise ContainerdError(f"the throwaway containerd left mounts behind: {left}")
