"""Process plumbing for the test bed: free ports, child processes that die with us, log tails, and the one base
of every launcher (`ChildProgram`)."""

from __future__ import annotations

import collections
import os
import random
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import requests
import urllib3

REPO_ROOT = Path(__file__).resolve().parents[2]

# The ports handed out lately: a server may not listen yet on one picked a moment ago.
_handed_out: collections.deque[int] = collections.deque(maxlen=4096)
_handed_out_lock = threading.Lock()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _candidate_ports() -> range:
    low, high = _ephemeral_range()
    return range(20000, low) if low > 21000 else range(high + 1, 65536)


def _listenable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 for servers the tests start later.

    Chosen outside the kernel's ephemeral range: a port the kernel handed out (bind to 0) is free again once
    probed, and any outgoing connection may then take it as its source port before our server listens there
    (a CI run failed so: "Address already in use"). Below that range only another explicit choice can collide,
    and this process does not hand out a port again until thousands of others were.
    """
    candidates = _candidate_ports()
    picked: list[int] = []
    with _handed_out_lock:
        for port in random.sample(candidates, len(candidates)):
            if port not in _handed_out and _listenable(port):
                _handed_out.append(port)
                picked.append(port)
                if len(picked) == count:
                    return picked
    raise RuntimeError(f"no {count} free TCP ports on 127.0.0.1 outside the ephemeral range {_ephemeral_range()}")


def free_port() -> int:
    return free_ports(1)[0]


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of every live process in process group ``pgid`` (Linux /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after the name: state ppid pgrp ... utime(12) stime(13)
            total += int(fields[11]) + int(fields[12])
    return total / ticks


def die_with_parent(argv: list[str]) -> list[str]:
    """Prefix ``argv`` so the child gets SIGKILL when the process that started it dies.

    util-linux's setpriv sets PR_SET_PDEATHSIG and execs the binary (same pid), so an apiserver
    never outlives a killed pytest.  No ``preexec_fn``: that is unsafe in threaded programs.
    """
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--", *argv] if setpriv else argv


def spawn(argv: list[str], log: Path, cwd: Path, extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own process group, stdout+stderr to ``log``, without proxy settings."""
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
    env.update(extra_env or {})
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost,10.243.0.1"  # 10.243.0.1: testbed/realnodes
    with open(log, "wb") as out:
        return subprocess.Popen(
            die_with_parent(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, cwd=cwd, start_new_session=True,
        )


def terminate(popen: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM the child's process group, SIGKILL it after ``grace`` seconds."""
    if popen.poll() is not None:
        return
    try:
        os.killpg(popen.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        popen.wait(grace)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a text file (or why it could not be read)."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(text[-lines:])


class ChildProgram:
    """A program of ours (or a stock one) as a child process: its own process group, killed with its parent,
    without proxy settings, stdout+stderr in `<workdir>/<name>.log`; ready once `health_url` answers 200 (no
    wait when it is empty). Every launcher of the test bed is one of these; a subclass says `argv()`.
    """

    name = "child"

    def __init__(self, workdir: Path, name: str | None = None, env: dict[str, str] | None = None) -> None:
        self.name = name or self.name
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / f"{self.name}.log"
        self.extra_env = dict(env or {})
        self.process: subprocess.Popen[bytes] | None = None
        self.health_url = ""

    def argv(self) -> list[str]:
        raise NotImplementedError

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    @property
    def log(self) -> Path:
        return self.log_path

    def start(self, timeout: float = 60.0) -> ChildProgram:
        if self.log_path.exists():  # a restart: keep what the previous run said
            self.log_path.rename(self.log_path.with_suffix(f".{time.time_ns()}.log"))
        self.process = spawn(self.argv(), self.log_path, REPO_ROOT, self.extra_env)
        if not self.health_url:
            return self
        session = requests.Session()
        session.trust_env = False
        session.verify = False  # kube-scheduler serves /healthz with a certificate it made itself
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if session.get(self.health_url, timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.name} not ready after {timeout}s:\n{self.log_tail()}")

    def stop(self, grace: float = 15.0) -> None:
        if self.process is not None:
            terminate(self.process, grace)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def log_tail(self, lines: int = 40) -> str:
        return tail(self.log_path, lines)

    def tail(self, lines: int = 40) -> str:
        return self.log_tail(lines)

    def __enter__(self) -> ChildProgram:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
