"""A classic consumer group: its members, generation, chosen protocol and committed offsets.

This module holds state and the rules that depend only on state (protocol selection,
allowed state transitions); the coordinator drives it and owns time and I/O.
"""

from __future__ import annotations

import asyncio
import collections
import enum
from collections.abc import Iterable
from dataclasses import dataclass

from strom.broker.coordinator.consumer_protocol import subscription_topics
from strom.broker.partition import TopicPartition


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


# Kafka's state machine: the states each state may be entered from.
_VALID_PREVIOUS_STATES = {
    GroupState.DEAD: set(GroupState),
    GroupState.COMPLETING_REBALANCE: {GroupState.PREPARING_REBALANCE},
    GroupState.STABLE: {GroupState.COMPLETING_REBALANCE},
    GroupState.PREPARING_REBALANCE: {GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY},
    GroupState.EMPTY: {GroupState.PREPARING_REBALANCE},
}


@dataclass(frozen=True, slots=True)
class JoinResult:
    error: int
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    member_id: str = ""
    skip_assignment: bool = False
    # (member id, group instance id, protocol metadata): only the leader gets them.
    members: tuple[tuple[str, str | None, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class SyncResult:
    error: int
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(slots=True)
class MemberMetadata:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    # (name, metadata) in the member's order of preference.
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    join_future: asyncio.Future[JoinResult] | None = None
    sync_future: asyncio.Future[SyncResult] | None = None
    heartbeat_timer: asyncio.TimerHandle | None = None
    # Joined but not yet part of a generation (Kafka's MemberMetadata.isNew).
    is_new: bool = False

    @property
    def is_awaiting_join(self) -> bool:
        return self.join_future is not None and not self.join_future.done()

    @property
    def is_awaiting_sync(self) -> bool:
        return self.sync_future is not None and not self.sync_future.done()

    @property
    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def metadata_for(self, protocol: str) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        raise KeyError(f"member {self.member_id} does not support protocol {protocol}")

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return self.protocols == protocols

    def vote(self, candidates: set[str]) -> str:
        """The member's most preferred protocol among ``candidates``."""
        return next(name for name in self.protocol_names if name in candidates)

    def cancel_heartbeat(self) -> None:
        if self.heartbeat_timer is not None:
            self.heartbeat_timer.cancel()
            self.heartbeat_timer = None


@dataclass(slots=True)
class OffsetAndMetadata:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int
    expire_timestamp: int = -1


class ClassicGroup:
    def __init__(self, group_id: str, now_ms: int, state: GroupState = GroupState.EMPTY) -> None:
        self.group_id = group_id
        self.state = state
        self.current_state_timestamp = now_ms
        self.generation_id = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader_id: str | None = None
        self.members: dict[str, MemberMetadata] = {}
        self.static_members: dict[str, str] = {}  # group.instance.id -> member id
        # Dynamic members told MEMBER_ID_REQUIRED, and when their id expires.
        self.pending_members: dict[str, asyncio.TimerHandle] = {}
        # Members of the current generation that have not sent SyncGroup yet.
        self.pending_sync_members: set[str] = set()
        self.offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        # Where each committed offset's record is in the log: a transaction's offsets, applied
        # when its COMMIT lands, never replace a commit written after them.
        self.offset_log_positions: dict[TopicPartition, int] = {}
        # Transactional offset commits (TxnOffsetCommit) waiting for their transaction's marker:
        # producer id -> partition -> (the offset, its record's position in the log).
        self.pending_txn_offsets: dict[int, dict[TopicPartition, tuple[OffsetAndMetadata, int]]] = {}
        # The first rebalance waits group.initial.rebalance.delay.ms, longer while members keep joining.
        self.in_initial_delay = False
        self.new_member_added = False
        self.join_timer: asyncio.TimerHandle | None = None
        self.sync_timer: asyncio.TimerHandle | None = None
        # One write to __consumer_offsets at a time, held from the append until the change is
        # applied in memory: the group changes in the order of its records in the log, although
        # each write waits for the ISR (Kafka holds the group lock for the same reason).
        self.write_lock = asyncio.Lock()
        # Writes the coordinator started on its own (the Empty group after a rebalance emptied it).
        self.background_writes: set[asyncio.Task[None]] = set()

    def commit_offsets(self, offsets: dict[TopicPartition, OffsetAndMetadata], log_position: int) -> None:
        """Offsets whose records were written at ``log_position`` (or replayed from there)."""
        self.offsets.update(offsets)
        for tp in offsets:
            self.offset_log_positions[tp] = log_position

    def complete_txn_offsets(self, producer_id: int, committed: bool) -> None:
        """The producer's transaction ended: its pending offsets are applied (COMMIT), unless a
        later commit of the partition is in the log already, or dropped (ABORT)."""
        pending = self.pending_txn_offsets.pop(producer_id, None)
        if not pending or not committed:
            return
        for tp, (offset, position) in pending.items():
            if self.offset_log_positions.get(tp, -1) < position:
                self.offsets[tp] = offset
                self.offset_log_positions[tp] = position

    def has_pending_txn_offset(self, tp: TopicPartition) -> bool:
        return any(tp in pending for pending in self.pending_txn_offsets.values())

    def pending_txn_partitions(self) -> set[TopicPartition]:
        return {tp for pending in self.pending_txn_offsets.values() for tp in pending}

    def remove_offsets(self, partitions: Iterable[TopicPartition]) -> None:
        """The partitions' tombstones are written: as Kafka replays a tombstone, the committed
        offset goes and so do the pending offsets of open transactions for the partition (a
        later COMMIT must not bring back an offset that was deleted)."""
        for tp in partitions:
            self.offsets.pop(tp, None)
            self.offset_log_positions.pop(tp, None)
            for pending in self.pending_txn_offsets.values():
                pending.pop(tp, None)
        for producer_id in [p for p, pending in self.pending_txn_offsets.items() if not pending]:
            del self.pending_txn_offsets[producer_id]

    def __repr__(self) -> str:
        return (
            f"ClassicGroup({self.group_id}, {self.state.value}, generation={self.generation_id}, "
            f"members={len(self.members)})"
        )

    # --- state -------------------------------------------------------------------------------

    def is_(self, state: GroupState) -> bool:
        return self.state == state

    def can_transition_to(self, state: GroupState) -> bool:
        return self.state in _VALID_PREVIOUS_STATES[state]

    def transition_to(self, state: GroupState, now_ms: int) -> None:
        if not self.can_transition_to(state):
            raise AssertionError(f"group {self.group_id} cannot go from {self.state.value} to {state.value}")
        self.state = state
        self.current_state_timestamp = now_ms

    def cancel_timers(self) -> None:
        for timer in (self.join_timer, self.sync_timer, *self.pending_members.values()):
            if timer is not None:
                timer.cancel()
        self.join_timer = self.sync_timer = None
        for task in self.background_writes:
            task.cancel()
        for member in self.members.values():
            member.cancel_heartbeat()

    # --- members -----------------------------------------------------------------------------

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    def static_member_id(self, group_instance_id: str | None) -> str | None:
        return None if group_instance_id is None else self.static_members.get(group_instance_id)

    def is_static_member_fenced(self, member_id: str, group_instance_id: str | None) -> bool:
        """A request naming an instance id whose current member id is another one (KIP-345)."""
        if group_instance_id is None:
            return False
        current = self.static_members.get(group_instance_id)
        return current is not None and current != member_id

    def add_member(self, member: MemberMetadata) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        self.pending_sync_members.discard(member.member_id)

    def remove_member(self, member_id: str) -> MemberMetadata | None:
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        member.cancel_heartbeat()
        if (
            member.group_instance_id is not None
            and self.static_members.get(member.group_instance_id) == member_id
        ):
            del self.static_members[member.group_instance_id]
        self.pending_sync_members.discard(member_id)
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        return member

    def replace_static_member(
        self, group_instance_id: str, old_member_id: str, new_member_id: str
    ) -> MemberMetadata:
        member = self.members.pop(old_member_id)
        member.member_id = new_member_id
        self.members[new_member_id] = member
        self.static_members[group_instance_id] = new_member_id
        if self.leader_id == old_member_id:
            self.leader_id = new_member_id
        if old_member_id in self.pending_sync_members:
            self.pending_sync_members.discard(old_member_id)
            self.pending_sync_members.add(new_member_id)
        return member

    def has_all_members_joined(self) -> bool:
        return not self.pending_members and all(m.is_awaiting_join for m in self.members.values())

    def not_yet_rejoined_members(self) -> list[MemberMetadata]:
        return [m for m in self.members.values() if not m.is_awaiting_join]

    def rebalance_timeout_ms(self) -> int:
        """The longest rebalance timeout among the members: how long a rebalance may take."""
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    # --- protocols ---------------------------------------------------------------------------

    def candidate_protocols(self) -> set[str]:
        """The protocols every member supports."""
        members = iter(self.members.values())
        first = next(members, None)
        if first is None:
            return set()
        candidates = set(first.protocol_names)
        for member in members:
            candidates &= set(member.protocol_names)
        return candidates

    def supports_protocols(self, protocol_type: str, protocols: list[str]) -> bool:
        if not self.members:
            return bool(protocol_type) and bool(protocols)
        return protocol_type == self.protocol_type and bool(self.candidate_protocols() & set(protocols))

    def select_protocol(self) -> str:
        """Each member votes for its most preferred common protocol; the most votes win."""
        candidates = self.candidate_protocols()
        votes = collections.Counter(member.vote(candidates) for member in self.members.values())
        return max(votes.items(), key=lambda item: item[1])[0]

    def current_member_metadata(self) -> tuple[tuple[str, str | None, bytes], ...]:
        assert self.protocol_name is not None
        return tuple(
            (m.member_id, m.group_instance_id, m.metadata_for(self.protocol_name))
            for m in self.members.values()
        )

    def init_next_generation(self, now_ms: int) -> None:
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.transition_to(GroupState.COMPLETING_REBALANCE, now_ms)
        else:
            self.protocol_name = None
            self.transition_to(GroupState.EMPTY, now_ms)
        self.pending_sync_members = set(self.members)

    def subscribed_topics(self) -> set[str] | None:
        """Topics the members subscribe to, for the consumer protocol; None when unknown."""
        if self.protocol_type != "consumer" or self.protocol_name is None or not self.members:
            return None
        topics: set[str] = set()
        for member in self.members.values():
            if self.protocol_name not in member.protocol_names:
                # A static member rejoined with other protocols; the rebalance that follows
                # chooses again (Kafka keeps the subscription of the last generation instead).
                return None
            parsed = subscription_topics(member.metadata_for(self.protocol_name))
            if parsed is None:
                return None
            topics |= parsed
        return topics
