"""The columnar decoder against the consumer's record-by-record decoder, on every kind of batch."""

from __future__ import annotations

import random

import pytest

from strom.records.batch import CompressionType, InvalidBatchError, TimestampType
from strom.records.codec import RecordSpec, encode_batch
from strom.records.control import ControlRecordType, build_control_batch
from strom.records.reader import FetchedRecords
from strom.spark.arrow_decoder import decode_batches
from strom.spark.schema import arrow_schema

BASE_TS = 1_700_000_000_000


def specs(rng: random.Random, count: int, *, headers: bool) -> list[RecordSpec]:
    out = []
    for i in range(count):
        key = None if rng.random() < 0.3 else rng.randbytes(rng.choice((0, 1, 5, 70, 300)))
        value = None if rng.random() < 0.1 else rng.randbytes(rng.choice((0, 3, 100, 200, 5000)))
        hdrs = (
            tuple((f"h{j}", None if j == 1 else rng.randbytes(j * 7)) for j in range(rng.randint(0, 3)))
            if headers
            else ()
        )
        # Deltas of both signs and sizes: one-, two- and many-byte varints.
        out.append(RecordSpec(key, value, hdrs, BASE_TS + rng.choice((0, 5, -3, 90_000, 10**9)) + i))
    return out


def log_of(rng: random.Random, *, headers: bool) -> bytes:
    batches = []
    offset = 0
    for index, codec in enumerate([*CompressionType.NAMES.values(), CompressionType.NONE, CompressionType.LZ4]):
        records = specs(rng, rng.randint(1, 60), headers=headers)
        kind = TimestampType.LOG_APPEND_TIME if index == 2 else TimestampType.CREATE_TIME
        batches.append(encode_batch(records, base_offset=offset, compression=codec, timestamp_type=kind))
        offset += len(records)
        if index == 3:
            batches.append(
                build_control_batch(
                    ControlRecordType.COMMIT, producer_id=7, producer_epoch=0, coordinator_epoch=0, base_offset=offset
                )
            )
            offset += 1
    return b"".join(batches)


def expected_rows(data: bytes, start: int, until: int, include_headers: bool) -> list[dict[str, object]]:
    rows = []
    for r in FetchedRecords("t", 3, data, start).take(10**6):
        if r.offset >= until:
            break
        row: dict[str, object] = {
            "key": r.key,
            "value": r.value,
            "topic": "t",
            "partition": 3,
            "offset": r.offset,
            "timestamp": r.timestamp,
            "timestampType": r.timestamp_type,
        }
        if include_headers:
            row["headers"] = [{"key": k, "value": v} for k, v in r.headers]
        rows.append(row)
    return rows


def decoded_rows(data: bytes, start: int, until: int, include_headers: bool) -> list[dict[str, object]]:
    fetched = FetchedRecords("t", 3, data, start)
    schema = arrow_schema(include_headers)
    batch = decode_batches(fetched.take_batches(10**6), schema, "t", 3, until, include_headers)
    assert batch.schema == schema
    rows = batch.to_pylist()
    for row in rows:
        moment = row["timestamp"]
        row["timestamp"] = int(moment.timestamp() * 1000)  # type: ignore[union-attr]
    return rows


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("include_headers", [False, True])
def test_columns_equal_the_record_decoder(seed: int, include_headers: bool) -> None:
    rng = random.Random(seed)
    data = log_of(rng, headers=True)
    last = sum(1 for _ in FetchedRecords("t", 3, data, 0).take(10**6))
    assert last > 0
    for start, until in [(0, 10**9), (rng.randint(1, 40), 10**9), (0, rng.randint(1, 100)), (17, 53)]:
        assert decoded_rows(data, start, until, include_headers) == expected_rows(
            data, start, until, include_headers
        )


def test_position_moves_past_taken_batches() -> None:
    data = log_of(random.Random(9), headers=False)
    fetched = FetchedRecords("t", 0, data, 0)
    batches = fetched.take_batches(1)
    assert len(batches) == 1
    assert fetched.next_offset == batches[0].base_offset + batches[0].count
    rest = fetched.take_batches(10**6)
    assert fetched.exhausted
    assert sum(b.count for b in batches + rest) == len(FetchedRecords("t", 0, data, 0).take(10**6))


def test_corrupt_records_are_refused() -> None:
    batch = bytearray(encode_batch([RecordSpec(b"k", b"value", (), BASE_TS)] * 3))
    schema = arrow_schema(False)
    records_start = 61
    # A record length running past the batch, then one whose fields run past its length.
    for position, byte in [(records_start, 0x7E), (records_start + 4, 0x7E)]:
        broken = bytearray(batch)
        broken[position] = byte
        fetched = FetchedRecords("t", 0, bytes(broken), 0, check_crcs=False)
        with pytest.raises(InvalidBatchError):
            decode_batches(fetched.take_batches(10), schema, "t", 0, 10**9, False)
