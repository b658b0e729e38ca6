"""Test-bed children must not outlive the process that started them (no stray apiservers)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from testbed.cluster.binaries import REPO_ROOT

STARTER = """
import sys, time
from pathlib import Path
from testbed.programs.procs import spawn
child = spawn(["sleep", "300"], Path(sys.argv[1]) / "sleep.log", Path(sys.argv[1]))
print(child.pid, flush=True)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_spawned_child_dies_when_its_starter_is_killed(tmp_path: Path) -> None:
    starter = subprocess.Popen([sys.executable, "-c", STARTER, str(tmp_path)], cwd=REPO_ROOT,
                               stdout=subprocess.PIPE, text=True)
    assert starter.stdout is not None
    child = int(starter.stdout.readline())
    # setpriv sets PDEATHSIG and then execs; once the child is "sleep", the signal is armed.
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}/comm").read_text().strip() != "sleep":
        assert time.monotonic() < deadline, "setpriv never exec'd the child"
        time.sleep(0.01)
    assert os.getpgid(child) == child  # its own process group, so teardown can kill the group
    starter.send_signal(signal.SIGKILL)  # no atexit, no finally: only PDEATHSIG can clean up
    starter.wait()
    deadline = time.monotonic() + 10
    while _alive(child):
        assert time.monotonic() < deadline, f"child {child} outlived its killed starter"
        time.sleep(0.1)
