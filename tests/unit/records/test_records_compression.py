from __future__ import annotations

import os
import struct

import cramjam
import pytest

from strom.records.batch import CompressionType
from strom.records.compression import (
    XERIAL_MAGIC,
    CompressionError,
    compress,
    decompress,
)

CODECS = [CompressionType.GZIP, CompressionType.SNAPPY, CompressionType.LZ4, CompressionType.ZSTD]
# Compressible, and larger than one 64 KiB lz4 block.
TEXT = b"".join(b"record %d: the quick brown fox jumps over the lazy dog\n" % i for i in range(5000))


def xerial(data: bytes, chunk_size: int) -> bytes:
    """xerial framing as the Java client and kafka-python write it."""
    parts = [XERIAL_MAGIC, struct.pack(">ii", 1, 1)]
    for start in range(0, len(data), chunk_size):
        chunk = bytes(cramjam.snappy.compress_raw(data[start : start + chunk_size]))
        parts += [struct.pack(">i", len(chunk)), chunk]
    return b"".join(parts)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize(
    "data", [b"", b"x", TEXT, os.urandom(70_000)], ids=["empty", "one", "text", "random"]
)
def test_round_trip(codec: int, data: bytes) -> None:
    compressed = compress(codec, data)
    assert isinstance(compressed, bytes)
    assert decompress(codec, compressed) == data


@pytest.mark.parametrize("codec", CODECS)
def test_accepts_bytearray_and_memoryview(codec: int) -> None:
    compressed = compress(codec, memoryview(bytearray(TEXT))[10:])
    assert len(compressed) < len(TEXT) // 2
    assert decompress(codec, memoryview(b"pad" + compressed)[3:]) == TEXT[10:]
    assert decompress(codec, bytearray(compressed)) == TEXT[10:]


def test_none_is_identity() -> None:
    assert compress(CompressionType.NONE, bytearray(b"abc")) == b"abc"
    assert decompress(CompressionType.NONE, memoryview(b"abc")) == b"abc"


def test_snappy_writes_raw_snappy() -> None:
    compressed = compress(CompressionType.SNAPPY, TEXT)
    assert not compressed.startswith(XERIAL_MAGIC)
    # Not Google's framing format (stream identifier chunk) either.
    assert not compressed.startswith(b"\xff\x06\x00\x00sNaPpY")
    assert bytes(cramjam.snappy.decompress_raw(compressed)) == TEXT


@pytest.mark.parametrize("chunk_size", [32 * 1024, 1000, 10**9])
def test_snappy_reads_xerial_framing(chunk_size: int) -> None:
    assert decompress(CompressionType.SNAPPY, xerial(TEXT, chunk_size)) == TEXT


def test_snappy_xerial_with_little_endian_versions() -> None:
    # Some producers write the version fields little-endian; the chunks are what matter.
    framed = xerial(TEXT, 32 * 1024)
    framed = XERIAL_MAGIC + struct.pack("<ii", 1, 1) + framed[16:]
    assert decompress(CompressionType.SNAPPY, framed) == TEXT


@pytest.mark.parametrize(
    "mangle",
    [
        lambda framed: framed[:-3],  # chunk cut short
        lambda framed: framed[:16] + b"\x00\x00",  # truncated chunk length
        lambda framed: framed[:16] + struct.pack(">i", -5) + framed[20:],  # negative chunk length
        lambda framed: framed[:20] + b"\xff" * 10 + framed[30:],  # garbage in a chunk
    ],
    ids=["cut", "short-length", "negative-length", "garbage"],
)
def test_snappy_bad_xerial(mangle: object) -> None:
    framed = xerial(TEXT, 32 * 1024)
    with pytest.raises(CompressionError):
        decompress(CompressionType.SNAPPY, mangle(framed))  # type: ignore[operator]


def test_lz4_writes_independent_blocks() -> None:
    compressed = compress(CompressionType.LZ4, TEXT)
    assert compressed[:4] == b"\x04\x22\x4d\x18"  # LZ4 frame magic (little-endian 0x184D2204)
    flg = compressed[4]
    assert flg >> 6 == 1  # frame version 01
    # Kafka's Java reader rejects frames without block independence.
    assert flg & 0x20
    assert flg & 0x03 == 0  # reserved bits, dictionary id
    assert compressed[5] & 0x8F == 0  # BD reserved bits
    assert 4 <= (compressed[5] >> 4) & 0x07 <= 7  # a block size Kafka's reader accepts


def test_lz4_reads_linked_block_frames() -> None:
    # librdkafka and python-lz4 may write linked blocks; cramjam's one-shot compress does.
    linked = bytes(cramjam.lz4.compress(TEXT))
    assert not linked[4] & 0x20
    assert decompress(CompressionType.LZ4, linked) == TEXT


@pytest.mark.parametrize("codec", [CompressionType.GZIP, CompressionType.LZ4, CompressionType.ZSTD])
@pytest.mark.parametrize("level", [1, 9])
def test_levels(codec: int, level: int) -> None:
    assert decompress(codec, compress(codec, TEXT, level)) == TEXT


def test_zstd_reads_concatenated_frames_and_streamed_frames() -> None:
    streamed = cramjam.zstd.Compressor(level=3)
    streamed.compress(TEXT)
    payload = bytes(streamed.finish()) + compress(CompressionType.ZSTD, b"tail")
    assert decompress(CompressionType.ZSTD, payload) == TEXT + b"tail"


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("garbage", [b"", b"\x07", b"garbage input, not compressed at all", b"\xff" * 64])
def test_garbage_raises_compression_error(codec: int, garbage: bytes) -> None:
    with pytest.raises(CompressionError) as caught:
        decompress(codec, garbage)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("codec", CODECS)
def test_truncated_payload_raises(codec: int) -> None:
    compressed = compress(codec, TEXT)
    with pytest.raises(CompressionError):
        decompress(codec, compressed[: len(compressed) // 2])


@pytest.mark.parametrize("codec", [5, 6, 7, -1])
def test_unknown_codec(codec: int) -> None:
    with pytest.raises(CompressionError, match="unknown compression codec"):
        compress(codec, b"data")
    with pytest.raises(CompressionError, match="unknown compression codec"):
        decompress(codec, b"data")
