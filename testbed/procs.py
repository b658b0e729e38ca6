"""Process plumbing for the test bed: free ports, child processes that die with us, log tails."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (held open together so they differ)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


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


def spawn(argv: list[str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own process group, stdout+stderr to ``log``, without proxy settings."""
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
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
