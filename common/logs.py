"""Structured logging for both programs: one JSON object per line, with the Kubernetes objects involved.

Call sites pass context as `extra={"pod": ..., "namespace": ..., "node": ..., "bindrequest": ...}`; those
keys become top-level fields so log pipelines can filter on them.
"""

from __future__ import annotations

import json
import logging
import sys
import time

CONTEXT_FIELDS = ("namespace", "pod", "node", "bindrequest", "plugin", "webhook", "uid", "operation")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
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


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        context = " ".join(
            f"{field}={getattr(record, field)}" for field in CONTEXT_FIELDS if getattr(record, field, None)
        )
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
