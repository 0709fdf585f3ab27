"""Small public types of the consumer: offsets with metadata, the rebalance listener, errors."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from strom.client.cluster import TopicPartition
from strom.client.errors import ErrorCode, KafkaException


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    """A committed offset: the next offset to consume, with optional metadata text."""

    offset: int
    metadata: str = ""
    leader_epoch: int | None = None


@dataclass(frozen=True, slots=True)
class OffsetAndTimestamp:
    """offsets_for_times' answer: the first offset whose timestamp is at or after the one asked for."""

    offset: int
    timestamp: int
    leader_epoch: int | None = None


class ConsumerGroupMetadata(NamedTuple):
    """A consumer's group membership, for a transactional producer's ``send_offsets_to_transaction``.

    The group coordinator refuses the transaction's offsets when the generation or member
    id no longer match, so that a member that lost its partitions cannot commit for them.
    """

    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None


class ConsumerRebalanceListener:
    """Rebalance callbacks; they run inside poll() on the caller's thread, as in Kafka.

    ``on_partitions_revoked`` runs before a rebalance takes partitions away (all of them
    under the eager protocol, only those moving under the cooperative one) while the
    member still owns them, so it can commit; ``on_partitions_assigned`` runs after the
    new assignment arrives with the partitions added; ``on_partitions_lost`` runs when
    the member learns it was already out of the group (the partitions may have new owners,
    so committing is pointless). In an AsyncConsumer the methods may be coroutines.
    """

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> object:
        return None

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> object:
        return None

    def on_partitions_lost(self, lost: set[TopicPartition]) -> object:
        return self.on_partitions_revoked(lost)


class NoOffsetForPartitionError(KafkaException):
    """A partition has no committed offset and ``auto.offset.reset`` is ``none``."""

    def __init__(self, partitions: set[TopicPartition]) -> None:
        names = ", ".join(sorted(str(tp) for tp in partitions))
        super().__init__(
            f"no committed offset for {names} and auto.offset.reset is none", ErrorCode.offset_out_of_range
        )
        self.partitions = partitions


class OffsetOutOfRangeError(KafkaException):
    """A fetch position is outside the log and ``auto.offset.reset`` is ``none``."""

    def __init__(self, offsets: Mapping[TopicPartition, int]) -> None:
        names = ", ".join(
            f"{tp} at {offset}" for tp, offset in sorted(offsets.items(), key=lambda i: str(i[0]))
        )
        super().__init__(
            f"fetch position out of range for {names} and auto.offset.reset is none",
            ErrorCode.offset_out_of_range,
        )
        self.offsets = dict(offsets)


class LogTruncationError(OffsetOutOfRangeError):
    """KIP-320: the log was truncated below the consumer's position after a leader change, and
    ``auto.offset.reset`` is ``none`` (Kafka's LogTruncationException).

    ``offsets``: the positions that were checked; ``divergent_offsets``: for each partition
    whose new leader answered one, the first offset where the logs diverge (with that
    offset's leader epoch). Records between it and the position were consumed from a log
    that the new leader does not have. Seek to carry on.
    """

    def __init__(
        self, offsets: Mapping[TopicPartition, int], divergent_offsets: Mapping[TopicPartition, OffsetAndMetadata]
    ) -> None:
        super().__init__(offsets)
        self.divergent_offsets = dict(divergent_offsets)
        names = ", ".join(
            f"{tp} at {offset}"
            + (f" (diverges at {divergent_offsets[tp].offset})" if tp in divergent_offsets else " (epoch unknown)")
            for tp, offset in sorted(offsets.items(), key=lambda i: str(i[0]))
        )
        self.args = (f"log truncation detected for {names} and auto.offset.reset is none",)
