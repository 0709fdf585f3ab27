"""Batch payload compression for the four codecs of record batch v2, via cramjam.

Wire formats, as Kafka's clients write them:

- gzip (1): a gzip stream (RFC 1952).
- snappy (2): librdkafka writes raw snappy; the Java client and kafka-python write
  xerial framing (``\\x82SNAPPY\\x00``, int32 version, int32 compatible version,
  then [int32 length][raw snappy chunk]...). We read both and write raw snappy, which
  every client reads (xerial's Java reader falls back to raw snappy without its magic).
  cramjam's plain ``snappy.compress`` is Google's framing format: Kafka never uses it.
- lz4 (3): the LZ4 frame format with independent blocks; Kafka's Java reader rejects
  linked blocks, and cramjam's one-shot ``lz4.compress`` links them.
- zstd (4): zstd frames.
"""

from __future__ import annotations

import struct
from typing import Any

import cramjam

from strom.records.batch import CompressionType

XERIAL_MAGIC = b"\x82SNAPPY\x00"
# magic + int32 version + int32 compatible version
XERIAL_HEADER_SIZE = 16
_INT32 = struct.Struct(">i")

# Kafka's defaults (KIP-390) for gzip and zstd; lz4 uses lz4's fast mode (librdkafka's
# default) rather than Kafka's HC level 9, which costs ~20x the CPU for a few percent.
DEFAULT_LEVELS = {CompressionType.GZIP: 6, CompressionType.LZ4: 0, CompressionType.ZSTD: 3}

BytesLike = bytes | bytearray | memoryview

# The most bytes one batch's payload may decompress to, whatever its headers or frames
# claim: a decompression bomb stops here (see decompression_limit).
MAX_DECOMPRESSED_BATCH_BYTES = 64 * 1024 * 1024


class CompressionError(ValueError):
    """An unknown codec, or a payload its codec cannot decompress."""


class DecompressionLimitError(CompressionError):
    """A payload that would decompress to more than the limit it was given."""


def compress(codec: int, data: BytesLike, level: int | None = None) -> bytes:
    """Compress a batch payload with ``codec`` (a CompressionType value).

    ``level`` applies to gzip, lz4 and zstd; snappy has none. NONE returns the data as bytes.
    """
    if codec == CompressionType.NONE:
        return bytes(data)
    return bytes(compress_to_buffer(codec, data, level))


def decompress(codec: int, data: BytesLike, limit: int = MAX_DECOMPRESSED_BATCH_BYTES) -> bytes:
    """Decompress a batch payload written with ``codec``; raises CompressionError on garbage
    or when it would exceed ``limit`` bytes."""
    if codec == CompressionType.NONE:
        return bytes(data)
    return bytes(decompress_to_buffer(codec, data, limit))


def decompression_limit(records_count: int, max_message_bytes: int | None = None) -> int:
    """The most bytes a batch of ``records_count`` records may decompress to.

    No record may be larger than ``max.message.bytes`` uncompressed (it would have been
    refused had it been sent uncompressed), and no batch more than
    MAX_DECOMPRESSED_BATCH_BYTES (or ``max.message.bytes`` if that is larger). Readers of
    stored batches pass no ``max_message_bytes`` and get the cap.
    """
    if max_message_bytes is None:
        return MAX_DECOMPRESSED_BATCH_BYTES
    cap = max(MAX_DECOMPRESSED_BATCH_BYTES, max_message_bytes)
    return min(cap, max(records_count, 1) * max_message_bytes)


def compress_to_buffer(codec: int, data: BytesLike, level: int | None = None) -> Any:
    """Like compress() but returns cramjam's buffer (buffer protocol), saving a copy."""
    if level is None:
        level = DEFAULT_LEVELS.get(codec)
    try:
        if codec == CompressionType.GZIP:
            return cramjam.gzip.compress(data, level=level)
        if codec == CompressionType.SNAPPY:
            return cramjam.snappy.compress_raw(data)
        if codec == CompressionType.LZ4:
            compressor = cramjam.lz4.Compressor(level=level, content_checksum=False, block_linked=False)
            # The streaming compressor takes only bytes.
            compressor.compress(data if isinstance(data, bytes) else bytes(data))
            return compressor.finish()
        if codec == CompressionType.ZSTD:
            return cramjam.zstd.compress(data, level=level)
    except (cramjam.CompressionError, ValueError, TypeError, OverflowError) as error:
        raise CompressionError(f"cannot compress with {_name(codec)}: {error}") from error
    raise CompressionError(f"unknown compression codec {codec}")


def decompress_to_buffer(codec: int, data: BytesLike, limit: int = MAX_DECOMPRESSED_BATCH_BYTES) -> Any:
    """Like decompress() but returns a buffer-protocol object (a bytearray), saving a copy.

    Output never exceeds ``limit``: gzip, lz4 and zstd decompress into a buffer that grows
    up to the limit (cramjam stops at a full buffer instead of inflating the
    rest; a declared size sets the first buffer), snappy's declared lengths are checked against it before anything is allocated.
    """
    try:
        if codec == CompressionType.SNAPPY:
            if len(data) >= XERIAL_HEADER_SIZE and data[:8] == XERIAL_MAGIC:
                return _decompress_xerial(memoryview(data), limit)
            return _decompress_raw_snappy(data, limit)
        if codec in (CompressionType.GZIP, CompressionType.LZ4, CompressionType.ZSTD):
            return _decompress_growing(codec, data, limit)
    except (cramjam.DecompressionError, ValueError, TypeError, OverflowError) as error:
        if isinstance(error, CompressionError):
            raise
        raise CompressionError(f"cannot decompress {_name(codec)} payload: {error}") from error
    raise CompressionError(f"unknown compression codec {codec}")


# The first output buffer is this many times the compressed size (at least _MIN_GUESS, or the
# size the payload declares); a full one is replaced by one _GROWTH times larger.
_FIRST_GUESS_RATIO = 8
_GROWTH = 4
_MIN_GUESS = 64 * 1024
_FULL_BUFFER = "failed to write whole buffer"


def _decompress_growing(codec: int, data: BytesLike, limit: int) -> bytearray:
    module = _MODULES[codec]
    size = min(limit, max(_MIN_GUESS, len(data) * _FIRST_GUESS_RATIO, _claimed_size(codec, data)))
    while True:
        out = bytearray(size)
        try:
            written: int = module.decompress_into(data, out)
        except cramjam.DecompressionError as error:
            if _FULL_BUFFER not in str(error):
                raise
            written = size + 1
        if written >= size and size < limit:
            # Full (or filled exactly, which may have held only the payload's start): try a
            # larger buffer, freeing this one first so that peak memory stays ~ the limit.
            del out
            size = min(limit, size * _GROWTH)
            continue
        if written > size:
            raise DecompressionLimitError(
                f"{_name(codec)} payload decompresses to more than {limit} bytes, the limit for its batch"
            )
        del out[written:]
        return out


def _claimed_size(codec: int, data: BytesLike) -> int:
    """The uncompressed size a payload declares, when its format says (gzip's ISIZE, mod 2^32;
    a zstd frame's content size): a first guess only, never trusted beyond the limit."""
    if codec == CompressionType.GZIP and len(data) >= 18:
        return int.from_bytes(bytes(data[-4:]), "little")
    if codec == CompressionType.ZSTD and len(data) >= 6 and bytes(data[:4]) == _ZSTD_MAGIC:
        descriptor = data[4]
        single_segment = (descriptor >> 5) & 1
        size_bytes = (1 if single_segment else 0, 2, 4, 8)[descriptor >> 6]
        at = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 3]
        if size_bytes and len(data) >= at + size_bytes:
            size = int.from_bytes(bytes(data[at : at + size_bytes]), "little")
            return size + 256 if size_bytes == 2 else size
    return 0


_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _decompress_raw_snappy(data: BytesLike, limit: int) -> bytearray:
    claimed = cramjam.snappy.decompress_raw_len(data)
    if claimed > limit:
        raise DecompressionLimitError(
            f"snappy payload declares {claimed} bytes, more than the limit of {limit}"
        )
    out = bytearray(claimed)
    written = cramjam.snappy.decompress_raw_into(data, out)
    del out[written:]
    return out


def _decompress_xerial(data: memoryview, limit: int) -> bytearray:
    # The version fields are not checked: some producers write them little-endian,
    # and there has only ever been one xerial block layout.
    chunks: list[memoryview] = []
    total = 0
    position = XERIAL_HEADER_SIZE
    end = len(data)
    while position < end:
        if end - position < 4:
            raise CompressionError("xerial snappy: truncated chunk length")
        (length,) = _INT32.unpack_from(data, position)
        position += 4
        if length < 0 or length > end - position:
            raise CompressionError(f"xerial snappy: chunk length {length} runs past the payload")
        chunk = data[position : position + length]
        position += length
        chunks.append(chunk)
        total += cramjam.snappy.decompress_raw_len(chunk)
        # Checked before anything is allocated: the lengths are the sender's claims.
        if total > limit:
            raise DecompressionLimitError(
                f"xerial snappy chunks declare more than the limit of {limit} bytes"
            )
    # Decompress every chunk straight into one buffer.
    out = bytearray(total)
    view = memoryview(out)
    written = 0
    for chunk in chunks:
        written += cramjam.snappy.decompress_raw_into(chunk, view[written:])
    if written != total:
        raise CompressionError("xerial snappy: chunks decompressed to fewer bytes than they declare")
    return out


_MODULES: dict[int, Any] = {
    CompressionType.GZIP: cramjam.gzip,
    CompressionType.LZ4: cramjam.lz4,
    CompressionType.ZSTD: cramjam.zstd,
}


def _name(codec: int) -> str:
    for name, value in CompressionType.NAMES.items():
        if value == codec:
            return name
    return f"codec {codec}"
