"""Structured, quiet logging: one line per event, ``key=value`` context after the message."""

from __future__ import annotations

import logging
import sys
import time

# Attributes every LogRecord has; anything else came in through ``extra=`` and is context.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        context = " ".join(f"{k}={v}" for k, v in record.__dict__.items() if k not in _STANDARD)
        line = f"{ts}.{int(record.msecs):03d}Z {record.levelname:<7} {record.name}: {record.getMessage()}"
        if context:
            line += f" {context}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
