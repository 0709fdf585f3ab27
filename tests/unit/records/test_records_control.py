from __future__ import annotations

import pytest

from strom.records.batch import InvalidBatchError, is_crc_valid
from strom.records.codec import Record, decode_batch
from strom.records.control import (
    ControlRecordType,
    EndTxnMarker,
    build_control_batch,
    decode_control_key,
    decode_end_txn_marker,
    encode_control_key,
    encode_end_txn_marker_value,
)


@pytest.mark.parametrize("marker", [ControlRecordType.ABORT, ControlRecordType.COMMIT])
def test_control_batch(marker: ControlRecordType) -> None:
    encoded = build_control_batch(
        marker,
        producer_id=123,
        producer_epoch=4,
        coordinator_epoch=17,
        base_offset=900,
        partition_leader_epoch=6,
        timestamp=1_700_000_000_000,
    )
    decoded = decode_batch(encoded)
    header = decoded.header
    assert is_crc_valid(encoded, header)
    assert header.is_control and header.is_transactional
    assert header.compression == 0
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (123, 4, -1)
    assert (header.base_offset, header.records_count, header.partition_leader_epoch) == (900, 1, 6)
    [record] = decoded.records
    assert record.key == b"\x00\x00\x00" + bytes([marker])
    assert record.value == b"\x00\x00\x00\x00\x00\x11"
    assert record.timestamp == 1_700_000_000_000
    assert decode_end_txn_marker(record) == EndTxnMarker(marker, 17)


def test_encodings() -> None:
    assert encode_control_key(ControlRecordType.COMMIT) == b"\x00\x00\x00\x01"
    assert encode_control_key(ControlRecordType.ABORT) == b"\x00\x00\x00\x00"
    assert encode_end_txn_marker_value(-1) == b"\x00\x00\xff\xff\xff\xff"


def test_unknown_control_types_read_as_unknown() -> None:
    assert decode_control_key(b"\x00\x00\x00\x02") is ControlRecordType.UNKNOWN  # KRaft LEADER_CHANGE
    record = Record(0, 0, b"\x00\x00\x00\x05", b"\x00\x00\x00\x00\x00\x00")
    with pytest.raises(InvalidBatchError, match="not a transaction marker"):
        decode_end_txn_marker(record)


def test_newer_versions_read_as_version_0() -> None:
    assert decode_control_key(b"\x00\x01\x00\x01extra") is ControlRecordType.COMMIT
    record = Record(0, 0, b"\x00\x00\x00\x00", b"\x00\x02\x00\x00\x00\x09more")
    assert decode_end_txn_marker(record) == EndTxnMarker(ControlRecordType.ABORT, 9)


@pytest.mark.parametrize("key", [None, b"", b"\x00\x00\x00", b"\xff\xff\x00\x01"])
def test_bad_keys(key: bytes | None) -> None:
    with pytest.raises(InvalidBatchError) as caught:
        decode_control_key(key)
    assert caught.value.corrupt


@pytest.mark.parametrize("value", [None, b"\x00\x00\x00\x00\x00", b"\xff\xff\x00\x00\x00\x00"])
def test_bad_marker_values(value: bytes | None) -> None:
    with pytest.raises(InvalidBatchError):
        decode_end_txn_marker(Record(0, 0, b"\x00\x00\x00\x01", value))


def test_only_abort_and_commit_build_markers() -> None:
    with pytest.raises(ValueError, match="ABORT or COMMIT"):
        build_control_batch(ControlRecordType.UNKNOWN, producer_id=1, producer_epoch=0, coordinator_epoch=0)
