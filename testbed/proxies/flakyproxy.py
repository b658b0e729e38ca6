"""A flaky API server: the HTTP fault proxy answers a seeded random share of matching requests with an error.

`FlakyProxy` is testbed/proxies/faultproxy.py's `HttpFaultProxy` plus `flake(method, path, share, status, headers)`:
each matching request is answered `status` (without being forwarded) with probability `share`, from a seeded random
stream; everything else is forwarded. `slow(method, path, share, seconds)` holds a share of them, then forwards
them. Flakes are tried in the order they were added, the first that fires wins. `clear()` removes the flakes with
the rules. Used for API Priority and Fairness storms (429 with Retry-After), overloaded apiservers (503) and slow
ones.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

from testbed.proxies.faultproxy import HttpFaultProxy, Rule


@dataclass
class _Flake:
    method: re.Pattern[str]
    path: re.Pattern[str]
    share: float
    answer: Rule
    every: int = 0  # fire on each every-th match instead of at random
    matched: int = 0
    fired: int = 0

    def fires(self, draw: float) -> bool:
        self.matched += 1
        return self.matched % self.every == 0 if self.every else draw < self.share


class FlakyProxy(HttpFaultProxy):
    def __init__(self, upstream: str, ca_file: str | Path, token: str, seed: int = 0) -> None:
        super().__init__(upstream, ca_file, token)
        self.random = random.Random(seed)
        self.flakes: list[_Flake] = []
        self.injected = 0

    def flake(self, method: str, path: str, share: float, status: int, headers: dict[str, str] | None = None) -> None:
        """Answer `status` to a `share` (0-1) of the requests whose method and path match the regexes."""
        body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": status,
                "message": f"injected by the flaky proxy: HTTP {status}"}
        answer = Rule(method, re.compile(path), "answer", status=status, body=body, headers=headers or {},
                      times=None)
        with self._lock:
            self.flakes.append(_Flake(re.compile(method), re.compile(path), share, answer))

    def slow(self, method: str, path: str, share: float, seconds: float, every: int = 0) -> None:
        """Hold a `share` (0-1) of the matching requests `seconds`, then forward them (a slow apiserver);
        with `every`, hold exactly each `every`-th matching request instead."""
        held = Rule(method, re.compile(path), "delay", delay_s=seconds, times=None)
        with self._lock:
            self.flakes.append(_Flake(re.compile(method), re.compile(path), share, held, every=every))

    def clear(self) -> None:
        super().clear()
        with self._lock:
            self.flakes.clear()

    def _pick(self, method: str, path: str, query: str, key: str = "") -> Rule | None:
        rule = super()._pick(method, path, query, key)
        if rule is not None:
            return rule
        with self._lock:
            for flake in self.flakes:
                if flake.method.fullmatch(method) and flake.path.search(path) and flake.fires(self.random.random()):
                    self.injected += 1
                    flake.fired += 1
                    return flake.answer
        return None
