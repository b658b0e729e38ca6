"""`python -m admission` / `fracgpu-admission`: the webhook under gunicorn."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Sequence

from admission.settings import parse_settings
from admission.tlsreload import pair_problem
from common.logs import configure_logging


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_settings(argv)
    configure_logging(settings.log_format, settings.log_level)
    for path in (settings.cert_file, settings.key_file):
        if not os.path.isfile(path):
            print(f"fracgpu-admission: serving certificate file {path} is missing "
                  f"(create it with `python -m certs generate --dir {settings.cert_dir}` or mount the "
                  "webhook Secret there)", file=sys.stderr)
            return 2
    problem = pair_problem(settings.cert_file, settings.key_file)
    if problem:
        print(f"fracgpu-admission: {problem}; not serving", file=sys.stderr)
        return 2
    # Must be set before prometheus_client is imported, so every worker writes to the shared directory.
    own_metrics_dir = "PROMETHEUS_MULTIPROC_DIR" not in os.environ
    if own_metrics_dir:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="fracgpu-admission-metrics-")
    from admission.gunicorn_app import AdmissionServer

    try:
        AdmissionServer(settings).run()
    finally:
        if own_metrics_dir:
            shutil.rmtree(os.environ["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
