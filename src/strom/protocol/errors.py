"""Kafka error codes, re-exported from kio so every layer names them the same way, and ProtocolError."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

__all__ = ["ErrorCode", "ProtocolError"]


class ProtocolError(Exception):
    """The bytes on a connection are not valid Kafka protocol: the connection is closed."""
