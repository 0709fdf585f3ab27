"""compression.{gzip,lz4,zstd}.level (KIP-390) set the level of the broker's recompression."""

from __future__ import annotations

from pathlib import Path

import pytest

from strom.records.batch import HEADER_SIZE, CompressionType, read_header
from strom.records.compression import compress, decompress
from strom.storage import LogConfig, UnifiedLog
from unit.storage.storage_batches import make_batch

CASES = [
    # (topic compression.type, LogConfig level field, configured level, a level giving other bytes)
    ("gzip", "compression_gzip_level", 1, 9),
    ("gzip", "compression_gzip_level", -1, 1),  # -1: zlib's default (6)
    ("lz4", "compression_lz4_level", 1, 9),
    ("lz4", "compression_lz4_level", 9, 1),  # Kafka's default: LZ4 HC
    ("zstd", "compression_zstd_level", 19, 1),
    ("zstd", "compression_zstd_level", -5, 3),
]


@pytest.mark.parametrize(("codec_name", "field", "level", "other"), CASES)
def test_recompression_uses_the_topic_level(
    tmp_path: Path, codec_name: str, field: str, level: int, other: int
) -> None:
    config = LogConfig(compression_type=codec_name, **{field: level})
    log = UnifiedLog.open(tmp_path / "t-0", config)
    log.append_as_leader(make_batch(count=50, value_size=300), 0)
    stored = log.read(0, 1 << 20).records
    header = read_header(stored)
    codec = CompressionType.NAMES[codec_name]
    assert header.compression == codec
    body = bytes(stored[HEADER_SIZE : header.size])
    raw = decompress(codec, body)
    expected_level = None if level == -1 else level
    assert body == compress(codec, raw, expected_level)
    assert compress(codec, raw, other) != body  # the check can tell the levels apart
