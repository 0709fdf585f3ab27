"""Partition assignors: how a group's leader splits the subscribed partitions among members.

As in Kafka, the leader runs the assignor named by the group's chosen protocol over
every member's Subscription and the partition counts of the subscribed topics; each
member gets its list back through SyncGroup.

- ``range``: per topic, members (ordered by group.instance.id, then member id) get
  consecutive ranges; the first ``partitions % members`` get one extra.
- ``roundrobin``: every subscribed partition, ordered by topic and number, dealt to the
  members in turn, skipping members not subscribed to its topic.
- ``cooperative-sticky``: balanced (partition counts differ by at most one among
  members with equal subscriptions) and sticky (a member keeps what it owns unless the
  balance needs it elsewhere). It speaks the cooperative protocol: a partition that
  moves is left out of this round's assignment, so its owner revokes it first and a
  follow-up rebalance hands it to its new owner.
"""

from __future__ import annotations

import enum
import struct
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import ClassVar

from strom.client.cluster import TopicPartition
from strom.client.consumer.protocol import NO_GENERATION, Assignment, Subscription
from strom.client.errors import ConfigException

_GENERATION = struct.Struct(">i")


class RebalanceProtocol(enum.Enum):
    EAGER = 0
    COOPERATIVE = 1


class ConsumerPartitionAssignor(ABC):
    name: ClassVar[str]
    supported_protocols: ClassVar[tuple[RebalanceProtocol, ...]] = (RebalanceProtocol.EAGER,)

    def subscription_user_data(self, topics: set[str]) -> bytes | None:
        """Assignor data this member adds to its subscription."""
        return None

    def on_assignment(self, assignment: Assignment, generation_id: int) -> None:  # noqa: B027 (optional hook)
        """Called on every member when its assignment for ``generation_id`` arrives."""

    @abstractmethod
    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, list[TopicPartition]]:
        """Every member id of ``subscriptions`` mapped to its partitions.

        ``partitions_per_topic`` has the partition count of each subscribed topic that
        exists; partitions of topics missing from it are not assigned.
        """


def _member_order(member_id: str, subscription: Subscription) -> tuple[int, str]:
    # Static members first, by instance id: their order survives restarts (new member ids).
    if subscription.group_instance_id is not None:
        return (0, subscription.group_instance_id)
    return (1, member_id)


def _sorted_members(subscriptions: Mapping[str, Subscription]) -> list[str]:
    return sorted(subscriptions, key=lambda member: _member_order(member, subscriptions[member]))


def _subscribed_partitions(
    partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
) -> list[TopicPartition]:
    topics = sorted({t for s in subscriptions.values() for t in s.topics if t in partitions_per_topic})
    return [TopicPartition(t, p) for t in topics for p in range(partitions_per_topic[t])]


class RangeAssignor(ConsumerPartitionAssignor):
    name = "range"

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, list[TopicPartition]]:
        assignment: dict[str, list[TopicPartition]] = {member: [] for member in subscriptions}
        members = _sorted_members(subscriptions)
        for topic in sorted({t for s in subscriptions.values() for t in s.topics}):
            count = partitions_per_topic.get(topic)
            if count is None:
                continue
            consumers = [m for m in members if topic in subscriptions[m].topics]
            per_member, extra = divmod(count, len(consumers))
            for index, member in enumerate(consumers):
                start = per_member * index + min(index, extra)
                length = per_member + (1 if index < extra else 0)
                assignment[member].extend(TopicPartition(topic, p) for p in range(start, start + length))
        return assignment


class RoundRobinAssignor(ConsumerPartitionAssignor):
    name = "roundrobin"

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, list[TopicPartition]]:
        assignment: dict[str, list[TopicPartition]] = {member: [] for member in subscriptions}
        members = _sorted_members(subscriptions)
        turn = 0
        for tp in _subscribed_partitions(partitions_per_topic, subscriptions):
            # Deal to the next member (in circular order) subscribed to the partition's topic.
            for step in range(len(members)):
                member = members[(turn + step) % len(members)]
                if tp.topic in subscriptions[member].topics:
                    assignment[member].append(tp)
                    turn = (turn + step + 1) % len(members)
                    break
        return assignment


class CooperativeStickyAssignor(ConsumerPartitionAssignor):
    name = "cooperative-sticky"
    supported_protocols = (RebalanceProtocol.COOPERATIVE, RebalanceProtocol.EAGER)

    def __init__(self) -> None:
        self._generation = NO_GENERATION

    def subscription_user_data(self, topics: set[str]) -> bytes | None:
        # The generation, for leaders that read subscriptions older than v2 (as Kafka writes it).
        return _GENERATION.pack(self._generation)

    def on_assignment(self, assignment: Assignment, generation_id: int) -> None:
        self._generation = generation_id

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, list[TopicPartition]]:
        previous_owner = _previous_owners(partitions_per_topic, subscriptions)
        members = _sorted_members(subscriptions)
        rank = {member: index for index, member in enumerate(members)}
        eligible: dict[str, list[str]] = {}
        for member in members:
            for topic in subscriptions[member].topics:
                eligible.setdefault(topic, []).append(member)
        assignment: dict[str, list[TopicPartition]] = {member: [] for member in members}
        unassigned: list[TopicPartition] = []
        for tp in _subscribed_partitions(partitions_per_topic, subscriptions):
            owner = previous_owner.get(tp)
            if owner is not None:
                assignment[owner].append(tp)
            else:
                unassigned.append(tp)

        def least_loaded(topic: str) -> str:
            return min(eligible[topic], key=lambda m: (len(assignment[m]), rank[m]))

        # Partitions with the fewest candidate members first, so the flexible ones fill the gaps.
        unassigned.sort(key=lambda tp: (len(eligible[tp.topic]), tp.topic, tp.partition))
        for tp in unassigned:
            assignment[least_loaded(tp.topic)].append(tp)
        _balance(assignment, eligible, rank)
        # Cooperative: a partition changing owners is held back until its owner revoked it.
        return {
            member: sorted(tp for tp in partitions if previous_owner.get(tp, member) == member)
            for member, partitions in assignment.items()
        }


def _generation_of(subscription: Subscription) -> int:
    if subscription.generation_id != NO_GENERATION:
        return subscription.generation_id
    user_data = subscription.user_data
    if user_data is not None and len(user_data) == _GENERATION.size:
        return int(_GENERATION.unpack(user_data)[0])
    return NO_GENERATION


def _previous_owners(
    partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
) -> dict[TopicPartition, str]:
    """Who owns each partition now: the claim of the highest generation wins; two claims in
    one generation cancel out (one of them is stale), and nobody keeps a partition of a
    topic it no longer subscribes to."""
    claims: dict[TopicPartition, tuple[int, str | None]] = {}
    for member, subscription in subscriptions.items():
        generation = _generation_of(subscription)
        for tp in subscription.owned_partitions:
            if tp.topic not in subscription.topics or not 0 <= tp.partition < partitions_per_topic.get(
                tp.topic, 0
            ):
                continue
            claim = claims.get(tp)
            if claim is None or generation > claim[0]:
                claims[tp] = (generation, member)
            elif generation == claim[0]:
                claims[tp] = (generation, None)
    return {tp: owner for tp, (_, owner) in claims.items() if owner is not None}


def _balance(
    assignment: dict[str, list[TopicPartition]], eligible: Mapping[str, list[str]], rank: Mapping[str, int]
) -> None:
    """Move partitions from the most to the least loaded eligible members until no move
    narrows the gap; each move lowers the sum of squared loads, so this ends."""
    while True:
        moved = False
        for donor in sorted(assignment, key=lambda m: (-len(assignment[m]), rank[m])):
            load = len(assignment[donor])
            # Give away the partitions taken most recently; the ones owned longest stay.
            for tp in reversed(assignment[donor]):
                receiver = min(eligible[tp.topic], key=lambda m: (len(assignment[m]), rank[m]))
                if len(assignment[receiver]) + 1 < load:
                    assignment[donor].remove(tp)
                    assignment[receiver].append(tp)
                    moved = True
                    break
            if moved:
                break
        if not moved:
            return


ASSIGNORS: dict[str, type[ConsumerPartitionAssignor]] = {
    "range": RangeAssignor,
    "roundrobin": RoundRobinAssignor,
    "cooperative-sticky": CooperativeStickyAssignor,
}
# The Java client's class names, as properties files name them.
JAVA_CLASS_NAMES = {
    "org.apache.kafka.clients.consumer.RangeAssignor": "range",
    "org.apache.kafka.clients.consumer.RoundRobinAssignor": "roundrobin",
    "org.apache.kafka.clients.consumer.CooperativeStickyAssignor": "cooperative-sticky",
}


def assignors_for(names: Iterable[str]) -> list[ConsumerPartitionAssignor]:
    """Instances for ``partition.assignment.strategy`` (names or Java class names), in preference order."""
    assignors: list[ConsumerPartitionAssignor] = []
    for name in names:
        key = JAVA_CLASS_NAMES.get(name, name)
        cls = ASSIGNORS.get(key)
        if cls is None:
            raise ConfigException(
                f"unknown partition.assignment.strategy {name!r}: one of {', '.join(ASSIGNORS)}"
            )
        if all(a.name != cls.name for a in assignors):
            assignors.append(cls())
    if not assignors:
        raise ConfigException("partition.assignment.strategy names no assignor")
    return assignors


def rebalance_protocol(assignors: Iterable[ConsumerPartitionAssignor]) -> RebalanceProtocol:
    """The protocol every configured assignor supports: cooperative only if all of them do."""
    common = set(RebalanceProtocol)
    for assignor in assignors:
        common &= set(assignor.supported_protocols)
    if not common:
        raise ConfigException("the configured assignors support no common rebalance protocol")
    return max(common, key=lambda p: p.value)
