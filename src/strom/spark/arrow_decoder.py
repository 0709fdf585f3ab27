"""Fetched record batches to an Arrow record batch, column by column.

Decoding record by record into Python objects costs about a microsecond per record, more
than the rest of a Spark read. Here only the walk from one record to the next is a
Python loop (each record's length varint says where the next begins); every field after
it is decoded for all records at once with numpy: the varints of each field as a few
vector operations, keys and values described as Arrow binary views over the fetched bytes
and copied once into Arrow's contiguous binary layout.
Headers are decoded per record, and only when the source includes them.

Every batch is first walked by the record scanner (strom.records.scanner, in C), so this
decoder rejects exactly what the consumer's own decoder rejects, with InvalidBatchError
(tests/unit/spark/test_arrow_decoder_differential.py holds the two to each other).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from strom.records import scanner
from strom.records.batch import InvalidBatchError
from strom.records.reader import FetchedBatch, read_headers
from strom.records.varint import MAX_VARLONG_BYTES, VarintError, read_varint

Int64s = npt.NDArray[np.int64]

# The most batch payload decoded into one Arrow batch (binary views use int32 offsets).
MAX_PAYLOAD = 1 << 30


def decode_batches(
    batches: Sequence[FetchedBatch],
    schema: pa.Schema,
    topic: str,
    partition: int,
    until_offset: int,
    include_headers: bool,
) -> pa.RecordBatch:
    """The records of ``batches`` below ``until_offset`` (and at or above each batch's
    ``min_offset``) as a record batch of the source schema.

    Their payloads together must stay below 2 GiB (binary views address them with int32
    offsets); ``read_range`` hands over at most MAX_PAYLOAD bytes' worth at a time.
    """
    for b in batches:
        try:
            scanner.check(b.payload, b.position, b.limit, b.count, b.last_offset_delta)
        except scanner.RecordError as error:
            raise InvalidBatchError(f"malformed record in batch at offset {b.base_offset}: {error}", corrupt=True) from error
    payload = b"".join(memoryview(b.payload)[b.position : b.limit] for b in batches)
    body_starts, ends = _walk(payload, batches)
    counts = [b.count for b in batches]
    buf = np.frombuffer(payload, np.uint8)
    position = body_starts + 1  # past the attributes byte (unused)
    try:
        timestamp_delta, position = _varints(buf, position, ends)
        offset_delta, position = _varints(buf, position, ends)
        key_length, position = _varints(buf, position, ends)
        key_start = position
        position = position + np.maximum(key_length, 0)
        value_length, position = _varints(buf, position, ends)
        value_start = position
        header_count_start = position + np.maximum(value_length, 0)
        header_count, header_start = _varints(buf, header_count_start, ends)
    except IndexError as error:
        raise InvalidBatchError("a record runs past its batch", corrupt=True) from error
    if (key_length < -1).any() or (value_length < -1).any() or (header_count < 0).any():
        raise InvalidBatchError("invalid key, value or header count in a record", corrupt=True)
    without_headers = header_count == 0
    if (without_headers & (header_start != ends)).any():
        raise InvalidBatchError("a record's fields do not add up to its length", corrupt=True)

    offsets = np.repeat(np.array([b.base_offset for b in batches], np.int64), counts) + offset_delta
    log_append = np.repeat(np.array([b.timestamp_type for b in batches], np.int64), counts)
    timestamps = np.repeat(np.array([b.base_timestamp for b in batches], np.int64), counts)
    timestamps += np.where(log_append == 1, 0, timestamp_delta)
    keep = (offsets < until_offset) & (offsets >= np.repeat(np.array([b.min_offset for b in batches]), counts))
    selected: npt.NDArray[np.intp] | None = None if keep.all() else np.flatnonzero(keep)

    def pick(values: Int64s) -> Int64s:
        return values if selected is None else values[selected]

    count = int(keep.sum())
    columns = [
        _binary(payload, buf, pick(key_start), pick(key_length)),
        _binary(payload, buf, pick(value_start), pick(value_length)),
        pa.repeat(pa.scalar(topic, pa.string()), count),
        pa.repeat(pa.scalar(partition, pa.int32()), count),
        pa.array(pick(offsets), pa.int64()),
        pa.array(pick(timestamps) * 1000, pa.int64()).cast(schema.field("timestamp").type),
        pa.array(pick(log_append).astype(np.int32), pa.int32()),
    ]
    if include_headers:
        columns.append(
            _headers(payload, pick(header_count), pick(header_count_start), pick(ends), schema.field("headers").type)
        )
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _walk(payload: bytes, batches: Sequence[FetchedBatch]) -> tuple[Int64s, Int64s]:
    """Where each record's body starts and ends: the only per-record Python loop.

    The loop only hops from length to length; the lengths are decoded again with numpy to
    check that each is sane and that the hops end exactly at each batch's end.
    """
    starts: list[int] = []
    batch_ends: list[int] = []
    add = starts.append
    position = end = 0
    try:
        for batch in batches:
            end += batch.limit - batch.position
            for _ in range(batch.count):
                add(position)
                byte = payload[position]
                if byte < 0x80:
                    position += 1 + ((byte >> 1) ^ -(byte & 1))
                elif payload[position + 1] < 0x80:
                    length = (byte & 0x7F) | (payload[position + 1] << 7)
                    position += 2 + ((length >> 1) ^ -(length & 1))
                else:
                    length, position = read_varint(payload, position)
                    position += length
            batch_ends.append(end)
            position = end  # a wrong hop shows in the check below
    except (IndexError, VarintError) as error:
        raise InvalidBatchError(f"malformed record in batch: {error}", corrupt=True) from error
    record_starts = np.array(starts, np.int64)
    buf = np.frombuffer(payload, np.uint8)
    next_starts = np.empty_like(record_starts)
    next_starts[:-1] = record_starts[1:]
    last = np.cumsum([b.count for b in batches]) - 1
    next_starts[last] = batch_ends
    try:
        lengths, body_starts = _varints(buf, record_starts, next_starts)
    except IndexError as error:
        raise InvalidBatchError("a record runs past its batch", corrupt=True) from error
    record_ends = body_starts + lengths
    if (lengths < 0).any() or (record_ends != next_starts).any():
        raise InvalidBatchError("record lengths do not add up to their batch", corrupt=True)
    return body_starts, record_ends


def _varints(buf: npt.NDArray[np.uint8], position: Int64s, limit: Int64s) -> tuple[Int64s, Int64s]:
    """The zig-zag varint at each position, and the positions after them.

    Most fields are one byte; each further byte is one more pass over the records whose
    varint goes on. A varint reaching its record's end is corrupt.
    """
    byte = buf[position].astype(np.int64)
    unsigned = byte & 0x7F
    size = np.ones(len(position), np.int64)
    going_on = np.flatnonzero(byte & 0x80)
    shift = 7
    while going_on.size:
        if shift >= 7 * MAX_VARLONG_BYTES:
            raise InvalidBatchError("a varint longer than 10 bytes in a record", corrupt=True)
        at = position[going_on] + size[going_on]
        if (at >= limit[going_on]).any():
            raise InvalidBatchError("a varint runs past its record", corrupt=True)
        byte = buf[at].astype(np.int64)
        unsigned[going_on] |= (byte & 0x7F) << shift
        size[going_on] += 1
        going_on = going_on[(byte & 0x80) != 0]
        shift += 7
    after = position + size
    if (after > limit).any():
        raise InvalidBatchError("a record field runs past its record", corrupt=True)
    return (unsigned >> 1) ^ -(unsigned & 1), after


def _binary(payload: bytes, buf: npt.NDArray[np.uint8], start: Int64s, length: Int64s) -> pa.Array:
    """Arrow binary values at ``start`` in the payload (a length of -1 is null).

    Built as a binary-view array over the payload, 16 bytes per value (a value of up to 12
    bytes inline, a longer one as its length, first 4 bytes and offset), which Arrow's cast
    then copies into the contiguous binary layout Spark takes: four times faster than
    gathering the bytes with numpy.
    """
    count = len(start)
    present = length >= 0
    if not present.any():
        return pa.nulls(count, pa.binary())
    sizes = np.where(present, length, 0)
    views = np.zeros((count, 4), np.int32)
    views[:, 0] = sizes
    # The first 12 bytes of each value (clipped at the payload's end; masked beyond each size).
    head = buf[np.minimum(start[:, None] + np.arange(12), len(buf) - 1)]
    inline = sizes <= 12
    view_bytes = views.view(np.uint8)
    view_bytes[:, 4:16] = np.where(inline[:, None] & (np.arange(12) < sizes[:, None]), head, 0)
    outline = ~inline
    view_bytes[outline, 4:8] = head[outline, :4]
    views[outline, 3] = start[outline]  # buffer 0 (the payload), at the value's offset
    validity = None if present.all() else pa.py_buffer(np.packbits(present, bitorder="little"))
    array = pa.Array.from_buffers(pa.binary_view(), count, [validity, pa.py_buffer(views), pa.py_buffer(payload)])
    return array.cast(pa.binary())


def _headers(
    payload: bytes, count: Int64s, start: Int64s, ends: Int64s, header_type: pa.DataType
) -> pa.Array:
    """Each record's headers (``start``: where its header count begins)."""
    rows: list[list[dict[str, object]]] = []
    for n, position, end in zip(count.tolist(), start.tolist(), ends.tolist(), strict=True):
        if not n:
            rows.append([])
            continue
        headers, after = read_headers(payload, position, end)
        if after != end:
            raise InvalidBatchError("a record's headers do not end with the record", corrupt=True)
        rows.append([{"key": key, "value": value} for key, value in headers])
    return pa.array(rows, header_type)

