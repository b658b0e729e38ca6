"""Every program, run as operators run it: a start-up error is one line `fracgpu-<program>: <what>: <why>;
<how to fix>` (exit status 2 for the command line, 1 for the rest), never a traceback; and a program that
starts logs its version and effective settings first, as JSON."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from certs.pki import generate_directory

ROOT = Path(__file__).resolve().parents[2]
ERROR_LINE = re.compile(r"^fracgpu-[a-z-]+: [^\n]+: [^\n]+; [^\n]+$")


def run(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def error_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    """stderr without the JSON log lines: what an operator reads as the program's complaint."""
    return [line for line in result.stderr.splitlines() if not line.startswith("{")]


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig that loads (nothing listens at its server; these programs fail before calling it)."""
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return path


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.mark.parametrize(("argv", "starts_with"), [
    (["admission", "--metrics-bind-address", "localhost"], "fracgpu-admission: --metrics-bind-address: "),
    (["binder", "--metrics-bind-address", "localhost"], "fracgpu-binder: --metrics-bind-address: "),
    (["extender", "--metrics-bind-address", "localhost"], "fracgpu-extender: --metrics-bind-address: "),
    (["certs", "verify", "--kubeconfig", "/nonexistent/kubeconfig"], "fracgpu-certs: --kubeconfig: "),
    (["binder.reservation", "--kubeconfig", "/nonexistent/kubeconfig"],
     "fracgpu-resource-reservation: --kubeconfig: "),
    (["binder", "--max-concurrent-reconciles", "-5"], "fracgpu-binder: --max-concurrent-reconciles: "),
    (["admission", "--gpu-sharing-enable"], "fracgpu-admission: command line: unrecognized arguments"),
    (["admission", "--cert-dir", "/nonexistent/certs"], "fracgpu-admission: --cert-dir /nonexistent/certs: "),
])
def test_command_line_errors_are_one_line_and_exit_2(argv, starts_with):
    result = run(*argv)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = error_lines(result)
    assert line.startswith(starts_with) and ERROR_LINE.match(line), line


def test_certs_generate_into_a_directory_it_cannot_write_is_one_line(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = run("certs", "generate", "--dir", str(blocker / "certs"))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    (line,) = error_lines(result)
    assert line.startswith(f"fracgpu-certs: --dir {blocker / 'certs'}: cannot write the certificates (")
    assert ERROR_LINE.match(line)


def test_a_serving_key_that_does_not_match_the_certificate_is_one_line(tmp_path):
    generate_directory(str(tmp_path / "a"), ["127.0.0.1"])
    generate_directory(str(tmp_path / "b"), ["127.0.0.1"])
    (tmp_path / "a" / "tls.key").write_bytes((tmp_path / "b" / "tls.key").read_bytes())
    result = run("admission", "--cert-dir", str(tmp_path / "a"), "--webhook-addr", "1")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    (line,) = error_lines(result)
    assert line.startswith(f"fracgpu-admission: serving certificate {tmp_path / 'a' / 'tls.crt'}: "
                           f"{tmp_path / 'a' / 'tls.key'} is not the private key of the certificate in")
    assert ERROR_LINE.match(line)


@pytest.mark.parametrize("program", ["admission", "binder", "extender"])
def test_a_port_in_use_is_one_line(tmp_path, kubeconfig, busy_port, program):
    if program == "admission":
        generate_directory(str(tmp_path / "certs"), ["127.0.0.1"])
        argv = ["--cert-dir", str(tmp_path / "certs"), "--webhook-addr", str(busy_port),
                "--webhook-host", "127.0.0.1"]
        flag = "--webhook-addr"
    else:
        argv = ["--kubeconfig", str(kubeconfig), "--health-probe-bind-address", f"127.0.0.1:{busy_port}",
                "--metrics-bind-address", "0"] + (["--bind-address", "127.0.0.1:0"] if program == "extender" else [])
        flag = "--health-probe-bind-address"
    result = run(program, *argv)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    (line,) = error_lines(result)
    assert line.startswith(f"fracgpu-{program}: {flag} 127.0.0.1:{busy_port}: cannot listen there (")
    assert ERROR_LINE.match(line)


def test_certs_logs_json_by_default_and_starts_with_its_version_and_settings(tmp_path):
    result = run("certs", "generate", "--dir", str(tmp_path / "certs"), "--host", "webhook.local")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stderr.splitlines()]  # every line is JSON
    first = lines[0]
    assert first["msg"].startswith("fracgpu-certs generate ") and first["version"]
    assert first["settings"]["hosts"] == ["webhook.local"] and first["settings"]["days"] == 365
    assert any(line["msg"].startswith("wrote ") for line in lines)
