"""Kafka error codes, re-exported from kio so every layer names them the same way."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

__all__ = ["ErrorCode"]
