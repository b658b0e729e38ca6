"""Run the real admission webhook (gunicorn over TLS) as a child process, for tests, demo and benchmarks."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from certs.pki import generate_directory
from testbed.programs.procs import ChildProgram, free_port


class AdmissionProcess(ChildProgram):
    """`python -m admission` on free 127.0.0.1 ports with a fresh CA and serving certificate."""

    name = "admission"

    def __init__(self, workdir: Path, args: Sequence[str] = (), workers: int = 2,
                 shutdown_drain: float | None = 0.0) -> None:
        super().__init__(workdir)
        self.cert_dir = self.workdir / "certs"
        self.args = list(args)
        # The shipped 5 s drain after SIGTERM keeps idle connections open for the API server's next review; the
        # API server keeps its idle connections for 90 s, so every stop in a test would wait out the drain. Tests
        # that are about shutdown say None (the shipped default) or their own value.
        if shutdown_drain is not None and not any(arg.startswith("--shutdown-drain-seconds") for arg in self.args):
            self.args += ["--shutdown-drain-seconds", str(shutdown_drain)]
        self.workers = workers
        self.port = free_port()
        self.health_port = free_port()
        self.metrics_port = free_port()
        self.health_url = f"http://127.0.0.1:{self.health_port}/readyz"

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> str:
        return str(self.cert_dir / "ca.crt")

    def argv(self) -> list[str]:
        return [
            sys.executable, "-m", "admission", "--webhook-addr", str(self.port), "--webhook-host", "127.0.0.1",
            "--cert-dir", str(self.cert_dir), "--health-probe-bind-address", f"127.0.0.1:{self.health_port}",
            "--metrics-bind-address", f"127.0.0.1:{self.metrics_port}", "--workers", str(self.workers),
            *self.args,
        ]

    def start(self, timeout: float = 60) -> AdmissionProcess:
        """The gunicorn master is `pid`; its workers share its process group, which `stop` ends."""
        if not (self.cert_dir / "tls.crt").exists():
            generate_directory(str(self.cert_dir), ["127.0.0.1", "localhost"])
        super().start(timeout)
        return self
