"""One real node's supervisor, run inside the node's own mount namespace (`unshare --mount`, started by node.py).

It gives the node private copies of the paths the kubelet and containerd use whatever they are told (bind mounts
that no other node and not the host see), then runs containerd, imports the node's images, and runs the fake
NVIDIA device plugin and the kubelet. Every process it starts, and every container they start, lives under the
node's cgroup, so stopping the node leaves nothing behind.

Signals: SIGTERM / SIGINT stop the node; SIGUSR1 restarts the kubelet and containerd (SIGKILL, as a crash would)
while the containers keep running, as they do on a node whose runtime restarts. The supervisor reports in
`<dir>/state` ("running <generation>" once the kubelet is up, "stopped" at the end).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from testbed.realnodes.host import cgroup_pids

CONTAINERD_SOCKET = Path("/run/containerd/containerd.sock")


def log(message: str) -> None:
    print(f"[nodeinit {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Supervisor:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.dir = Path(spec["dir"])
        self.logs = self.dir / "logs"
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.generation = 0
        self.stopping = False
        self.restart_wanted = False

    # ------------------------------------------------------------------ set-up
    def join_cgroups(self) -> None:
        for directory in self.spec["system_cgroups"]:
            Path(directory, "cgroup.procs").write_text(str(os.getpid()))

    def private_paths(self) -> None:
        for fixed in self.spec["fixed_paths"]:
            source = self.dir / "fs" / fixed.strip("/").replace("/", "_")
            source.mkdir(parents=True, exist_ok=True)
            subprocess.run(["mount", "--bind", str(source), fixed], check=True)

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{name}.log", "ab") as out:
            child = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env={**os.environ, **env} if env else None)
        self.children[name] = child
        return child

    def start_containerd(self) -> None:
        CONTAINERD_SOCKET.unlink(missing_ok=True)
        self.spawn("containerd", [self.spec["containerd"], "--config", self.spec["containerd_config"]],
                   self.spec.get("containerd_env"))
        self.wait_for(lambda: CONTAINERD_SOCKET.exists(), "containerd's socket", 30)

    def import_images(self) -> None:
        ctr = [self.spec["ctr"], "-n", "k8s.io"]
        fix = ("fix: rebuild it (delete it from its cache and run make images, or python -m testbed.realnodes.images) "
               "and check the disk space")
        for tarball in self.spec["images"]:
            result = subprocess.run([*ctr, "images", "import", tarball], capture_output=True, text=True, timeout=300)
            if result.returncode != 0:
                raise RuntimeError(f"step: ctr images import {tarball} failed: {result.stderr.strip()}; {fix}")
        # Pods ask for images by name with no registry to fall back on: a name the archives did not bring is an error
        # now, not an ErrImagePull later.
        listed = subprocess.run([*ctr, "images", "ls", "-q"], capture_output=True, text=True, timeout=60).stdout.split()
        if missing := sorted(set(self.spec.get("image_names", [])) - set(listed)):
            raise RuntimeError(f"step: images in the node's containerd: {missing} missing after the import; {fix}")

    def start_kubelet(self) -> None:
        self.spawn("kubelet", self.spec["kubelet_argv"])

    def start_device_plugin(self) -> None:
        # The fake NVIDIA device plugin, or on a DRA node fracgpu's DRA driver with NVML's stand-in; none where the
        # DRA driver comes as a pod.
        if "device_plugin_argv" not in self.spec:
            return
        self.spawn("device-plugin", self.spec["device_plugin_argv"], self.spec.get("device_plugin_env"))

    def wait_for(self, ready: Any, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for name, child in self.children.items():
                if child.poll() is not None:
                    raise RuntimeError(f"{name} exited with {child.returncode} while waiting for {what}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(0.1)

    def report(self, state: str) -> None:
        tmp = self.dir / "state.tmp"
        tmp.write_text(state)
        tmp.replace(self.dir / "state")

    # ------------------------------------------------------------------ life
    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGUSR1, self._on_restart)
        try:
            self.join_cgroups()
            self.private_paths()
            self.start_containerd()
            self.import_images()
            self.start_device_plugin()
            self.start_kubelet()
            self.report(f"running {self.generation}")
            log(f"node {self.spec['name']} up")
            while not self.stopping:
                if self.restart_wanted:
                    self.restart_wanted = False
                    self.restart_runtime()
                self.watch_children()
                time.sleep(0.2)
        except Exception as error:  # noqa: BLE001 - reported in the state file, then the node is torn down
            log(f"node {self.spec['name']} failed: {error}")
            self.report(f"failed {error}")
            self.teardown()
            return 1
        self.teardown()
        self.report("stopped")
        return 0

    def watch_children(self) -> None:
        for name, child in list(self.children.items()):
            if child.poll() is not None:
                log(f"{name} exited with {child.returncode}; starting it again")
                {"containerd": self.start_containerd, "kubelet": self.start_kubelet,
                 "device-plugin": self.start_device_plugin}[name]()

    def restart_runtime(self) -> None:
        log("restarting the kubelet and containerd (SIGKILL), containers keep running")
        for name in ("kubelet", "containerd"):
            child = self.children.pop(name)
            child.kill()
            child.wait()
        self.start_containerd()
        self.start_kubelet()
        self.generation += 1
        self.report(f"running {self.generation}")

    def teardown(self) -> None:
        for name in ("kubelet", "device-plugin"):
            child = self.children.pop(name, None)
            if child is not None:
                _stop(child, 10)
        # Containers and their shims: everything in the node's cgroups but this process and containerd.
        mine = {os.getpid()}
        containerd = self.children.get("containerd")
        if containerd is not None:
            mine.add(containerd.pid)
        for _ in range(3):
            others = [pid for pid in _pids_in(self.spec["node_cgroups"]) if pid not in mine]
            if not others:
                break
            for pid in others:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.3)
        if containerd is not None:
            _stop(self.children.pop("containerd"), 10)

    def _on_stop(self, *_: Any) -> None:
        self.stopping = True

    def _on_restart(self, *_: Any) -> None:
        self.restart_wanted = True


def _stop(child: subprocess.Popen[bytes], grace: float) -> None:
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(grace)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _pids_in(directories: list[str]) -> list[int]:
    return sorted({pid for directory in directories for pid in cgroup_pids(Path(directory))})


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m testbed.realnodes.nodeinit SPEC.json (started by testbed/realnodes/node.py)",
              file=sys.stderr)
        return 2
    return Supervisor(json.loads(Path(args[0]).read_text())).run()


if __name__ == "__main__":
    sys.exit(main())
