"""The log lines a block writes, as the programs write them: JSON, with the log context of the moment they were
logged (which a pytest `caplog` record does not keep: the context is read when a line is formatted)."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from typing import Any

from common.logs import JsonFormatter


class _JsonLines(logging.Handler):
    def __init__(self, lines: list[dict[str, Any]]) -> None:
        super().__init__()
        self.lines = lines
        self.setFormatter(JsonFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))


@contextlib.contextmanager
def json_log_lines(logger: str = "", level: int = logging.DEBUG) -> Iterator[list[dict[str, Any]]]:
    """Every line `logger` (and the loggers below it) logs at `level` or above inside the block, parsed."""
    lines: list[dict[str, Any]] = []
    handler = _JsonLines(lines)
    target = logging.getLogger(logger)
    old_level = target.level
    target.addHandler(handler)
    target.setLevel(level)
    try:
        yield lines
    finally:
        target.removeHandler(handler)
        target.setLevel(old_level)
