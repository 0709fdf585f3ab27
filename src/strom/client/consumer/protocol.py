"""The consumer protocol: what members put in JoinGroup metadata and SyncGroup assignments.

A classic group coordinator treats both as opaque bytes; consumers agree on this layout
(Kafka's ConsumerProtocolSubscription / ConsumerProtocolAssignment, non-flexible):

    Subscription v0: version int16, topics [string], user_data nullable bytes
                 v1: + owned_partitions [topic string, partitions [int32]]   (cooperative rebalancing)
                 v2: + generation_id int32                                   (default -1)
                 v3: + rack_id nullable string
    Assignment   v0-v3: version int16, assigned_partitions [topic string, partitions [int32]],
                 user_data nullable bytes

A reader takes a newer version than it knows as its own highest (newer versions only add
fields at the end), and tolerates a v0 subscription that ends before its user data, as
some old clients write it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

from strom.client.cluster import TopicPartition

SUBSCRIPTION_VERSION = 3
ASSIGNMENT_VERSION = 3
NO_GENERATION = -1

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class ConsumerProtocolError(ValueError):
    """Member metadata or an assignment that is not in the consumer protocol's layout."""


@dataclass(frozen=True, slots=True)
class Subscription:
    topics: tuple[str, ...]
    user_data: bytes | None = None
    owned_partitions: tuple[TopicPartition, ...] = ()
    generation_id: int = NO_GENERATION
    rack_id: str | None = None
    group_instance_id: str | None = field(default=None, compare=False)  # from JoinGroup, not encoded


@dataclass(frozen=True, slots=True)
class Assignment:
    partitions: tuple[TopicPartition, ...]
    user_data: bytes | None = None


# -- encoding ---------------------------------------------------------------------------------


def _string(out: bytearray, value: str) -> None:
    raw = value.encode()
    out += _I16.pack(len(raw))
    out += raw


def _nullable_string(out: bytearray, value: str | None) -> None:
    if value is None:
        out += _I16.pack(-1)
    else:
        _string(out, value)


def _nullable_bytes(out: bytearray, value: bytes | None) -> None:
    if value is None:
        out += _I32.pack(-1)
    else:
        out += _I32.pack(len(value))
        out += value


def _partitions_by_topic(out: bytearray, partitions: Iterable[TopicPartition]) -> None:
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    out += _I32.pack(len(by_topic))
    for topic in sorted(by_topic):
        _string(out, topic)
        numbers = sorted(by_topic[topic])
        out += _I32.pack(len(numbers))
        for number in numbers:
            out += _I32.pack(number)


def encode_subscription(subscription: Subscription, version: int = SUBSCRIPTION_VERSION) -> bytes:
    if not 0 <= version <= SUBSCRIPTION_VERSION:
        raise ValueError(f"unknown consumer protocol subscription version {version}")
    out = bytearray(_I16.pack(version))
    out += _I32.pack(len(subscription.topics))
    for topic in subscription.topics:
        _string(out, topic)
    _nullable_bytes(out, subscription.user_data)
    if version >= 1:
        _partitions_by_topic(out, subscription.owned_partitions)
    if version >= 2:
        out += _I32.pack(subscription.generation_id)
    if version >= 3:
        _nullable_string(out, subscription.rack_id)
    return bytes(out)


def encode_assignment(assignment: Assignment, version: int = ASSIGNMENT_VERSION) -> bytes:
    if not 0 <= version <= ASSIGNMENT_VERSION:
        raise ValueError(f"unknown consumer protocol assignment version {version}")
    out = bytearray(_I16.pack(version))
    _partitions_by_topic(out, assignment.partitions)
    _nullable_bytes(out, assignment.user_data)
    return bytes(out)


# -- decoding ---------------------------------------------------------------------------------


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.position = 0

    @property
    def at_end(self) -> bool:
        return self.position >= len(self.data)

    def _unpack(self, fmt: struct.Struct) -> int:
        if self.position + fmt.size > len(self.data):
            raise ConsumerProtocolError("consumer protocol data ends early")
        (value,) = fmt.unpack_from(self.data, self.position)
        self.position += fmt.size
        return int(value)

    def int16(self) -> int:
        return self._unpack(_I16)

    def int32(self) -> int:
        return self._unpack(_I32)

    def _take(self, size: int) -> bytes:
        if self.position + size > len(self.data):
            raise ConsumerProtocolError("consumer protocol field runs past the data")
        value = self.data[self.position : self.position + size]
        self.position += size
        return value

    def nullable_string(self) -> str | None:
        size = self.int16()
        if size < 0:
            return None
        try:
            return self._take(size).decode()
        except UnicodeDecodeError as exc:
            raise ConsumerProtocolError(f"invalid UTF-8 in consumer protocol string: {exc}") from exc

    def string(self) -> str:
        value = self.nullable_string()
        if value is None:
            raise ConsumerProtocolError("null string where the consumer protocol has none")
        return value

    def nullable_bytes(self) -> bytes | None:
        size = self.int32()
        return None if size < 0 else self._take(size)

    def count(self) -> int:
        size = self.int32()
        if size < 0:
            raise ConsumerProtocolError(f"negative array length {size}")
        return size

    def topic_partitions(self) -> tuple[TopicPartition, ...]:
        partitions: list[TopicPartition] = []
        for _ in range(self.count()):
            topic = self.string()
            partitions.extend(TopicPartition(topic, self.int32()) for _ in range(self.count()))
        return tuple(partitions)


def decode_subscription(data: bytes) -> Subscription:
    reader = _Reader(data)
    version = reader.int16()
    if version < 0:
        raise ConsumerProtocolError(f"negative consumer protocol subscription version {version}")
    topics = tuple(reader.string() for _ in range(reader.count()))
    user_data = None if reader.at_end else reader.nullable_bytes()
    owned: tuple[TopicPartition, ...] = ()
    generation_id = NO_GENERATION
    rack_id = None
    if version >= 1:
        owned = reader.topic_partitions()
    if version >= 2:
        generation_id = reader.int32()
    if version >= 3:
        rack_id = reader.nullable_string()
    return Subscription(topics, user_data, owned, generation_id, rack_id)


def decode_assignment(data: bytes) -> Assignment:
    """An empty byte string (what a leader sends a member it assigned nothing) is an empty assignment."""
    if not data:
        return Assignment(())
    reader = _Reader(data)
    version = reader.int16()
    if version < 0:
        raise ConsumerProtocolError(f"negative consumer protocol assignment version {version}")
    partitions = reader.topic_partitions()
    user_data = None if reader.at_end else reader.nullable_bytes()
    return Assignment(partitions, user_data)
