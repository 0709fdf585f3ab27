"""``__transaction_state`` records in Kafka's layouts: v0 written byte for byte, v0 and v1 read."""

from __future__ import annotations

import struct

import pytest

from strom.broker.coordinator.records import CoordinatorRecordError
from strom.broker.transaction.log_records import (
    TransactionLogValue,
    TransactionState,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)

VALUE = TransactionLogValue(
    producer_id=42,
    producer_epoch=3,
    transaction_timeout_ms=60_000,
    state=TransactionState.ONGOING,
    partitions={"orders": [0, 2]},
    last_update_timestamp_ms=1_700_000_000_123,
    start_timestamp_ms=1_700_000_000_000,
)


def test_key_layout() -> None:
    assert encode_key("tx") == b"\x00\x00\x00\x02tx"
    assert decode_key(encode_key("tx-é")) == "tx-é"


def test_value_v0_layout_and_round_trip() -> None:
    expected = (
        struct.pack(">hqhib", 0, 42, 3, 60_000, 1)
        + struct.pack(">i", 1)
        + struct.pack(">h", 6)
        + b"orders"
        + struct.pack(">iii", 2, 0, 2)
        + struct.pack(">qq", 1_700_000_000_123, 1_700_000_000_000)
    )
    assert encode_value(VALUE) == expected
    assert decode_value(expected) == VALUE


def test_value_v1_is_read_with_its_tagged_fields_skipped() -> None:
    tagged = bytes([3, 0, 8]) + struct.pack(">q", 41) + bytes([1, 8]) + struct.pack(">q", 43)
    tagged += bytes([2, 2]) + struct.pack(">h", 2)
    v1 = (
        struct.pack(">hqhib", 1, 42, 3, 60_000, 1)
        + bytes([2])  # one topic (compact array: length + 1)
        + bytes([7])
        + b"orders"
        + bytes([3])
        + struct.pack(">ii", 0, 2)
        + bytes([0])  # the topic's tagged fields
        + struct.pack(">qq", 1_700_000_000_123, 1_700_000_000_000)
        + tagged
    )
    assert decode_value(v1) == VALUE


def test_null_partitions_read_as_none() -> None:
    data = struct.pack(">hqhib", 0, 1, 0, 1000, 0) + struct.pack(">i", -1) + struct.pack(">qq", 5, -1)
    assert decode_value(data).partitions == {}


@pytest.mark.parametrize(
    "data",
    [
        b"",
        struct.pack(">h", 2) + b"\x00" * 40,  # a version Kafka has not defined
        struct.pack(">hqhib", 0, 1, 0, 1000, 9) + struct.pack(">i", 0) + b"\x00" * 16,  # state 9
        struct.pack(">hqhib", 0, 1, 0, 1000, 1) + struct.pack(">i", 3),  # truncated
    ],
)
def test_malformed_values_are_refused(data: bytes) -> None:
    with pytest.raises(CoordinatorRecordError):
        decode_value(data)


def test_display_names_are_kafkas() -> None:
    assert [s.display_name for s in TransactionState] == [
        "Empty",
        "Ongoing",
        "PrepareCommit",
        "PrepareAbort",
        "CompleteCommit",
        "CompleteAbort",
        "Dead",
        "PrepareEpochFence",
    ]
