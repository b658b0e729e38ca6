"""The webhook refuses to start on a certificate and key that do not serve TLS, naming both files in one line."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from certs.pki import generate_directory
from testbed.programs.procs import free_ports

ROOT = Path(__file__).resolve().parents[2]


def start(cert_dir: Path) -> subprocess.CompletedProcess:
    webhook, health, metrics = free_ports(3)
    return subprocess.run([sys.executable, "-m", "admission", "--cert-dir", str(cert_dir), "--webhook-addr",
                           str(webhook), "--health-probe-bind-address", f"127.0.0.1:{health}",
                           "--metrics-bind-address", f"127.0.0.1:{metrics}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_a_key_of_another_certificate_stops_the_webhook_with_both_file_names(tmp_path):
    generate_directory(str(tmp_path / "a"), ["127.0.0.1"])
    generate_directory(str(tmp_path / "b"), ["127.0.0.1"])
    shutil.copy(tmp_path / "b" / "tls.key", tmp_path / "a" / "tls.key")
    result = start(tmp_path / "a")
    assert result.returncode == 1
    line = result.stderr.strip().splitlines()[-1]  # after the JSON start-up line: the one error line
    assert line.startswith(f"fracgpu-admission: serving certificate {tmp_path}/a/tls.crt: {tmp_path}/a/tls.key is "
                           f"not the private key of the certificate in {tmp_path}/a/tls.crt; ")


def test_a_file_that_is_not_pem_stops_the_webhook(tmp_path):
    generate_directory(str(tmp_path), ["127.0.0.1"])
    (tmp_path / "tls.crt").write_text("not a certificate\n")
    result = start(tmp_path)
    assert result.returncode == 1
    line = result.stderr.strip().splitlines()[-1]  # after the JSON start-up line: the one error line
    assert f"{tmp_path}/tls.crt and {tmp_path}/tls.key do not load" in line
