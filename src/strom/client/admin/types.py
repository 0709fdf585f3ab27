"""The admin client's arguments and results, named as in Kafka's Java Admin API."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from strom.client.cluster import TopicPartition
from strom.network.pool import Node

# ListOffsets' special timestamps.
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3


class ConfigResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    BROKER = 4
    BROKER_LOGGER = 8
    CLIENT_METRICS = 16
    GROUP = 32


class ConfigSource(enum.IntEnum):
    """Where a config's effective value comes from (DescribeConfigs' config_source)."""

    UNKNOWN = 0
    DYNAMIC_TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5
    DYNAMIC_BROKER_LOGGER_CONFIG = 6
    CLIENT_METRICS_CONFIG = 7
    GROUP_CONFIG = 8


class AlterConfigOpType(enum.IntEnum):
    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


E = TypeVar("E", bound=enum.IntEnum)


def _enum_member(kind: type[E], value: E | int | str) -> E:
    if isinstance(value, str):
        try:
            return kind[value.strip().upper()]
        except KeyError:
            names = ", ".join(m.name.lower() for m in kind)
            raise ValueError(f"unknown {kind.__name__} {value!r}: one of {names}") from None
    return kind(value)


@dataclass(slots=True)
class NewTopic:
    """A topic to create; -1 partitions or replication factor take the broker's defaults."""

    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    configs: Mapping[str, str] = field(default_factory=dict)
    # partition -> broker ids; when given, num_partitions and replication_factor must stay -1.
    replica_assignment: Mapping[int, Sequence[int]] | None = None


@dataclass(frozen=True, slots=True)
class NewPartitions:
    """The total partition count a topic grows to, optionally with the new partitions' replicas."""

    total_count: int
    assignments: Sequence[Sequence[int]] | None = None


@dataclass(frozen=True, slots=True, init=False)
class ConfigResource:
    """A topic or broker whose configs are described or altered; ``type`` also takes "topic"/"broker"."""

    type: ConfigResourceType
    name: str

    def __init__(self, type: ConfigResourceType | int | str, name: str) -> None:
        object.__setattr__(self, "type", _enum_member(ConfigResourceType, type))
        object.__setattr__(self, "name", name)

    def __str__(self) -> str:
        return f"{self.type.name.lower()} '{self.name}'"


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    name: str
    value: str | None
    source: ConfigSource
    is_default: bool
    read_only: bool
    sensitive: bool


@dataclass(frozen=True, slots=True, init=False)
class AlterConfigOp:
    """One change for incremental_alter_configs; ``op`` also takes "set", "delete", "append", "subtract"."""

    name: str
    value: str | None
    op: AlterConfigOpType

    def __init__(
        self, name: str, value: str | None = None, op: AlterConfigOpType | int | str = AlterConfigOpType.SET
    ) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "op", _enum_member(AlterConfigOpType, op))


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """A partition's leader, replicas, in-sync replicas and offline replicas, as broker ids (-1: no leader)."""

    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TopicDescription:
    name: str
    topic_id: uuid.UUID | None
    is_internal: bool
    partitions: list[PartitionInfo]


@dataclass(frozen=True, slots=True)
class GroupListing:
    group_id: str
    state: str | None  # None when the broker is too old to report it (ListGroups < v4)
    protocol_type: str


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    host: str
    assignment: frozenset[TopicPartition]


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    state: str
    protocol_type: str
    protocol: str  # the assignor of a consumer group ("range", ...); empty until the group is Stable
    coordinator: Node
    members: list[MemberDescription]


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """What list_offsets looks up: a timestamp in ms, or one of Kafka's special timestamps."""

    timestamp: int

    @classmethod
    def earliest(cls) -> OffsetSpec:
        return cls(EARLIEST_TIMESTAMP)

    @classmethod
    def latest(cls) -> OffsetSpec:
        return cls(LATEST_TIMESTAMP)

    @classmethod
    def max_timestamp(cls) -> OffsetSpec:
        return cls(MAX_TIMESTAMP)

    @classmethod
    def for_timestamp(cls, timestamp_ms: int) -> OffsetSpec:
        if timestamp_ms < 0:
            raise ValueError(f"timestamp must be >= 0, got {timestamp_ms}")
        return cls(timestamp_ms)


class OffsetResetError(ValueError):
    """A reset that cannot be planned (nothing to reset, no committed offset to shift); its text is
    for the user."""


@dataclass(frozen=True, slots=True)
class OffsetReset:
    """Where plan_offset_reset moves a group's offsets: one of ``kafka-consumer-groups
    --reset-offsets``' targets (--to-earliest, ..., --from-file)."""

    target: str  # earliest, latest, current, offset, shift, timestamp, offsets
    value: int = 0  # the offset, shift or timestamp (ms)
    offsets: Mapping[TopicPartition, int] = field(default_factory=dict)  # ``offsets``: each partition's

    @classmethod
    def earliest(cls) -> OffsetReset:
        return cls("earliest")

    @classmethod
    def latest(cls) -> OffsetReset:
        return cls("latest")

    @classmethod
    def current(cls) -> OffsetReset:
        """The committed offset, or the log end where the group has none."""
        return cls("current")

    @classmethod
    def to_offset(cls, offset: int) -> OffsetReset:
        return cls("offset", offset)

    @classmethod
    def shift_by(cls, records: int) -> OffsetReset:
        return cls("shift", records)

    @classmethod
    def to_timestamp(cls, timestamp_ms: int) -> OffsetReset:
        """The first offset at or after the time; the log end where no record is that recent."""
        return cls("timestamp", timestamp_ms)

    @classmethod
    def to_offsets(cls, offsets: Mapping[TopicPartition, int]) -> OffsetReset:
        """These partitions to these offsets (--from-file)."""
        return cls("offsets", offsets=dict(offsets))


@dataclass(frozen=True, slots=True)
class PlannedOffset:
    """One partition of a reset plan."""

    partition: TopicPartition
    current: int | None  # the committed offset, None if the group has none
    new: int
    log_start: int
    log_end: int


@dataclass(frozen=True, slots=True)
class ListOffsetsResult:
    """offset -1 when a timestamp lookup found no record at or after the timestamp."""

    offset: int
    timestamp: int
    leader_epoch: int | None


@dataclass(frozen=True, slots=True)
class ClusterDescription:
    cluster_id: str | None
    controller: Node | None
    nodes: list[Node]


class ElectionType(enum.IntEnum):
    """ElectLeaders' election types (Kafka's ElectionType)."""

    PREFERRED = 0
    UNCLEAN = 1


@dataclass(frozen=True, slots=True)
class PartitionReassignment:
    """A reassignment in progress (ListPartitionReassignments): every replica, and which of them
    it adds and removes."""

    replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...]
    removing_replicas: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    """A replica's log in a log dir (DescribeLogDirs): its size in bytes, how far it is behind the
    log it replaces (a future replica), and whether it is one."""

    size: int
    offset_lag: int
    is_future: bool


@dataclass(frozen=True, slots=True)
class LogDirDescription:
    """One log dir of a broker; total and usable bytes are None when the broker does not say."""

    replicas: dict[TopicPartition, ReplicaInfo]
    total_bytes: int | None
    usable_bytes: int | None


@dataclass(frozen=True, slots=True)
class TopicPartitionReplica:
    """One broker's replica of a partition (what AlterReplicaLogDirs moves)."""

    topic: str
    partition: int
    broker_id: int


# -- transactions ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TransactionListing:
    """ListTransactions' answer for one transactional id; ``state`` is Kafka's name (Ongoing, ...)."""

    transactional_id: str
    producer_id: int
    state: str
    coordinator_id: int  # the broker that listed it: the transactional id's coordinator


@dataclass(frozen=True, slots=True)
class TransactionDescription:
    coordinator_id: int
    state: str
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    transaction_start_time_ms: int | None  # None while no transaction is open
    topic_partitions: frozenset[TopicPartition]


@dataclass(frozen=True, slots=True)
class ProducerState:
    """An active producer of a partition, as its leader's producer state has it (DescribeProducers)."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int | None
    current_transaction_start_offset: int | None  # the first offset of its open transaction


@dataclass(frozen=True, slots=True)
class AbortTransactionSpec:
    """A (hanging) transaction to abort on one partition by writing its ABORT marker there."""

    topic_partition: TopicPartition
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int


@dataclass(frozen=True, slots=True)
class HangingTransaction:
    """A transaction open on a partition that its coordinator will never end there (no markers
    will come): what find_hanging_transactions finds."""

    partition: TopicPartition
    state: ProducerState
    open_ms: int  # since the producer last wrote to the partition
