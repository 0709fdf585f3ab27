"""Strom's codec against kafka-python's DefaultRecordBatch reader and builder.

kafka-python 3.0.12 compresses through python-snappy, lz4 and zstandard, which are not
Strom dependencies. The fixture plugs cramjam into its codec module instead: for snappy
only the raw block functions are replaced, so kafka-python's own xerial framing code
writes and reads the payload; for lz4 and zstd whole encode/decode functions are.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import cramjam
import kafka.codec
import kafka.record.default_records as kafka_records
import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from strom.records.batch import CompressionType, TimestampType, is_crc_valid, read_header
from strom.records.codec import Record, RecordSpec, decode_batch, encode_batch, recompress_batches
from strom.records.compression import XERIAL_MAGIC
from strom.records.control import ControlRecordType, build_control_batch

ALL_CODECS = [
    CompressionType.NONE,
    CompressionType.GZIP,
    CompressionType.SNAPPY,
    CompressionType.LZ4,
    CompressionType.ZSTD,
]


class _RawSnappy:
    """The two python-snappy functions kafka.codec calls, on cramjam's raw snappy."""

    @staticmethod
    def compress(data: bytes) -> bytes:
        return bytes(cramjam.snappy.compress_raw(data))

    @staticmethod
    def decompress(data: bytes) -> bytes:
        return bytes(cramjam.snappy.decompress_raw(data))


def _lz4_encode(data: bytes) -> bytes:
    # python-lz4's frame.compress(block_linked=False), as kafka-python calls it.
    compressor = cramjam.lz4.Compressor(content_checksum=False, block_linked=False)
    compressor.compress(bytes(data))
    return bytes(compressor.finish())


@pytest.fixture(autouse=True)
def kafka_python_codecs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(kafka.codec, "snappy", _RawSnappy)
    monkeypatch.setattr(kafka.codec, "has_lz4", lambda: True)
    monkeypatch.setattr(kafka.codec, "has_zstd", lambda: True)
    monkeypatch.setattr(kafka_records, "lz4_encode", _lz4_encode)
    monkeypatch.setattr(kafka_records, "lz4_decode", lambda data: bytes(cramjam.lz4.decompress(data)))
    monkeypatch.setattr(kafka_records, "zstd_encode", lambda data: bytes(cramjam.zstd.compress(data)))
    monkeypatch.setattr(kafka_records, "zstd_decode", lambda data: bytes(cramjam.zstd.decompress(data)))
    yield


ROWS: list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]] = [
    (1_700_000_000_000, b"key-a", b"value " * 50, []),
    (1_700_000_000_007, None, b"value " * 60, [("h1", b"x"), ("h2", None)]),
    (1_699_999_999_000, b"key-c", None, [("ünï", b"y" * 200)]),
    (1_700_000_000_003, None, None, []),
]


def kafka_python_batch(
    codec: int, *, producer: tuple[int, int, int] | None = None, transactional: bool = False
) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    if producer is not None:
        builder.set_producer_state(*producer, transactional)
    for offset, (timestamp, key, value, headers) in enumerate(ROWS * 25):
        builder.append(offset, timestamp, key, value, headers)
    return bytes(builder.build())


def kafka_python_records(buf: bytes) -> tuple[DefaultRecordBatch, list[Any]]:
    batch = DefaultRecordBatch(buf)
    assert batch.validate_crc()
    return batch, list(batch)


@pytest.mark.parametrize("codec", ALL_CODECS)
def test_strom_reads_kafka_python(codec: int) -> None:
    buf = kafka_python_batch(codec, producer=(555, 2, 40), transactional=True)
    decoded = decode_batch(buf)
    header = decoded.header
    assert header.compression == codec  # the payload compressed enough that kafka-python kept the codec
    assert is_crc_valid(buf, header)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (555, 2, 40)
    assert header.is_transactional and not header.is_control
    assert header.max_timestamp == 1_700_000_000_007
    expected = [
        Record(offset, timestamp, key, value, tuple(headers))
        for offset, (timestamp, key, value, headers) in enumerate(ROWS * 25)
    ]
    assert decoded.records == expected


def test_kafka_python_snappy_is_xerial_framed() -> None:
    buf = kafka_python_batch(CompressionType.SNAPPY)
    assert buf[61:69] == XERIAL_MAGIC
    assert len(decode_batch(buf).records) == len(ROWS) * 25


@pytest.mark.parametrize("codec", ALL_CODECS)
def test_kafka_python_reads_strom(codec: int) -> None:
    specs = [
        RecordSpec(key, value, tuple(headers), timestamp) for timestamp, key, value, headers in ROWS * 25
    ]
    buf = encode_batch(
        specs,
        base_offset=1000,
        compression=codec,
        producer_id=77,
        producer_epoch=1,
        base_sequence=5,
        partition_leader_epoch=3,
    )
    batch, records = kafka_python_records(buf)
    assert batch.compression_type == codec
    assert (batch.base_offset, batch.last_offset, batch.leader_epoch) == (1000, 1099, 3)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (77, 1, 5)
    assert batch.first_timestamp == 1_700_000_000_000
    assert batch.max_timestamp == 1_700_000_000_007
    assert [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in records] == [
        (1000 + i, timestamp, key, value, headers)
        for i, (timestamp, key, value, headers) in enumerate(ROWS * 25)
    ]


def test_kafka_python_reads_log_append_time() -> None:
    specs = [RecordSpec(key, value, tuple(headers), timestamp) for timestamp, key, value, headers in ROWS]
    buf = encode_batch(specs, timestamp_type=TimestampType.LOG_APPEND_TIME)
    _, records = kafka_python_records(buf)
    assert {r.timestamp for r in records} == {1_700_000_000_007}
    assert {r.timestamp_type for r in records} == {TimestampType.LOG_APPEND_TIME}


@pytest.mark.parametrize("marker", [ControlRecordType.ABORT, ControlRecordType.COMMIT])
def test_kafka_python_reads_control_batches(marker: ControlRecordType) -> None:
    buf = build_control_batch(marker, producer_id=9, producer_epoch=2, coordinator_epoch=4, base_offset=30)
    batch, [record] = kafka_python_records(buf)
    assert batch.is_control_batch and batch.is_transactional
    assert record.offset == 30
    assert record.type == marker
    assert record.abort == (marker == ControlRecordType.ABORT)


@pytest.mark.parametrize("source", ALL_CODECS)
@pytest.mark.parametrize("target", ALL_CODECS)
def test_kafka_python_reads_recompressed(source: int, target: int) -> None:
    original = kafka_python_batch(source, producer=(1, 0, 0))
    recompressed = recompress_batches(original, target)
    batch, records = kafka_python_records(recompressed)
    assert batch.compression_type == target
    assert read_header(recompressed).compression == target
    _, original_records = kafka_python_records(original)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in records] == [
        (r.offset, r.timestamp, r.key, r.value, r.headers) for r in original_records
    ]
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (1, 0, 0)
