"""Structured logging for every program: one JSON object per line, with the Kubernetes objects involved.

Which object a line is about is said one way: `log_context(namespace=..., pod=..., node=..., bindrequest=...)`,
opened where the work on that object begins (a webhook request, a reconcile of a BindRequest, a GPU group's
sync, an extender verb). Every line logged inside it on the same thread or task carries those fields, so lines
from deep inside plugins say which pod, node and BindRequest they belong to without being handed them; nested
blocks add fields or name another object for a while (`about_pod(pod)`: a line about a reservation pod inside a
bind). A line's own data (an error text, a limit, a count) goes in `extra={"fields": {...}}`.

Logger names: `<program>.<part>`. The program is the package (`admission`, `binder`, `extender`, `certs`,
`testbed`), or `kube` for the API machinery in common/kube/ that every program runs; the part is what a reader
filters on: the module (`binder.pipeline`, `extender.leftovers`, `kube.cache`), the plugin
(`binder.plugins.gpusharing`), or the component when it spans modules (`binder.controller` for the BindRequest
controller and its parking and undecided binds, `binder.reservation` for the reservation service). The bare
program name (`binder`, `extender`) is for its start-up and wiring.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
import threading
import time
import types
from collections.abc import Mapping
from typing import Any

CONTEXT_FIELDS = ("namespace", "pod", "node", "bindrequest", "plugin", "webhook", "uid", "operation")

_NO_CONTEXT: Mapping[str, Any] = types.MappingProxyType({})
_CONTEXT: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar("fracgpu_log_context",
                                                                             default=_NO_CONTEXT)


class _LogContext:
    """A class rather than a @contextmanager generator, which cost a webhook request several microseconds more."""

    __slots__ = ("_fields", "_token")

    def __init__(self, fields: dict[str, Any]) -> None:
        self._fields = fields

    def __enter__(self) -> None:
        fields = self._fields
        if None in fields.values():
            fields = {key: value for key, value in fields.items() if value is not None}
        self._token = _CONTEXT.set({**_CONTEXT.get(), **fields})

    def __exit__(self, *exc_info: object) -> None:
        _CONTEXT.reset(self._token)


def log_context(**fields: Any) -> contextlib.AbstractContextManager[None]:
    """Every line logged in this block (this thread or task) carries `fields`; nested blocks add to them or
    replace them. A field given as None is not known: it is left out, and an outer block's value stays."""
    return _LogContext(fields)


def about_pod(pod: Mapping[str, Any]) -> contextlib.AbstractContextManager[None]:
    """`log_context` naming `pod`: its namespace, name and node (those it has)."""
    meta = pod.get("metadata") or {}
    return log_context(namespace=meta.get("namespace"), pod=meta.get("name"),
                       node=(pod.get("spec") or {}).get("nodeName"))


def current_context() -> dict[str, Any]:
    return dict(_CONTEXT.get())


# CPython 3.11 before 3.11.8 (Debian bookworm's 3.11.2, the images' Python, among them) keeps the AST conversion's
# recursion depth in state all threads share, and formatting a traceback parses source lines (for its ^^^ marks):
# two threads doing that at once can raise "SystemError: AST constructor recursion depth mismatch" in either. The
# programs log exceptions from many worker threads, so their tracebacks are formatted one at a time.
_TRACEBACK_LOCK = threading.Lock()


class _OneTracebackAtATime(logging.Formatter):
    def formatException(self, ei: Any) -> str:  # noqa: N802 - logging's API
        with _TRACEBACK_LOCK:
            return super().formatException(ei)


class JsonFormatter(_OneTracebackAtATime):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        line.update(_CONTEXT.get())
        for field in CONTEXT_FIELDS:
            value = getattr(record, field, None)
            if value is not None:
                line[field] = value
        extra_fields = getattr(record, "fields", None)
        if isinstance(extra_fields, dict):
            line.update(extra_fields)
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class TextFormatter(_OneTracebackAtATime):
    def format(self, record: logging.LogRecord) -> str:
        pairs = dict(_CONTEXT.get())
        pairs.update({field: getattr(record, field) for field in CONTEXT_FIELDS if getattr(record, field, None)})
        context = " ".join(f"{key}={value}" for key, value in pairs.items())
        base = f"{self.formatTime(record)} {record.levelname:<7} {record.name}: {record.getMessage()}"
        text = f"{base} {context}" if context else base
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def configure_logging(log_format: str = "json", level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


class RateLimit:
    """At most `per_second` lines on average, `burst` at once; says how many were held back.

    For lines one request can cause (a denied or invalid review), so a flood of bad requests cannot
    flood the log: `allow()` returns None when the line must be dropped, else the number dropped since
    the last line that went out (to be logged with it, so nothing disappears silently).
    """

    def __init__(self, per_second: float, burst: int, clock: Any = time.monotonic) -> None:
        self.per_second = per_second
        self.burst = burst
        self.clock = clock
        self._tokens = float(burst)
        self._last = clock()
        self._dropped = 0
        self._lock = threading.Lock()

    def allow(self) -> int | None:
        with self._lock:
            now = self.clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.per_second)
            self._last = now
            if self._tokens < 1.0:
                self._dropped += 1
                return None
            self._tokens -= 1.0
            dropped, self._dropped = self._dropped, 0
            return dropped
