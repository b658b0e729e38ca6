"""Exact crash points for a client under test: the HTTP fault proxy SIGKILLs it at a chosen request.

`CrashProxy` is testbed/proxies/faultproxy.py's `HttpFaultProxy` with one more action. `crash(method, path, when, skip)`
arms a one-shot rule on the (skip+1)-th matching request:

* `when="before"`: the victim is killed and the request is never forwarded (it did not happen);
* `when="after"`: the request is forwarded, and the victim is killed once the apiserver has answered, before the
  answer is relayed (it happened, and the client never learnt it).

No hook in the binder is needed; `victim` is any callable that kills it (e.g. SIGKILL to the current pid).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from testbed.proxies.faultproxy import HttpFaultProxy, Rule

log = logging.getLogger("testbed.proxies.crashproxy")


@dataclass
class CrashRule(Rule):
    skip: int = 0

    def matches(self, method: str, path: str, query: str = "", key: str = "") -> bool:
        if not super().matches(method, path, query, key):
            return False
        if self.skip > 0:
            self.skip -= 1
            return False
        return True


class CrashProxy(HttpFaultProxy):
    def __init__(self, upstream: str, ca_file: str | Path, token: str) -> None:
        super().__init__(upstream, ca_file, token)
        self.victim: Callable[[], None] | None = None
        self.crashes: list[str] = []  # "<before|after> METHOD path" of each crash point reached

    def crash(self, method: str, path: str, when: str = "before", skip: int = 0, query: str | None = None) -> Rule:
        if when not in ("before", "after"):
            raise ValueError(f"when must be 'before' or 'after', not {when!r}")
        rule = CrashRule(method, re.compile(path), f"sigkill_{when}", query=re.compile(query) if query else None,
                         times=1, skip=skip)
        with self._lock:
            self.rules.append(rule)
        return rule

    def _kill(self, method: str, path: str, when: str) -> None:
        log.info("crash point reached", extra={"fields": {"method": method, "path": path, "when": when}})
        self.crashes.append(f"{when} {method} {path}")
        if self.victim is not None:
            self.victim()

    def _pick(self, method: str, path: str, query: str, key: str = "") -> Rule | None:
        rule = super()._pick(method, path, query, key)
        if rule is not None and rule.action == "sigkill_before":
            self._kill(method, path, "before")
            return Rule(method, rule.path, "hang")  # the dead client's request is never forwarded
        return rule

    def _record(self, method: str, path: str, status: int, started: float, rule: Rule | None) -> None:
        super()._record(method, path, status, started, rule)
        if rule is not None and rule.action == "sigkill_after":
            self._kill(method, path, "after")
