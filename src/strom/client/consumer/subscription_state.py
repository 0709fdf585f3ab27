"""What a consumer subscribes to, what it is assigned, and where it stands in each partition.

As in Kafka's SubscriptionState, a consumer either subscribes (to topics or a pattern,
and the group assigns partitions) or assigns partitions itself; the two are exclusive.
Each assigned partition has a position (the next offset poll() returns). Strom also
keeps a fetch position: the fetcher prefetches, so the next offset to fetch can be
ahead of the position by what waits, undecoded, in the buffer. A seek or reset bumps
the partition's epoch, which makes any fetch built before it stale.

KIP-320: a position carries the leader epoch of the record before it (``leader_epoch``)
and the leader it was last checked against (``current_leader``). A position whose
leader changed, or that came from a committed offset with an epoch, awaits validation:
no fetching until OffsetForLeaderEpoch on the current leader confirms the log still
holds it (the fetcher's ``validate_positions``).

The state is shared by the caller's thread (poll, seek, assign) and the client's I/O
loop (fetch responses, offset resets); compound changes take ``lock``.
"""

from __future__ import annotations

import enum
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from strom.client.cluster import TopicPartition
from strom.client.consumer.structs import ConsumerRebalanceListener, OffsetAndMetadata
from strom.client.errors import KafkaException


class OffsetResetStrategy(enum.Enum):
    EARLIEST = "earliest"
    LATEST = "latest"
    NONE = "none"


class SubscriptionType(enum.Enum):
    NONE = 0
    AUTO_TOPICS = 1
    AUTO_PATTERN = 2
    USER_ASSIGNED = 3


@dataclass(slots=True)
class TopicPartitionState:
    position: int | None = None
    fetch_position: int | None = None
    epoch: int = 0
    reset_strategy: OffsetResetStrategy | None = None
    paused: bool = False
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    leader_epoch: int | None = None  # of the last record returned
    # The (leader id, leader epoch) the position is fetched from; epoch -1 when the broker names none.
    current_leader: tuple[int, int] | None = None
    awaiting_validation: bool = False

    @property
    def fetchable(self) -> bool:
        return not self.paused and self.fetch_position is not None and not self.awaiting_validation


class SubscriptionState:
    def __init__(self, default_reset_strategy: OffsetResetStrategy) -> None:
        self.lock = threading.RLock()
        self.default_reset_strategy = default_reset_strategy
        self.subscription_type = SubscriptionType.NONE
        self.subscription: set[str] = set()
        self.pattern: re.Pattern[str] | None = None
        # The leader's view: every topic some member of the group subscribes to.
        self.group_subscription: set[str] = set()
        self.assignment: dict[TopicPartition, TopicPartitionState] = {}
        self.listener: ConsumerRebalanceListener | None = None

    # -- subscribing ------------------------------------------------------------------------

    def _set_type(self, kind: SubscriptionType) -> None:
        if self.subscription_type not in (SubscriptionType.NONE, kind):
            raise KafkaException("subscription to topics, partitions and pattern are mutually exclusive")
        self.subscription_type = kind

    def subscribe(self, topics: Iterable[str], listener: ConsumerRebalanceListener | None) -> bool:
        """Subscribe to topics; True when the set of topics changed."""
        with self.lock:
            self._set_type(SubscriptionType.AUTO_TOPICS)
            self.listener = listener
            self.pattern = None
            return self.change_subscription(topics)

    def subscribe_pattern(self, pattern: re.Pattern[str], listener: ConsumerRebalanceListener | None) -> None:
        with self.lock:
            self._set_type(SubscriptionType.AUTO_PATTERN)
            self.listener = listener
            self.pattern = pattern

    def change_subscription(self, topics: Iterable[str]) -> bool:
        wanted = set(topics)
        with self.lock:
            if wanted == self.subscription:
                return False
            self.subscription = wanted
            return True

    def matches_pattern(self, topic: str) -> bool:
        return self.pattern is not None and self.pattern.fullmatch(topic) is not None

    @property
    def has_auto_assigned_partitions(self) -> bool:
        return self.subscription_type in (SubscriptionType.AUTO_TOPICS, SubscriptionType.AUTO_PATTERN)

    @property
    def has_pattern_subscription(self) -> bool:
        return self.subscription_type is SubscriptionType.AUTO_PATTERN

    def unsubscribe(self) -> None:
        with self.lock:
            self.subscription = set()
            self.group_subscription = set()
            self.pattern = None
            self.listener = None
            self._set_assignment(())
            self.subscription_type = SubscriptionType.NONE

    # -- assignment -------------------------------------------------------------------------

    def assign_from_user(self, partitions: Iterable[TopicPartition]) -> bool:
        """Manual assignment; True when it changed. Partitions kept keep their positions."""
        wanted = list(dict.fromkeys(partitions))
        with self.lock:
            self._set_type(SubscriptionType.USER_ASSIGNED)
            if set(wanted) == set(self.assignment):
                return False
            self.subscription = {tp.topic for tp in wanted}
            self._set_assignment(wanted)
            return True

    def assign_from_subscribed(self, partitions: Iterable[TopicPartition]) -> None:
        """The group's assignment; partitions of topics not subscribed any more are dropped."""
        with self.lock:
            if not self.has_auto_assigned_partitions:
                return
            self._set_assignment([tp for tp in partitions if tp.topic in self.subscription])

    def _set_assignment(self, partitions: Iterable[TopicPartition]) -> None:
        old = self.assignment
        self.assignment = {tp: old.get(tp) or TopicPartitionState() for tp in partitions}
        for tp, state in old.items():
            if tp not in self.assignment:
                state.epoch += 1  # in-flight fetches for it are dropped

    def assigned_partitions(self) -> set[TopicPartition]:
        with self.lock:
            return set(self.assignment)

    def state(self, tp: TopicPartition) -> TopicPartitionState:
        state = self.assignment.get(tp)
        if state is None:
            raise KafkaException(f"partition {tp} is not assigned to this consumer")
        return state

    # -- positions --------------------------------------------------------------------------

    def seek(self, tp: TopicPartition, offset: int, leader_epoch: int | None = None) -> None:
        with self.lock:
            state = self.state(tp)
            state.position = state.fetch_position = offset
            state.reset_strategy = None
            state.leader_epoch = leader_epoch
            # A position with an epoch (a committed offset, a reset) is checked against the
            # leader before fetching, as Kafka's seekUnvalidated does; a plain seek is trusted.
            state.awaiting_validation = leader_epoch is not None
            state.epoch += 1

    def seek_validated(self, tp: TopicPartition, offset: int, leader_epoch: int | None) -> None:
        """Move to a position the current leader vouched for (the end of a truncated epoch)."""
        with self.lock:
            self.seek(tp, offset, leader_epoch)
            self.assignment[tp].awaiting_validation = False

    def request_reset(self, partitions: Iterable[TopicPartition], strategy: OffsetResetStrategy) -> None:
        """Forget the positions; the fetcher looks them up by ``strategy`` (NONE: poll raises)."""
        with self.lock:
            for tp in partitions:
                state = self.state(tp)
                state.position = state.fetch_position = None
                state.reset_strategy = strategy
                state.awaiting_validation = False
                state.epoch += 1

    def partitions_awaiting_reset(self) -> dict[TopicPartition, tuple[OffsetResetStrategy, int]]:
        """Partitions to reset by EARLIEST or LATEST, with the epoch of the request."""
        with self.lock:
            return {
                tp: (state.reset_strategy, state.epoch)
                for tp, state in self.assignment.items()
                if state.reset_strategy in (OffsetResetStrategy.EARLIEST, OffsetResetStrategy.LATEST)
            }

    def partitions_without_offset(self) -> set[TopicPartition]:
        """Partitions that need a reset but have no reset strategy: poll() raises for them."""
        with self.lock:
            return {
                tp
                for tp, state in self.assignment.items()
                if state.reset_strategy is OffsetResetStrategy.NONE
            }

    def partitions_needing_position(self) -> dict[TopicPartition, int]:
        """New partitions: no position and no reset requested yet (committed offsets decide)."""
        with self.lock:
            return {
                tp: state.epoch
                for tp, state in self.assignment.items()
                if state.position is None and state.reset_strategy is None
            }

    def all_consumed(self) -> dict[TopicPartition, OffsetAndMetadata]:
        """The positions of every partition that has one, as offsets to commit."""
        with self.lock:
            return {
                tp: OffsetAndMetadata(state.position, "", state.leader_epoch)
                for tp, state in self.assignment.items()
                if state.position is not None
            }

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        with self.lock:
            for tp in partitions:
                self.state(tp).paused = True

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        with self.lock:
            for tp in partitions:
                self.state(tp).paused = False

    def paused_partitions(self) -> set[TopicPartition]:
        with self.lock:
            return {tp for tp, state in self.assignment.items() if state.paused}
