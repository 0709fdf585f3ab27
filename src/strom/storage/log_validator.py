"""LogValidator: the checks a leader applies to a client's record set before it is appended.

Everything is decided from the 61-byte batch headers and one CRC-32C pass per
batch; records are decoded only for compacted topics, whose records must have keys.
"""

from __future__ import annotations

from strom.records import batch as rb
from strom.records.codec import decode_batch
from strom.storage.errors import (
    CorruptRecordError,
    InvalidRecordError,
    InvalidTimestampError,
    RecordTooLargeError,
)
from strom.storage.log_config import LogConfig

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


def validate_client_batches(headers: list[rb.BatchHeader], config: LogConfig, now_ms: int) -> None:
    """Kafka's per-batch rules for appends coming from clients (LogValidator.validateBatch)."""
    check_timestamps = config.message_timestamp_type == "CreateTime"
    earliest = now_ms - config.message_timestamp_before_max_ms
    latest = now_ms + config.message_timestamp_after_max_ms
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
        elif header.has_producer_id and header.base_sequence < 0:
            problem = f"invalid sequence number {header.base_sequence} for an idempotent producer"
        if problem is not None:
            raise InvalidRecordError(problem, [(index, problem)])
        if check_timestamps:
            for timestamp in (header.base_timestamp, header.max_timestamp):
                if timestamp != rb.NO_TIMESTAMP and not earliest <= timestamp <= latest:
                    message = (
                        f"timestamp {timestamp} of a record is out of range: it must be within "
                        f"[{earliest}, {latest}] (message.timestamp.before/after.max.ms)"
                    )
                    raise InvalidTimestampError(message, [(index, message)])


def validate_record_keys(
    records: bytes | bytearray | memoryview, headers: list[rb.BatchHeader], topic_partition: str
) -> None:
    """Kafka's rule for compacted topics: every record needs a key (LogValidator.validateKey).

    As in Kafka, the first batch with keyless records fails the append with INVALID_RECORD
    and one record error per keyless record, indexed by its position in that batch.
    """
    message = f"Compacted topic cannot accept message without key in topic partition {topic_partition}."
    for header in headers:
        try:
            batch = decode_batch(records, header.position, verify_crc=False)
        except rb.InvalidBatchError as e:
            raise CorruptRecordError(f"record batch at position {header.position} is malformed: {e}") from e
        errors = [(index, message) for index, record in enumerate(batch.records) if record.key is None]
        if errors:
            shown = ", ".join(f"RecordError(batchIndex={i}, message='{m}')" for i, m in errors[:3])
            raise InvalidRecordError(
                f"One or more records have been rejected due to {len(errors)} record errors in total, "
                f"and only showing the first three errors at most: [{shown}]",
                errors,
            )
