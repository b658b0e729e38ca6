"""What real nodes need from this machine, and putting it back afterwards.

A kubelet and containerd are built for a machine of their own: the kubelet rewrites host sysctls when it starts,
the CNI bridge turns on IP forwarding, kube-proxy writes iptables chains, and both use fixed paths whatever their
root directories say. `HostPrep` checks that the machine can run them (Linux, root, the binaries), records every
host setting it or the node programs touch, gives the pod network a private address of this machine, and on
`restore()` undoes all of it, whatever state a crashed run left behind.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from testbed.cluster.binaries import REPO_ROOT, BinariesMissingError, binaries_dir, find_binary

# The pod network: node i's pods get 10.244.i.0/24 on bridge fgbr<i>; the apiserver and every kubelet listen on
# API_ADDRESS, an address of this machine on a bridge with no ports (a dummy interface where `dummy` is absent),
# which pods reach through their gateway and nothing outside this machine can route to.
API_INTERFACE = "fgnet0"
NODE_BRIDGE_PREFIX = "fgbr"
API_ADDRESS = "10.243.0.1"
POD_CIDR = "10.244.0.0/16"
CGROUP_PARENT = "fracgpu"

# Written by the kubelet at start (kubelet/cm: setupKernelTunables), by the CNI bridge (isGateway) and by kube-proxy.
TOUCHED_SYSCTLS = (
    "vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops", "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes", "net/ipv4/ip_forward", "net/ipv4/conf/all/route_localnet",
    "net/bridge/bridge-nf-call-iptables", "net/netfilter/nf_conntrack_max",
)
# Paths the kubelet, containerd and the CNI plugins use whatever they are configured with; each node bind-mounts a
# directory of its own over them inside its mount namespace, so they must exist here as mount points.
# /var/run/cdi is where DRA drivers write the CDI specs containerd applies, /var/run/nri where containerd's NRI socket
# is: each node has its own.
FIXED_PATHS = ("/var/lib/kubelet", "/run/containerd", "/var/log/pods", "/var/log/containers", "/var/lib/cni",
               "/run/netns", "/etc/cni/net.d", "/var/run/cdi", "/var/run/nri")
# From Debian (apt); containerd itself is built (CONTAINERD_TOOLS).
HOST_TOOLS = {"runc": "runc", "iptables": "iptables", "conntrack": "conntrack", "busybox": "busybox-static"}
CNI_DIR = Path("/usr/lib/cni")
INSTALL_HINT = ("run `make real-node-deps` (apt packages, the containerd and kubelet builds; "
                "tools/install-real-node-deps.sh)")

# containerd 2.x, its runc shim and ctr, built from the Go module proxy by tools/build-containerd.sh: the version is
# the one tools/containerd/go.mod requires, the directory ${FRACGPU_CONTAINERD_CACHE:-~/.cache/fracgpu/containerd-<v>}.
CONTAINERD_MODULE = "github.com/containerd/containerd/v2"
CONTAINERD_GO_MOD = REPO_ROOT / "tools" / "containerd" / "go.mod"
CONTAINERD_BUILD_SCRIPT = REPO_ROOT / "tools" / "build-containerd.sh"
CONTAINERD_CACHE_ENV = "FRACGPU_CONTAINERD_CACHE"
CONTAINERD_TOOLS = ("containerd", "containerd-shim-runc-v2", "ctr")


# One real-node cluster per machine: they share the pod network's address, the fixed paths and the cgroup parent,
# and a starting cluster sweeps what a killed one left. The lock file names the holder.
LOCK_FILE = Path("/run/fracgpu-realnodes.lock")
# How long a starting cluster waits for the one holding the lock (CI waits longer: a developer's cluster or suite
# still running on the machine delays it rather than failing it).
LOCK_WAIT_ENV = "FRACGPU_REALNODES_LOCK_WAIT"


class RealNodesUnavailable(RuntimeError):
    """This machine cannot run real nodes; the message says why and what to do."""


@dataclass
class NodeBinaries:
    kubelet: Path
    kube_proxy: Path
    containerd: Path
    ctr: Path
    shim: Path  # containerd-shim-runc-v2, beside containerd: first on the node's PATH

    @property
    def containerd_dir(self) -> Path:
        return self.containerd.parent


def containerd_version() -> str:
    """The containerd version the test bed runs: the one tools/containerd/go.mod requires ("v2.2.9")."""
    for line in CONTAINERD_GO_MOD.read_text().splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == CONTAINERD_MODULE:
            return words[1]
    raise RealNodesUnavailable(f"{CONTAINERD_GO_MOD} requires no {CONTAINERD_MODULE}")


def containerd_dir() -> Path:
    """Where tools/build-containerd.sh builds containerd (``$FRACGPU_CONTAINERD_CACHE`` overrides it)."""
    override = os.environ.get(CONTAINERD_CACHE_ENV)
    if override:
        return Path(override)
    return Path.home() / ".cache" / "fracgpu" / f"containerd-{containerd_version()}"


def find_containerd() -> tuple[Path, Path, Path]:
    """containerd, ctr and containerd-shim-runc-v2 from tools/build-containerd.sh's cache, of the version
    tools/containerd/go.mod names; or BinariesMissingError naming `make real-node-deps`. Announced on stderr."""
    version, directory = containerd_version(), containerd_dir()
    paths = {name: directory / name for name in CONTAINERD_TOOLS}
    if missing := [str(path) for path in paths.values() if not (path.is_file() and os.access(path, os.X_OK))]:
        raise BinariesMissingError(
            f"containerd {version} not built ({', '.join(missing)} missing): the real nodes run containerd 2.x built "
            f"from its Go module; build it with `make real-node-deps` (runs {CONTAINERD_BUILD_SCRIPT}; a few minutes "
            f"cold on 2 cores, instant when cached); set {CONTAINERD_CACHE_ENV} to use another directory")
    out = subprocess.run([str(paths["containerd"]), "--version"], capture_output=True, text=True, timeout=30).stdout
    words = out.split()  # "containerd github.com/containerd/containerd/v2 v2.2.9 <revision>"
    found = words[2] if len(words) > 2 else "unknown"
    if found != version:
        raise BinariesMissingError(
            f"{paths['containerd']} is containerd {found}, expected {version} (tools/containerd/go.mod): the cache "
            f"holds another version; run `make real-node-deps` ({CONTAINERD_BUILD_SCRIPT.name} --force rebuilds) or "
            f"point {CONTAINERD_CACHE_ENV} at the {version} cache")
    print(f"[testbed] containerd {found} ({paths['containerd']})", file=sys.stderr, flush=True)
    return paths["containerd"], paths["ctr"], paths["containerd-shim-runc-v2"]


def check_machine() -> NodeBinaries:
    """The binaries real nodes run, or RealNodesUnavailable naming what is missing."""
    if not sys.platform.startswith("linux"):
        raise RealNodesUnavailable(f"real nodes need Linux (this is {sys.platform})")
    if os.geteuid() != 0:
        raise RealNodesUnavailable("real nodes need root (containerd, mount and network namespaces, cgroups)")
    missing = [f"{tool} (apt package {package})" for tool, package in HOST_TOOLS.items() if not shutil.which(tool)]
    missing += [f"{CNI_DIR}/{plugin} (apt package containernetworking-plugins)"
                for plugin in ("bridge", "host-local", "loopback") if not (CNI_DIR / plugin).exists()]
    try:
        containerd, ctr, shim = find_containerd()
    except BinariesMissingError as error:
        missing.append(str(error))
        containerd = ctr = shim = Path()
    try:
        kubelet = find_binary("kubelet", binaries_dir())
        kube_proxy = find_binary("kube-proxy", binaries_dir())
    except BinariesMissingError as error:
        missing.append(str(error))
        kubelet = kube_proxy = Path()
    if missing:
        raise RealNodesUnavailable("real nodes cannot start, missing: " + "; ".join(missing) + f". {INSTALL_HINT}")
    return NodeBinaries(kubelet, kube_proxy, containerd, ctr, shim)


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=60)


@dataclass
class HostPrep:
    """Host changes of one real-node cluster; `restore()` is safe to call twice and after a partial `apply()`."""

    saved_sysctls: dict[str, str] = field(default_factory=dict)
    created_paths: list[Path] = field(default_factory=list)
    created_interface: bool = False
    cgroup_roots: list[Path] = field(default_factory=list)
    saved_firewall: dict[str, str] = field(default_factory=dict)
    lock: int | None = None

    def acquire(self, timeout: float | None = None) -> None:
        """Hold the machine's real-node lock, waiting up to `timeout` (default: $FRACGPU_REALNODES_LOCK_WAIT
        seconds, else 120) for another cluster to stop."""
        if timeout is None:
            timeout = float(os.environ.get(LOCK_WAIT_ENV) or 120)
        descriptor = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    holder = os.pread(descriptor, 200, 0).decode(errors="replace").strip()
                    os.close(descriptor)
                    raise RealNodesUnavailable(
                        f"another real-node cluster holds {LOCK_FILE} ({holder}) after {timeout:.0f} s; one runs per "
                        f"machine (stop it, or set {LOCK_WAIT_ENV} to wait longer)") from None
                time.sleep(0.5)
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"pid {os.getpid()}: {' '.join(sys.argv)[:150]}\n".encode(), 0)
        self.lock = descriptor

    def release(self) -> None:
        if self.lock is not None:
            os.close(self.lock)  # closing drops the flock
            self.lock = None

    def apply(self) -> None:
        if self.lock is None:
            self.acquire()
        self.sweep_leftovers()
        # kube-proxy's --cleanup leaves the KUBE-FIREWALL chain the kubelet and kube-proxy share: the tables are
        # saved whole and put back whole (nothing else on a test machine writes them meanwhile).
        for tool in ("iptables", "ip6tables"):
            if shutil.which(f"{tool}-save"):
                self.saved_firewall[tool] = _run(f"{tool}-save").stdout
        for name in TOUCHED_SYSCTLS:
            path = _sysctl_path(name)
            if path.exists():
                self.saved_sysctls[name] = path.read_text().strip()
        for fixed in map(Path, FIXED_PATHS):
            if not fixed.exists():
                missing = [p for p in (fixed, *fixed.parents) if not p.exists()]
                fixed.mkdir(parents=True)
                self.created_paths.extend(missing)  # deepest first: removed in this order
        self._add_api_interface()
        self.cgroup_roots = [hierarchy / CGROUP_PARENT for hierarchy in cgroup_hierarchies()]
        for root in self.cgroup_roots:
            root.mkdir(exist_ok=True)

    @staticmethod
    def sweep_leftovers() -> list[str]:
        """What a killed run left: processes in our cgroups, node bridges. Removed before anything starts."""
        problems = []
        for hierarchy in cgroup_hierarchies():
            problems += remove_cgroup_tree(hierarchy / CGROUP_PARENT)
        links = _run("ip", "-o", "link", "show", check=False).stdout
        for line in links.splitlines():
            name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
            if name.startswith(NODE_BRIDGE_PREFIX) or name == API_INTERFACE:
                _run("ip", "link", "del", name, check=False)
                problems.append(f"deleted interface {name} left by an earlier run")
        return problems

    def _add_api_interface(self) -> None:
        if _run("ip", "link", "show", API_INTERFACE, check=False).returncode == 0:
            _run("ip", "link", "del", API_INTERFACE)  # left by a run that was killed
        _run("ip", "link", "add", API_INTERFACE, "type", "bridge")
        self.created_interface = True
        _run("ip", "addr", "add", f"{API_ADDRESS}/32", "dev", API_INTERFACE)
        _run("ip", "link", "set", API_INTERFACE, "up")

    def restore(self) -> list[str]:
        """Undo everything; the problems met (none when the machine is as it was)."""
        problems: list[str] = []
        for root in self.cgroup_roots:
            problems += remove_cgroup_tree(root)
        self.cgroup_roots = []
        if self.created_interface:
            if _run("ip", "link", "del", API_INTERFACE, check=False).returncode != 0:
                problems.append(f"could not delete interface {API_INTERFACE}")
            self.created_interface = False
        for path in self.created_paths:
            try:
                path.rmdir()
            except OSError as error:
                problems.append(f"could not remove {path}: {error}")
        self.created_paths = []
        for tool, rules in self.saved_firewall.items():
            restored = subprocess.run([f"{tool}-restore"], input=rules, capture_output=True, text=True, timeout=60)
            if restored.returncode != 0:
                problems.append(f"could not restore the {tool} rules: {restored.stderr.strip()}")
        self.saved_firewall = {}
        for name, value in self.saved_sysctls.items():
            path = _sysctl_path(name)
            try:
                if path.read_text().strip() != value:
                    path.write_text(value)
            except OSError as error:
                problems.append(f"could not restore sysctl {name}={value}: {error}")
        self.saved_sysctls = {}
        self.release()
        return problems


def cgroup_hierarchies() -> list[Path]:
    """Every mounted cgroup v1 hierarchy (or the v2 root): where a node's cgroups are made and removed."""
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").exists():
        return [root]
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink() and (p / "cgroup.procs").exists())


def cgroup_pids(directory: Path) -> list[int]:
    """Every process in `directory` and the cgroups below it."""
    pids: list[int] = []
    for procs in directory.rglob("cgroup.procs"):
        try:
            pids += [int(line) for line in procs.read_text().split()]
        except OSError:
            continue
    return pids


def remove_cgroup_tree(directory: Path) -> list[str]:
    """Kill what is left in a cgroup tree and remove its directories, deepest first."""
    if not directory.exists():
        return []
    problems = []
    for pid in cgroup_pids(directory):
        try:
            os.kill(pid, 9)
            problems.append(f"killed pid {pid} left in {directory}")
        except ProcessLookupError:
            pass
    for sub in sorted((p for p in directory.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        _rmdir_cgroup(sub, problems)
    _rmdir_cgroup(directory, problems)
    return problems


def _rmdir_cgroup(path: Path, problems: list[str]) -> None:
    for _ in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)  # a killed process leaves its cgroup a moment after the signal
    problems.append(f"could not remove cgroup {path}")
