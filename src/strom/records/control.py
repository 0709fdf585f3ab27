"""Control records: the transaction markers a coordinator writes into data partitions.

A control batch has the control and transactional flags set and one record whose
key is [version: int16 = 0][type: int16] and, for ABORT/COMMIT, whose value is an
EndTxnMarker: [version: int16 = 0][coordinatorEpoch: int32].
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from strom.records.batch import NO_PARTITION_LEADER_EPOCH, InvalidBatchError
from strom.records.codec import Record, RecordSpec, decode_batch, encode_batch

CONTROL_KEY_VERSION = 0
END_TXN_MARKER_VERSION = 0

_KEY = struct.Struct(">hh")
_END_TXN_MARKER = struct.Struct(">hi")


class ControlRecordType(enum.IntEnum):
    # Types Strom does not write (KRaft's LEADER_CHANGE, snapshots, ...) read as UNKNOWN,
    # which readers skip, as Kafka's ControlRecordType.parse does.
    UNKNOWN = -1
    ABORT = 0
    COMMIT = 1


@dataclass(frozen=True, slots=True)
class EndTxnMarker:
    type: ControlRecordType
    coordinator_epoch: int


def encode_control_key(control_type: ControlRecordType) -> bytes:
    return _KEY.pack(CONTROL_KEY_VERSION, control_type)


def decode_control_key(key: bytes | None) -> ControlRecordType:
    """The type of a control record from its key; UNKNOWN for types Strom does not know.

    Raises InvalidBatchError (corrupt) for a key too short or with a negative version.
    A higher version is read as version 0, whose fields it must start with.
    """
    if key is None or len(key) < _KEY.size:
        raise InvalidBatchError("control record key shorter than 4 bytes", corrupt=True)
    version, type_id = _KEY.unpack_from(key)
    if version < 0:
        raise InvalidBatchError(f"control record key with negative version {version}", corrupt=True)
    try:
        return ControlRecordType(type_id)
    except ValueError:
        return ControlRecordType.UNKNOWN


def encode_end_txn_marker_value(coordinator_epoch: int) -> bytes:
    return _END_TXN_MARKER.pack(END_TXN_MARKER_VERSION, coordinator_epoch)


def decode_end_txn_marker(record: Record) -> EndTxnMarker:
    """The ABORT/COMMIT marker carried by a control record."""
    control_type = decode_control_key(record.key)
    if control_type not in (ControlRecordType.ABORT, ControlRecordType.COMMIT):
        raise InvalidBatchError(
            f"control record of type {control_type.name} is not a transaction marker", corrupt=False
        )
    value = record.value
    if value is None or len(value) < _END_TXN_MARKER.size:
        raise InvalidBatchError("end transaction marker value shorter than 6 bytes", corrupt=True)
    version, coordinator_epoch = _END_TXN_MARKER.unpack_from(value)
    if version < 0:
        raise InvalidBatchError(f"end transaction marker with negative version {version}", corrupt=True)
    return EndTxnMarker(control_type, coordinator_epoch)


def batch_end_txn_marker(batch: bytes | bytearray | memoryview) -> EndTxnMarker | None:
    """The COMMIT or ABORT marker of the control batch ``batch`` (one whole batch); None for a
    batch the cleaner emptied or a control type that is no transaction marker (readers skip it,
    as Kafka's ProducerAppendInfo does). Raises InvalidBatchError for a malformed one."""
    records = decode_batch(batch, verify_crc=False).records
    if not records or decode_control_key(records[0].key) is ControlRecordType.UNKNOWN:
        return None
    return decode_end_txn_marker(records[0])


def build_control_batch(
    marker: ControlRecordType,
    *,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
    base_offset: int = 0,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    timestamp: int | None = None,
) -> bytes:
    """An uncompressed, transactional control batch holding one ABORT or COMMIT marker."""
    if marker not in (ControlRecordType.ABORT, ControlRecordType.COMMIT):
        raise ValueError(f"a transaction marker is ABORT or COMMIT, not {marker!r}")
    record = RecordSpec(
        key=encode_control_key(marker),
        value=encode_end_txn_marker_value(coordinator_epoch),
        timestamp=timestamp,
    )
    return encode_batch(
        [record],
        base_offset=base_offset,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        partition_leader_epoch=partition_leader_epoch,
        is_transactional=True,
        is_control=True,
    )
