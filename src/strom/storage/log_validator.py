"""LogValidator: the checks a leader applies to a client's record set before it is appended.

As Kafka's LogValidator, every record of every batch is walked (by the C record scanner,
strom.records.scanner): framing, lengths, varints, offset deltas, record count, the codec
and a decompression bounded by the batch's record count and ``max.message.bytes``,
per-record CreateTime timestamps against ``message.timestamp.{before,after}.max.ms``, keys
on compacted topics. Kafka's codes: CORRUPT_MESSAGE for a CRC mismatch, a truncated batch or
a payload that does not decompress (within its bound); MESSAGE_TOO_LARGE for record sets that
together inflate beyond their request's ``DecompressionBudget``; INVALID_RECORD for malformed records
in a CRC-valid batch (Kafka's DefaultRecord throws InvalidRecordException), bad batch
headers, control batches and keyless records on compacted topics; INVALID_TIMESTAMP.

``analyze`` is pure (it reads only its arguments), so a large or compressed record set can be
validated on a worker thread while the event loop goes on (``needs_worker``). It goes batch by
batch: a batch's decompressed records are validated and, if the topic asks, recompressed before
the next batch is decompressed, so memory stays that of one batch, not of the record set.
"""

from __future__ import annotations

from dataclasses import dataclass

from strom.records import batch as rb
from strom.records import scanner
from strom.records.codec import recompress_batch
from strom.records.compression import (
    MAX_DECOMPRESSED_BATCH_BYTES,
    DecompressionLimitError,
    decompression_limit,
)
from strom.storage.append_origin import AppendOrigin
from strom.storage.errors import (
    CorruptRecordError,
    InvalidRecordError,
    InvalidTimestampError,
    RecordTooLargeError,
)
from strom.storage.log_config import LogConfig

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
# An uncompressed record set larger than this is validated on a worker thread too.
WORKER_THRESHOLD_BYTES = 4 * 1024 * 1024
# The most bytes the record sets of one produce request may decompress to, all batches of all its
# partitions together (or a partition's max.message.bytes, if larger): no more than one batch may.
# Each batch stays under its own bound (compression.decompression_limit), but forty of them in one
# 112 KB request inflated to 2.5 GB; this bounds a request's decompression work as its size does.
MAX_DECOMPRESSED_REQUEST_BYTES = MAX_DECOMPRESSED_BATCH_BYTES


class DecompressionBudget:
    """The bytes one produce request's compressed batches have decompressed to so far."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int = MAX_DECOMPRESSED_REQUEST_BYTES) -> None:
        self.limit = limit
        self.used = 0

    def left(self, max_message_bytes: int) -> int:
        return max(0, max(self.limit, max_message_bytes) - self.used)


# compression.type values that ask the broker to (re)compress, mapped to codec ids.
_TARGET_CODECS = {"uncompressed": rb.CompressionType.NONE, **rb.CompressionType.NAMES}
_TARGET_CODECS.pop("none")


def target_codec(config: LogConfig) -> int | None:
    """The codec the topic forces, or None for ``producer`` (keep what the producer sent)."""
    return _TARGET_CODECS.get(config.compression_type)


def parse_batches(records: bytes | bytearray | memoryview, max_message_bytes: int) -> list[rb.BatchHeader]:
    """Split a record set into batch headers, checking framing, magic, size and CRC."""
    headers: list[rb.BatchHeader] = []
    end = len(records)
    if end == 0:
        raise InvalidRecordError("produce request must contain at least one record batch")
    position = 0
    while position < end:
        try:
            header = rb.read_header(records, position)
        except rb.InvalidBatchError as e:
            if e.corrupt:
                raise CorruptRecordError(str(e)) from e
            raise InvalidRecordError(str(e), [(len(headers), str(e))]) from e
        size = header.size
        if size > max_message_bytes:
            raise RecordTooLargeError(
                f"the record batch size is {size} bytes which exceeds the maximum configured value of "
                f"{max_message_bytes}"
            )
        if position + size > end:
            raise CorruptRecordError(f"record batch of {size} bytes at position {position} is truncated")
        if not rb.is_crc_valid(records, header):
            raise CorruptRecordError(f"record is corrupt (stored crc = {header.crc})")
        headers.append(header)
        position += size
    return headers


def validate_client_batches(
    headers: list[rb.BatchHeader], origin: AppendOrigin = AppendOrigin.CLIENT
) -> None:
    """Kafka's per-batch rules for appends coming from clients (LogValidator.validateBatch); a
    coordinator's batches (``origin`` COORDINATOR) carry a producer id without sequences."""
    for index, header in enumerate(headers):
        problem = None
        if header.base_offset != 0:
            problem = f"the base offset of the record batch should be 0, but it is {header.base_offset}"
        elif header.last_offset_delta < 0:
            problem = f"batch has an invalid last offset delta {header.last_offset_delta}"
        elif header.records_count <= 0:
            problem = f"invalid reported count for record batch: {header.records_count}"
        elif header.records_count != header.last_offset_delta + 1:
            problem = (
                f"inconsistent batch offset range ({header.last_offset_delta + 1} offsets) "
                f"and record count ({header.records_count})"
            )
        elif header.is_control:
            problem = "clients are not allowed to write control records"
        elif header.has_producer_id and header.base_sequence < 0 and origin is AppendOrigin.CLIENT:
            problem = f"invalid sequence number {header.base_sequence} for an idempotent producer"
        if problem is not None:
            raise InvalidRecordError(problem, [(index, problem)])
        if header.timestamp_type == rb.TimestampType.LOG_APPEND_TIME:
            message = "Invalid timestamp type in record batch: producers should not set LogAppendTime."
            raise InvalidTimestampError(message, [(0, message)])


@dataclass(frozen=True, slots=True)
class ValidatedRecords:
    """A record set that passed ``analyze``: its bytes (recompressed if the topic asks for it),
    batch headers, and each batch's largest record timestamp."""

    records: bytes | bytearray | memoryview
    headers: list[rb.BatchHeader]
    max_timestamps: list[int]


def needs_worker(records: bytes | bytearray | memoryview, config: LogConfig) -> bool:
    """Whether ``analyze`` may take long enough to belong on a worker thread: a compressed batch
    (its output is bounded but may be tens of MiB), a recompression, or a large record set.
    Reads only the batch headers' framing; a malformed one answers False (it fails fast)."""
    if len(records) > WORKER_THRESHOLD_BYTES:
        return True
    target = target_codec(config)
    view = memoryview(records)
    position = 0
    end = len(view)
    while end - position >= rb.HEADER_SIZE:
        codec = view[position + rb.ATTRIBUTES + 1] & rb.COMPRESSION_MASK
        if codec != rb.CompressionType.NONE or (target is not None and codec != target):
            return True
        size = int.from_bytes(view[position + rb.BATCH_LENGTH : position + rb.MAGIC], "big", signed=True)
        if size < rb.HEADER_SIZE - rb.LOG_OVERHEAD:
            return False
        position += rb.LOG_OVERHEAD + size
    return False


def analyze(
    records: bytes | bytearray | memoryview,
    config: LogConfig,
    now_ms: int,
    topic_partition: str,
    budget: DecompressionBudget | None = None,
    origin: AppendOrigin = AppendOrigin.CLIENT,
) -> ValidatedRecords:
    """Every check of a client's append, and the topic's recompression: raises a StorageError
    carrying Kafka's code, or returns the record set as it is to be appended. ``budget`` is
    shared by the record sets of one request (a fresh one by default)."""
    headers = parse_batches(records, config.max_message_bytes)
    validate_client_batches(headers, origin)
    if budget is None:
        budget = DecompressionBudget()
    check_timestamps = config.message_timestamp_type == "CreateTime"
    earliest = max(_INT64_MIN, now_ms - config.message_timestamp_before_max_ms)
    latest = min(_INT64_MAX, now_ms + config.message_timestamp_after_max_ms)
    target = target_codec(config)
    recompress = target is not None and any(header.compression != target for header in headers)
    parts: list[bytes | bytearray | memoryview] = []
    max_timestamps = []
    for index, header in enumerate(headers):
        batch_limit = decompression_limit(header.records_count, config.max_message_bytes)
        left = budget.left(config.max_message_bytes)
        try:
            payload, start, end = scanner.batch_records(
                records,
                header,
                verify_crc=False,  # parse_batches did
                limit=min(batch_limit, left),
            )
        except rb.InvalidBatchError as e:
            if left < batch_limit and isinstance(e.__cause__, DecompressionLimitError):
                raise RecordTooLargeError(
                    f"record batch {index} would take the request's record sets past {budget.limit} bytes "
                    "decompressed, the most one produce request may inflate to"
                ) from e
            if e.corrupt:
                raise CorruptRecordError(f"record batch {index}: {e}") from e
            raise InvalidRecordError(str(e), [(index, str(e))]) from e
        if header.compression != rb.CompressionType.NONE:
            budget.used += end - start
        try:
            max_timestamp, keyless, out_of_range = scanner.validate(
                payload, start, end, header, earliest, latest, check_timestamps, config.compact
            )
        except scanner.RecordError as e:
            raise InvalidRecordError(f"record batch {index} is malformed: {e}") from e
        if keyless:
            _reject_keyless(keyless, topic_partition)
        if out_of_range:
            _reject_timestamps(out_of_range, header, earliest, latest)
        max_timestamps.append(max_timestamp)
        if recompress:
            assert target is not None
            parts.append(_recompress(records, header, target, (payload, start, end), config))
        del payload  # before the next batch is decompressed
    if recompress:
        records = b"".join(parts)
        headers = list(rb.iter_headers(records))
    return ValidatedRecords(records, headers, max_timestamps)


def _reject_keyless(keyless: list[int], topic_partition: str) -> None:
    """Kafka's rule for compacted topics: every record needs a key (LogValidator.validateKey).

    As in Kafka, the first batch with keyless records fails the append with INVALID_RECORD
    and one record error per keyless record, indexed by its position in that batch.
    """
    message = f"Compacted topic cannot accept message without key in topic partition {topic_partition}."
    errors = [(index, message) for index in keyless]
    shown = ", ".join(f"RecordError(batchIndex={i}, message='{m}')" for i, m in errors[:3])
    raise InvalidRecordError(
        f"One or more records have been rejected due to {len(errors)} record errors in total, "
        f"and only showing the first three errors at most: [{shown}]",
        errors,
    )


def _reject_timestamps(out_of_range: list[int], header: rb.BatchHeader, earliest: int, latest: int) -> None:
    """Kafka's LogValidator.validateTimestamp, CreateTime: one record error per record out of range."""
    errors = [
        (
            index,
            f"Timestamp of message with offset delta {index} is out of range. The timestamp should be "
            f"within [{earliest}, {latest}] (message.timestamp.before/after.max.ms)",
        )
        for index in out_of_range
    ]
    raise InvalidTimestampError("One or more records have been rejected due to invalid timestamp", errors)


def _recompress(
    records: bytes | bytearray | memoryview,
    header: rb.BatchHeader,
    codec: int,
    payload: tuple[scanner.BytesLike, int, int],
    config: LogConfig,
) -> bytes | bytearray | memoryview:
    """One batch in the topic's codec (its records already decompressed: ``payload``); Kafka's
    MESSAGE_TOO_LARGE if the recompressed batch exceeds max.message.bytes."""
    try:
        batch = recompress_batch(records, header, codec, level=config.compression_level, payload=payload)
    except rb.InvalidBatchError as e:
        raise CorruptRecordError(f"cannot recompress record batch: {e}") from e
    if len(batch) > config.max_message_bytes:
        raise RecordTooLargeError(
            f"the recompressed record batch size is {len(batch)} bytes which exceeds the maximum "
            f"configured value of {config.max_message_bytes}"
        )
    return batch
