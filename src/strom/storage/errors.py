"""Storage exceptions, each carrying the Kafka error code the broker returns for it."""

from __future__ import annotations


class StorageError(Exception):
    """Base of the storage errors; ``error_code`` is Kafka's numeric error code."""

    error_code: int = -1  # UNKNOWN_SERVER_ERROR

    def __init__(self, message: str, record_errors: list[tuple[int, str]] | None = None) -> None:
        super().__init__(message)
        self.message = message
        # (batch index, message) pairs for the Produce response's per-record errors.
        self.record_errors = record_errors or []


class OffsetOutOfRangeError(StorageError):
    error_code = 1


class CorruptRecordError(StorageError):
    """CORRUPT_MESSAGE: a CRC mismatch or a truncated batch."""

    error_code = 2


class RecordTooLargeError(StorageError):
    """MESSAGE_TOO_LARGE: a batch larger than max.message.bytes."""

    error_code = 10


class InvalidTimestampError(StorageError):
    error_code = 32


class OutOfOrderSequenceError(StorageError):
    error_code = 45


class InvalidProducerEpochError(StorageError):
    error_code = 47


class InvalidTxnStateError(StorageError):
    """INVALID_TXN_STATE: a producer's batch does not fit its transaction (a non-transactional
    batch inside one, or one of another epoch)."""

    error_code = 48


class TransactionCoordinatorFencedError(StorageError):
    """TRANSACTION_COORDINATOR_FENCED: a marker from a coordinator older than the one that last
    wrote a marker for the producer (a zombie coordinator)."""

    error_code = 52


class KafkaStorageError(StorageError):
    """KAFKA_STORAGE_ERROR: the disk failed under a log (I/O error)."""

    error_code = 56


class UnknownProducerIdError(StorageError):
    error_code = 59


class InvalidRecordError(StorageError):
    """INVALID_RECORD; ``record_errors`` are (batch index, message) pairs for the response."""

    error_code = 87
