"""Run the real admission webhook (gunicorn over TLS) as a child process, for tests, demo and benchmarks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import requests

from certs.pki import generate_directory
from testbed.procs import die_with_parent, free_port, tail


class AdmissionProcess:
    """`python -m admission` on free 127.0.0.1 ports with a fresh CA and serving certificate."""

    def __init__(self, workdir: Path, args: Sequence[str] = (), workers: int = 2) -> None:
        self.workdir = Path(workdir)
        self.cert_dir = self.workdir / "certs"
        self.args = list(args)
        self.workers = workers
        self.port = free_port()
        self.health_port = free_port()
        self.metrics_port = free_port()
        self.log_path = self.workdir / "admission.log"
        self._process: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        """The gunicorn master; its workers share its process group."""
        assert self._process is not None, "not started"
        return self._process.pid

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> str:
        return str(self.cert_dir / "ca.crt")

    def start(self, timeout: float = 60) -> AdmissionProcess:
        if not (self.cert_dir / "tls.crt").exists():
            generate_directory(str(self.cert_dir), ["127.0.0.1", "localhost"])
        argv = [
            sys.executable, "-m", "admission", "--webhook-addr", str(self.port), "--webhook-host", "127.0.0.1",
            "--cert-dir", str(self.cert_dir), "--health-probe-bind-address", f"127.0.0.1:{self.health_port}",
            "--metrics-bind-address", f"127.0.0.1:{self.metrics_port}", "--workers", str(self.workers),
            *self.args,
        ]
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 (the child owns it)
        self._process = subprocess.Popen(die_with_parent(argv), stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, cwd=str(Path(__file__).resolve().parent.parent),
                                         env=dict(os.environ))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"admission webhook exited with {self._process.returncode}:\n{self.log_tail()}")
            try:
                if requests.get(f"http://127.0.0.1:{self.health_port}/readyz", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"admission webhook not ready after {timeout}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        return tail(self.log_path, lines)

    def stop(self) -> None:
        if self._process is None or self._process.poll() is not None:
            return
        os.killpg(self._process.pid, signal.SIGTERM)
        try:
            self._process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()

    def __enter__(self) -> AdmissionProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
