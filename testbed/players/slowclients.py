"""Clients that hold a TLS server's connections without using them: the load the webhook must shrug off.

    python -m testbed.players.slowclients --port 9443 --silent 500 --slow 500 --duration 30

- silent: finish the TLS handshake, then send nothing (what the apiserver's HTTP client leaves behind when it
  dials for a burst and parks the connections it ends up not needing);
- slow: send a review request one byte per second;
- unshaken: open TCP and never start the handshake.
A connection the server closes is opened again, so the pressure stays for the whole duration. One JSON line is
printed once every connection has been opened once ({"ready": true, ...}) and one at the end with counts.
Targets loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import ssl
import sys
import time

_SLOW_REQUEST = (b"POST /validate--v1-pod HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 2\r\n\r\n{}")


class Pressure:
    def __init__(self, host: str, port: int, deadline: float) -> None:
        self.host = host
        self.port = port
        self.deadline = deadline
        self.context = ssl.create_default_context()
        self.context.check_hostname = False
        self.context.verify_mode = ssl.CERT_NONE
        self.opened = {"silent": 0, "slow": 0, "unshaken": 0}
        self.closed_by_server = {"silent": 0, "slow": 0, "unshaken": 0}
        self.failed_connects = 0

    async def hold(self, kind: str, first: asyncio.Event) -> None:
        while time.monotonic() < self.deadline:
            try:
                tls = None if kind == "unshaken" else self.context
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(self.host, self.port, ssl=tls), timeout=30)
            except (TimeoutError, OSError):
                self.failed_connects += 1
                first.set()
                await asyncio.sleep(0.5)
                continue
            self.opened[kind] += 1
            first.set()
            try:
                if kind == "slow":
                    await self._trickle(reader, writer)
                else:
                    await self._wait_closed(reader, kind)
            finally:
                writer.transport.abort()

    async def _trickle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for index in range(len(_SLOW_REQUEST)):
            if time.monotonic() >= self.deadline:
                return
            try:
                writer.write(_SLOW_REQUEST[index:index + 1])
                await writer.drain()
                if await _closed_within(reader, 1.0):
                    self.closed_by_server["slow"] += 1
                    return
            except (OSError, ssl.SSLError):
                self.closed_by_server["slow"] += 1
                return
        await self._wait_closed(reader, "slow")

    async def _wait_closed(self, reader: asyncio.StreamReader, kind: str) -> None:
        remaining = self.deadline - time.monotonic()
        if remaining > 0 and await _closed_within(reader, remaining):
            self.closed_by_server[kind] += 1


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    try:
        data = await asyncio.wait_for(reader.read(65536), timeout=seconds)
    except TimeoutError:
        return False
    except (OSError, ssl.SSLError):
        return True
    return not data or reader.at_eof()


async def run(host: str, port: int, counts: dict[str, int], duration: float) -> dict:
    pressure = Pressure(host, port, time.monotonic() + duration)
    firsts = []
    tasks = []
    for kind, count in counts.items():
        for _ in range(count):
            first = asyncio.Event()
            firsts.append(first)
            tasks.append(asyncio.create_task(pressure.hold(kind, first)))
            await asyncio.sleep(0)
    for first in firsts:
        await first.wait()
    print(json.dumps({"ready": True, "opened": pressure.opened, "failed_connects": pressure.failed_connects}),
          flush=True)
    await asyncio.gather(*tasks)
    return {"ready": False, "opened": pressure.opened, "closed_by_server": pressure.closed_by_server,
            "failed_connects": pressure.failed_connects}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--silent", type=int, default=0)
    parser.add_argument("--slow", type=int, default=0)
    parser.add_argument("--unshaken", type=int, default=0)
    parser.add_argument("--duration", type=float, default=30.0)
    args = parser.parse_args(argv)
    if not args.host.startswith("127.") and args.host not in ("localhost", "::1"):
        print("slowclients: loopback targets only", file=sys.stderr)
        return 2
    total = args.silent + args.slow + args.unshaken
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < total + 64:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, total + 64), hard))
    counts = {"silent": args.silent, "slow": args.slow, "unshaken": args.unshaken}
    print(json.dumps(asyncio.run(run(args.host, args.port, counts, args.duration))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
