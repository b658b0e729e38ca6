"""`python -m certs generate --dir DIR --host NAME-OR-IP ...`: CA and serving certificate as files."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from certs.pki import generate_directory


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m certs", description="webhook certificates")
    commands = parser.add_subparsers(dest="command", required=True)
    generate = commands.add_parser("generate", help="write ca.crt/ca.key, tls.crt/tls.key")
    generate.add_argument("--dir", required=True, help="output directory (an existing CA there is reused)")
    generate.add_argument("--host", action="append", default=[], dest="hosts",
                          help="DNS name or IP address for the serving certificate (repeatable)")
    generate.add_argument("--days", type=int, default=365, help="serving certificate validity")
    args = parser.parse_args(argv)
    hosts = args.hosts or ["127.0.0.1", "localhost"]
    generate_directory(args.dir, hosts, args.days)
    print(f"wrote {args.dir}/ca.crt and {args.dir}/tls.crt for {', '.join(hosts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
