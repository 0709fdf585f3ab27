"""Seeded differential fuzz: the Spark columnar decoder against the consumer's decoder (the record
scanner). Random batches of every codec, with headers, null keys and values, LogAppendTime, and
corrupt ones (CRC-valid batches whose records were mutated): both accept or both reject, and
when they accept they decode the same fields."""

from __future__ import annotations

import random

import pytest

from strom.records import scanner
from strom.records.batch import TIMESTAMP_TYPE_MASK, CompressionType, InvalidBatchError
from strom.records.codec import RecordSpec, encode_batch
from strom.records.reader import FetchedRecords
from strom.spark.arrow_decoder import decode_batches
from strom.spark.schema import arrow_schema

BASE_TS = 1_700_000_000_000
CODECS = list(CompressionType.NAMES.values())


def random_specs(rng: random.Random) -> list[RecordSpec]:
    out = []
    for i in range(rng.randint(1, 40)):
        key = None if rng.random() < 0.25 else rng.randbytes(rng.choice((0, 1, 12, 13, 300)))
        value = None if rng.random() < 0.15 else rng.randbytes(rng.choice((0, 4, 12, 100, 3000)))
        headers = tuple(
            (f"h{j}", None if rng.random() < 0.3 else rng.randbytes(rng.randint(0, 30)))
            for j in range(rng.choice((0, 0, 1, 4)))
        )
        out.append(RecordSpec(key, value, headers, BASE_TS + rng.choice((0, -7, 5000, 10**9)) + i))
    return out


def mutate(rng: random.Random, records: bytes) -> bytes:
    buf = bytearray(records)
    for _ in range(rng.randint(1, 2)):
        at = rng.randrange(len(buf))
        kind = rng.randrange(4)
        if kind == 0:
            buf[at] = rng.randrange(256)
        elif kind == 1:
            buf[at] ^= 1 << rng.randrange(8)
        elif kind == 2:
            del buf[at : at + rng.randint(1, 4)]
        else:
            buf[at:at] = rng.randbytes(rng.randint(1, 4))
    return bytes(buf)


def random_batch(rng: random.Random, base_offset: int, corrupt: bool) -> tuple[bytes, int]:
    specs = random_specs(rng)
    codec = rng.choice(CODECS)
    plain = bytearray(encode_batch(specs, base_offset=base_offset))
    records = bytes(plain[61:])
    if corrupt:
        records = mutate(rng, records)
    attributes = codec | (TIMESTAMP_TYPE_MASK if rng.random() < 0.2 else 0)
    batch = scanner.assemble_batch(
        records,
        attributes=attributes,
        base_offset=base_offset,
        partition_leader_epoch=rng.choice((-1, 3)),
        last_offset_delta=len(specs) - 1,
        base_timestamp=specs[0].timestamp or 0,
        max_timestamp=max(s.timestamp or 0 for s in specs),
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        records_count=len(specs),
    )
    return bytes(batch), len(specs)


def consumer_rows(data: bytes, include_headers: bool) -> list[dict[str, object]] | None:
    try:
        records = FetchedRecords("t", 1, data, 0).take(10**6)
    except InvalidBatchError:
        return None
    rows: list[dict[str, object]] = []
    for r in records:
        row: dict[str, object] = {
            "key": r.key,
            "value": r.value,
            "topic": "t",
            "partition": 1,
            "offset": r.offset,
            "timestamp": r.timestamp,
            "timestampType": r.timestamp_type,
        }
        if include_headers:
            row["headers"] = [{"key": k, "value": v} for k, v in r.headers]
        rows.append(row)
    return rows


def columnar_rows(data: bytes, include_headers: bool) -> list[dict[str, object]] | None:
    schema = arrow_schema(include_headers)
    try:
        batches = FetchedRecords("t", 1, data, 0).take_batches(10**6)
        columns = decode_batches(batches, schema, "t", 1, 10**12, include_headers)
    except InvalidBatchError:
        return None
    rows = columns.to_pylist()
    for row in rows:
        row["timestamp"] = round(row["timestamp"].timestamp() * 1000)  # type: ignore[union-attr]
    return rows


@pytest.mark.parametrize("seed", range(3))
def test_columnar_decoder_agrees_with_the_scanner(seed: int) -> None:
    rng = random.Random(seed)
    counts = {"accepted": 0, "rejected": 0}
    for _ in range(60):
        parts = []
        offset = 0
        corrupt_batches = 0
        for _ in range(rng.randint(1, 4)):
            corrupt = rng.random() < 0.25
            batch, count = random_batch(rng, offset, corrupt)
            parts.append(batch)
            offset += count
            corrupt_batches += corrupt
        data = b"".join(parts)
        include_headers = rng.random() < 0.5
        expected = consumer_rows(data, include_headers)
        got = columnar_rows(data, include_headers)
        assert got == expected, (seed, corrupt_batches)
        counts["accepted" if expected is not None else "rejected"] += 1
    assert counts["accepted"] >= 10 and counts["rejected"] >= 5, counts
