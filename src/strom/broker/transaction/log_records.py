"""The transaction coordinator's records in ``__transaction_state``, in Kafka's byte layouts.

A key is TransactionLogKey v0: [version int16 = 0][transactional id: string]. A value is
TransactionLogValue: [version int16] then producer id, epoch, timeout, state, the partitions of
the transaction, and the last-update and start timestamps. Version 1 is the flexible encoding
with tagged fields (KIP-890 part 2's previous/next producer ids and client transaction version),
which Strom reads, skipping the tags, and does not write: it writes version 0, which every Kafka
since 0.11 reads. A null value is a tombstone: the transactional id expired.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from strom.broker.coordinator.records import CoordinatorRecordError, RecordReader, RecordWriter

KEY_VERSION = 0
VALUE_VERSION = 0
_FIRST_FLEXIBLE_VALUE_VERSION = 1
_HIGHEST_VALUE_VERSION = 1


class TransactionState(enum.IntEnum):
    """Kafka's TransactionState and its ids in the log."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def display_name(self) -> str:
        """The name DescribeTransactions and ListTransactions use ("PrepareCommit", ...)."""
        return "".join(part.capitalize() for part in self.name.split("_"))


@dataclass(frozen=True, slots=True)
class TransactionLogValue:
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    state: TransactionState
    # topic -> partitions; empty outside Ongoing and the Prepare states.
    partitions: dict[str, list[int]]
    last_update_timestamp_ms: int
    start_timestamp_ms: int


def encode_key(transactional_id: str) -> bytes:
    w = RecordWriter()
    w.int16(KEY_VERSION)
    w.string(transactional_id)
    return bytes(w.out)


def decode_key(data: bytes) -> str:
    r = RecordReader(data)
    version = r.int16()
    if version != KEY_VERSION:
        raise CoordinatorRecordError(f"unknown transaction log key version {version}")
    return r.string()


def encode_value(value: TransactionLogValue) -> bytes:
    w = RecordWriter()
    w.int16(VALUE_VERSION)
    w.int64(value.producer_id)
    w.int16(value.producer_epoch)
    w.int32(value.transaction_timeout_ms)
    w.out.append(int(value.state))
    w.int32(len(value.partitions))
    for topic, partitions in value.partitions.items():
        w.string(topic)
        w.int32(len(partitions))
        for partition in partitions:
            w.int32(partition)
    w.int64(value.last_update_timestamp_ms)
    w.int64(value.start_timestamp_ms)
    return bytes(w.out)


def decode_value(data: bytes) -> TransactionLogValue:
    """Versions 0 and 1; CoordinatorRecordError for anything else or a malformed record."""
    version = RecordReader(data).int16()
    if not 0 <= version <= _HIGHEST_VALUE_VERSION:
        raise CoordinatorRecordError(f"unknown transaction log value version {version}")
    r = RecordReader(data, flexible=version >= _FIRST_FLEXIBLE_VALUE_VERSION)
    r.position = 2
    producer_id = r.int64()
    producer_epoch = r.int16()
    timeout_ms = r.int32()
    state_id = r.int8()
    try:
        state = TransactionState(state_id)
    except ValueError:
        raise CoordinatorRecordError(f"unknown transaction state {state_id}") from None
    partitions: dict[str, list[int]] = {}
    for _ in range(max(0, r.array_length())):  # a null array (-1) is no partitions
        topic = r.string()
        partitions[topic] = [r.int32() for _ in range(max(0, r.array_length()))]
        r.skip_tagged_fields()
    last_update = r.int64()
    start = r.int64()
    r.skip_tagged_fields()
    return TransactionLogValue(producer_id, producer_epoch, timeout_ms, state, partitions, last_update, start)
