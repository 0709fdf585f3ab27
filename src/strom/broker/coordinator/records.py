"""The group coordinator's records in ``__consumer_offsets``, in Kafka's own byte layouts.

Every record key starts with an int16 version that names its type: 0 and 1 are
OffsetCommitKey (group, topic, partition), 2 is GroupMetadataKey (group). Values
carry their own int16 version; a null value is a tombstone. Strom writes
OffsetCommitValue v3 and GroupMetadataValue v3 (what Kafka 3.x and 4.x write for
classic groups) and reads every version up to 4, the first flexible one, so a log
written by Kafka can be loaded and Kafka's tools can read Strom's.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
OFFSET_COMMIT_VALUE_VERSION = 3
GROUP_METADATA_VALUE_VERSION = 3
_FIRST_FLEXIBLE_VALUE_VERSION = 4

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class CoordinatorRecordError(ValueError):
    """A record in ``__consumer_offsets`` that does not parse."""


@dataclass(frozen=True, slots=True)
class OffsetCommitKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class GroupMetadataKey:
    group: str


@dataclass(frozen=True, slots=True)
class OffsetCommitValue:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int
    expire_timestamp: int = -1  # only v1 has it (OffsetCommit v2-v4's retention_time)


@dataclass(frozen=True, slots=True)
class MemberMetadataValue:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout: int
    session_timeout: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupMetadataValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int
    members: list[MemberMetadataValue] = field(default_factory=list)


# --- writing -----------------------------------------------------------------------------


class RecordWriter:
    """Kafka's primitive types, big-endian, for the coordinators' records."""

    def __init__(self) -> None:
        self.out = bytearray()

    def int16(self, value: int) -> None:
        self.out += _I16.pack(value)

    def int32(self, value: int) -> None:
        self.out += _I32.pack(value)

    def int64(self, value: int) -> None:
        self.out += _I64.pack(value)

    def string(self, value: str | None) -> None:
        if value is None:
            self.int16(-1)
            return
        encoded = value.encode()
        self.int16(len(encoded))
        self.out += encoded

    def bytes_(self, value: bytes) -> None:
        self.int32(len(value))
        self.out += value


def encode_offset_commit_key(key: OffsetCommitKey) -> bytes:
    w = RecordWriter()
    w.int16(OFFSET_COMMIT_KEY_VERSION)
    w.string(key.group)
    w.string(key.topic)
    w.int32(key.partition)
    return bytes(w.out)


def encode_group_metadata_key(key: GroupMetadataKey) -> bytes:
    w = RecordWriter()
    w.int16(GROUP_METADATA_KEY_VERSION)
    w.string(key.group)
    return bytes(w.out)


def encode_offset_commit_value(value: OffsetCommitValue) -> bytes:
    w = RecordWriter()
    if value.expire_timestamp >= 0:
        # Only v1 can carry an explicit expiry (a client's retention_time).
        w.int16(1)
        w.int64(value.offset)
        w.string(value.metadata)
        w.int64(value.commit_timestamp)
        w.int64(value.expire_timestamp)
        return bytes(w.out)
    w.int16(OFFSET_COMMIT_VALUE_VERSION)
    w.int64(value.offset)
    w.int32(value.leader_epoch)
    w.string(value.metadata)
    w.int64(value.commit_timestamp)
    return bytes(w.out)


def encode_group_metadata_value(value: GroupMetadataValue) -> bytes:
    w = RecordWriter()
    w.int16(GROUP_METADATA_VALUE_VERSION)
    w.string(value.protocol_type)
    w.int32(value.generation)
    w.string(value.protocol)
    w.string(value.leader)
    w.int64(value.current_state_timestamp)
    w.int32(len(value.members))
    for member in value.members:
        w.string(member.member_id)
        w.string(member.group_instance_id)
        w.string(member.client_id)
        w.string(member.client_host)
        w.int32(member.rebalance_timeout)
        w.int32(member.session_timeout)
        w.bytes_(member.subscription)
        w.bytes_(member.assignment)
    return bytes(w.out)


# --- reading -----------------------------------------------------------------------------


class RecordReader:
    """Kafka's primitive types from a coordinator record; ``flexible``: compact strings and
    arrays and tagged fields (the versions a record's schema marks flexible)."""

    def __init__(self, data: bytes, flexible: bool = False) -> None:
        self.data = data
        self.position = 0
        self.flexible = flexible

    def _take(self, size: int) -> bytes:
        end = self.position + size
        if size < 0 or end > len(self.data):
            raise CoordinatorRecordError("record is truncated")
        chunk = self.data[self.position : end]
        self.position = end
        return chunk

    def int8(self) -> int:
        value: int = _I8.unpack(self._take(1))[0]
        return value

    def int16(self) -> int:
        value: int = _I16.unpack(self._take(2))[0]
        return value

    def int32(self) -> int:
        value: int = _I32.unpack(self._take(4))[0]
        return value

    def int64(self) -> int:
        value: int = _I64.unpack(self._take(8))[0]
        return value

    def uvarint(self) -> int:
        result = shift = 0
        while True:
            byte = self._take(1)[0]
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7
            if shift > 28:
                raise CoordinatorRecordError("varint is too long")

    def nullable_string(self) -> str | None:
        size = self.uvarint() - 1 if self.flexible else self.int16()
        if size < 0:
            return None
        try:
            return self._take(size).decode()
        except UnicodeDecodeError as e:
            raise CoordinatorRecordError(f"string is not UTF-8: {e}") from e

    def string(self) -> str:
        value = self.nullable_string()
        if value is None:
            raise CoordinatorRecordError("a non-nullable string is null")
        return value

    def bytes_(self) -> bytes:
        size = self.uvarint() - 1 if self.flexible else self.int32()
        return self._take(max(size, 0))

    def array_length(self) -> int:
        return self.uvarint() - 1 if self.flexible else self.int32()

    def skip_tagged_fields(self) -> None:
        if self.flexible:
            for _ in range(self.uvarint()):
                self.uvarint()  # tag
                self._take(self.uvarint())


def decode_key(data: bytes) -> OffsetCommitKey | GroupMetadataKey | None:
    """The key's type and fields; None for record types a classic coordinator does not use."""
    r = RecordReader(data)
    version = r.int16()
    if version in (0, 1):
        return OffsetCommitKey(r.string(), r.string(), r.int32())
    if version == GROUP_METADATA_KEY_VERSION:
        return GroupMetadataKey(r.string())
    return None  # Kafka 4's consumer-group (KIP-848) and share-group records


def decode_offset_commit_value(data: bytes) -> OffsetCommitValue:
    version = RecordReader(data).int16()
    r = RecordReader(data, flexible=version >= _FIRST_FLEXIBLE_VALUE_VERSION)
    r.position = 2
    offset = r.int64()
    leader_epoch = r.int32() if version >= 3 else -1
    metadata = r.string()
    commit_timestamp = r.int64()
    expire_timestamp = r.int64() if version == 1 else -1
    r.skip_tagged_fields()
    return OffsetCommitValue(offset, leader_epoch, metadata, commit_timestamp, expire_timestamp)


def decode_group_metadata_value(data: bytes) -> GroupMetadataValue:
    version = RecordReader(data).int16()
    r = RecordReader(data, flexible=version >= _FIRST_FLEXIBLE_VALUE_VERSION)
    r.position = 2
    protocol_type = r.string()
    generation = r.int32()
    protocol = r.nullable_string()
    leader = r.nullable_string()
    current_state_timestamp = r.int64() if version >= 2 else -1
    members = []
    for _ in range(r.array_length()):
        member_id = r.string()
        group_instance_id = r.nullable_string() if version >= 3 else None
        client_id = r.string()
        client_host = r.string()
        session_timeout = rebalance_timeout = 0
        if version >= 1:
            rebalance_timeout = r.int32()
        session_timeout = r.int32()
        if version == 0:
            rebalance_timeout = session_timeout
        subscription = r.bytes_()
        assignment = r.bytes_()
        r.skip_tagged_fields()
        members.append(
            MemberMetadataValue(
                member_id,
                group_instance_id,
                client_id,
                client_host,
                rebalance_timeout,
                session_timeout,
                subscription,
                assignment,
            )
        )
    r.skip_tagged_fields()
    return GroupMetadataValue(protocol_type, generation, protocol, leader, current_state_timestamp, members)
