"""Exceptions raised by Strom's client, carrying Kafka's error codes where a broker sent one."""

from __future__ import annotations

from strom.protocol.errors import ErrorCode

__all__ = [
    "CommitFailedError",
    "ConfigException",
    "ErrorCode",
    "KafkaException",
    "KafkaTimeoutError",
    "ProducerFencedError",
    "TransactionAbortableError",
    "TransactionAbortedError",
    "TransactionFatalError",
]


class KafkaException(Exception):
    """A failed client operation; ``error_code`` is the broker's code when it sent one."""

    def __init__(self, message: str, error_code: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.error_code = error_code

    @property
    def retriable(self) -> bool:
        return self.error_code is not None and self.error_code.retriable

    @classmethod
    def from_code(cls, error_code: int, context: str = "", message: str | None = None) -> KafkaException:
        code = ErrorCode(error_code)
        text = f"{context}: " if context else ""
        text += code.name.upper()
        if message:
            text += f" ({message})"
        return cls(text, code)


class KafkaTimeoutError(KafkaException):
    """An operation did not finish in its time bound (``max.block.ms``, ``request.timeout.ms``, ...)."""


class ConfigException(KafkaException):
    """An unknown client config key or an invalid value."""


class CommitFailedError(KafkaException):
    """A consumer's offset commit was refused because the group rebalanced around it."""


class TransactionAbortableError(KafkaException):
    """The ongoing transaction failed: ``abort_transaction()`` it, then the producer can go on."""


class TransactionFatalError(KafkaException):
    """The transactional producer cannot go on (fenced, not authorized, ...): it can only be closed."""


class ProducerFencedError(TransactionFatalError):
    """Another producer with the same ``transactional.id`` (or a newer epoch of it) took over."""


class TransactionAbortedError(KafkaException):
    """A record of a transaction that was aborted before the record was sent."""
