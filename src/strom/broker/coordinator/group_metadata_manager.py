"""Groups and committed offsets in ``__consumer_offsets``: writing them, and loading them at startup.

A group lives in one partition of the offsets topic, chosen from its id exactly as
Kafka chooses it (Java's String.hashCode), so a Kafka client's or tool's idea of
where a group's records are matches Strom's. The topic is compacted: the latest
record per key is the state, a tombstone deletes it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from strom.broker.coordinator.group import ClassicGroup, GroupState, MemberMetadata, OffsetAndMetadata
from strom.broker.coordinator.loader import LOAD_SLICE_BYTES, CoordinatorLoader, replay_records
from strom.broker.coordinator.records import (
    CoordinatorRecordError,
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadataValue,
    OffsetCommitKey,
    OffsetCommitValue,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
    encode_group_metadata_key,
    encode_group_metadata_value,
    encode_offset_commit_key,
    encode_offset_commit_value,
)
from strom.broker.partition import TopicPartition
from strom.broker.replica_manager import ReplicaManager
from strom.protocol.errors import ErrorCode
from strom.records.codec import RecordSpec, encode_batch
from strom.storage.append_origin import AppendOrigin

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"


def java_string_hash(value: str) -> int:
    """Java's String.hashCode over UTF-16 code units, as a signed 32-bit int."""
    h = 0
    data = value.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(group_id: str, num_partitions: int) -> int:
    """Kafka's abs(hashCode) % partitions, where abs(Integer.MIN_VALUE) is 0."""
    h = java_string_hash(group_id)
    return (0 if h == -(2**31) else abs(h)) % num_partitions


@dataclass(frozen=True, slots=True)
class AppendOutcome:
    error: ErrorCode
    message: str | None = None
    base_offset: int = -1  # where the records landed, when they did


@dataclass(frozen=True, slots=True)
class TransactionalProducer:
    """The producer whose transaction a transactional offset commit belongs to."""

    producer_id: int
    producer_epoch: int


class GroupMetadataManager:
    def __init__(
        self,
        replica_manager: ReplicaManager,
        num_partitions: int,
        time_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        commit_timeout_ms: int = 5000,
    ) -> None:
        self._replica_manager = replica_manager
        self.num_partitions = num_partitions
        # offsets.commit.timeout.ms: how long a write waits for the ISR before it fails.
        self._commit_timeout_ms = commit_timeout_ms
        self._time_ms = time_ms
        self.loader = CoordinatorLoader()

    def partition_of(self, group_id: str) -> TopicPartition:
        return TopicPartition(OFFSETS_TOPIC, partition_for(group_id, self.num_partitions))

    # --- writing -------------------------------------------------------------------------

    async def _append(
        self,
        group_id: str,
        records: list[RecordSpec],
        *,
        offsets: bool,
        producer: TransactionalProducer | None = None,
        verification_guard: object | None = None,
    ) -> AppendOutcome:
        """Append ``records`` to the group's offsets partition with acks=-1 and answer once the
        HW passes them (or offsets.commit.timeout.ms passes): only then does a commit or an
        assignment survive the loss of this broker, so only then may the caller apply it in
        memory and answer its client. On a single node the HW moves with the append."""
        tp = self.partition_of(group_id)
        if producer is None:
            batch = encode_batch(records)
            origin = AppendOrigin.CLIENT
        else:
            # A transactional batch of the producer (no sequence: the coordinator's own write).
            batch = encode_batch(
                records,
                producer_id=producer.producer_id,
                producer_epoch=producer.producer_epoch,
                is_transactional=True,
            )
            origin = AppendOrigin.COORDINATOR
        guards = (
            {tp: (producer.producer_id, verification_guard)}
            if producer is not None and verification_guard is not None
            else None
        )
        results = await self._replica_manager.append(
            -1, [(tp, batch)], timeout_ms=self._commit_timeout_ms, origin=origin, verification_guards=guards
        )
        result = results[tp]
        if result.error == ErrorCode.none:
            return AppendOutcome(ErrorCode.none, base_offset=result.base_offset)
        log.warning(
            "writing to the offsets topic failed",
            extra={"group": group_id, "partition": str(tp), "error": result.error.name},
        )
        # Kafka's mapping (GroupCoordinatorService): the partition is not usable here right now,
        # or no longer led here; a record set too large is the commit's fault only for offsets.
        if result.error in (
            ErrorCode.unknown_topic_or_partition,
            ErrorCode.not_enough_replicas,
            ErrorCode.not_enough_replicas_after_append,
            ErrorCode.request_timed_out,
        ):
            return AppendOutcome(ErrorCode.coordinator_not_available, result.error_message)
        if result.error in (ErrorCode.not_leader_or_follower, ErrorCode.kafka_storage_error):
            return AppendOutcome(ErrorCode.not_coordinator, result.error_message)
        if producer is not None and result.error in (
            ErrorCode.invalid_producer_epoch,
            ErrorCode.invalid_txn_state,
        ):
            return AppendOutcome(result.error, result.error_message)  # the producer's, not the coordinator's
        if offsets and result.error in (
            ErrorCode.message_too_large,
            ErrorCode.record_list_too_large,
            ErrorCode.invalid_fetch_size,
        ):
            return AppendOutcome(ErrorCode.invalid_commit_offset_size, result.error_message)
        return AppendOutcome(ErrorCode.unknown_server_error, result.error_message)

    async def store_group(self, group: ClassicGroup) -> AppendOutcome:
        """Write the group's metadata record: generation, protocol, leader, members and assignments."""
        value = GroupMetadataValue(
            protocol_type=group.protocol_type or "",
            generation=group.generation_id,
            protocol=group.protocol_name,
            leader=group.leader_id,
            current_state_timestamp=group.current_state_timestamp,
            members=[
                MemberMetadataValue(
                    member_id=m.member_id,
                    group_instance_id=m.group_instance_id,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    rebalance_timeout=m.rebalance_timeout_ms,
                    session_timeout=m.session_timeout_ms,
                    subscription=m.metadata_for(group.protocol_name) if group.protocol_name else b"",
                    assignment=m.assignment,
                )
                for m in group.members.values()
            ],
        )
        record = RecordSpec(
            encode_group_metadata_key(GroupMetadataKey(group.group_id)), encode_group_metadata_value(value)
        )
        return await self._append(group.group_id, [record], offsets=False)

    async def store_offsets(
        self,
        group_id: str,
        offsets: dict[TopicPartition, OffsetAndMetadata],
        producer: TransactionalProducer | None = None,
        verification_guard: object | None = None,
    ) -> AppendOutcome:
        """The offsets' records; with ``producer``, as one batch of its transaction (its first in
        the partition appended only while ``verification_guard``, from ``start_verification``,
        holds)."""
        records = [
            RecordSpec(
                encode_offset_commit_key(OffsetCommitKey(group_id, tp.topic, tp.partition)),
                encode_offset_commit_value(
                    OffsetCommitValue(
                        o.offset, o.leader_epoch, o.metadata, o.commit_timestamp, o.expire_timestamp
                    )
                ),
            )
            for tp, o in offsets.items()
        ]
        return await self._append(
            group_id, records, offsets=True, producer=producer, verification_guard=verification_guard
        )

    def start_verification(self, group_id: str, producer_id: int) -> object | None:
        """A KIP-890 guard for the producer's first transactional write to the group's offsets
        partition, to hold while its coordinator confirms the transaction; None when the
        transaction is open there already (or the partition is not here: the append answers)."""
        partition = self._replica_manager.partition(self.partition_of(group_id))
        return partition.start_verification(producer_id) if partition is not None else None

    def transaction_open(self, group_id: str, producer_id: int) -> bool:
        """Whether the producer's transaction is still open in the group's offsets partition (its
        marker has not landed there)."""
        partition = self._replica_manager.partition(self.partition_of(group_id))
        entry = partition.log.producer_state.last_entry(producer_id) if partition is not None else None
        return entry is not None and entry.current_txn_first_offset >= 0

    async def delete_offsets(self, group_id: str, tps: Iterable[TopicPartition]) -> AppendOutcome:
        records = [
            RecordSpec(encode_offset_commit_key(OffsetCommitKey(group_id, tp.topic, tp.partition)), None)
            for tp in tps
        ]
        if not records:
            return AppendOutcome(ErrorCode.none)
        return await self._append(group_id, records, offsets=True)

    async def delete_group(self, group: ClassicGroup) -> AppendOutcome:
        """Tombstones for every offset of the group, its open transactions' pending ones
        included (as Kafka deletes a group), and for its metadata."""
        records = [
            RecordSpec(
                encode_offset_commit_key(OffsetCommitKey(group.group_id, tp.topic, tp.partition)), None
            )
            for tp in group.offsets.keys() | group.pending_txn_partitions()
        ]
        records.append(RecordSpec(encode_group_metadata_key(GroupMetadataKey(group.group_id)), None))
        return await self._append(group.group_id, records, offsets=False)

    # --- loading -------------------------------------------------------------------------

    def load(self, partitions: Iterable[int] | None = None) -> dict[str, ClassicGroup]:
        """Every group and offset in the offsets topic's ``partitions`` (None: all), replayed in
        offset order up to the log end, as Kafka loads: a new leader's log is the partition's
        truth, and what it holds above its HW (a former leader's last writes, acknowledged once
        the ISR had them) becomes committed as its followers fetch it. Blocking: a single node
        loads this way at startup, before it serves anyone."""
        started = time.monotonic()
        groups: dict[str, ClassicGroup] = {}
        records = skipped = 0
        for partition_index in range(self.num_partitions) if partitions is None else partitions:
            partition = self._replica_manager.partition(TopicPartition(OFFSETS_TOPIC, partition_index))
            if partition is None or partition.offline:  # an offline log dir answers KAFKA_STORAGE_ERROR
                continue
            state = GroupLoad(partition_index)
            offset = partition.log_start_offset
            while offset < partition.log_end_offset:
                data = partition.read_records(
                    offset, LOAD_SLICE_BYTES, min_one_batch=True, up_to_log_end=True
                ).records
                if not data:
                    break
                next_offset, replayed = replay_records(data, state.replay, transactions=state)
                if next_offset <= offset:
                    break
                offset = next_offset
                records += replayed
            groups.update(state.groups(self._time_ms()))
            skipped += state.skipped
        log.info(
            "loaded groups",
            extra={
                "groups": len(groups),
                "records": records,
                "skipped": skipped,
                "ms": int((time.monotonic() - started) * 1000),
            },
        )
        return groups

    async def load_partition(
        self, partition_index: int, is_current: Callable[[], bool]
    ) -> dict[str, ClassicGroup] | None:
        """The groups of one offsets partition, replayed on the load worker (see loader); None
        when ``is_current`` turned false meanwhile (the caller must not adopt a stale load)."""
        partition = self._replica_manager.partition(TopicPartition(OFFSETS_TOPIC, partition_index))
        if partition is None or partition.offline:  # an offline log dir answers KAFKA_STORAGE_ERROR
            return {}
        state = GroupLoad(partition_index)
        stats = await self.loader.load(partition, state.replay, is_current, state)
        if stats is None:
            return None
        now = self._time_ms()
        groups = await self.loader.run(lambda: state.groups(now))
        if not is_current():
            return None
        log.info(
            "loaded groups",
            extra={
                "partition": partition_index,
                "groups": len(groups),
                "records": stats.records,
                "skipped": state.skipped,
                "ms": stats.millis,
            },
        )
        return groups


class GroupLoad:
    """The state a load of one offsets partition replays records into (on the load worker).

    Offsets of a transaction (TxnOffsetCommit) are held per producer until its marker: applied
    at a COMMIT unless a later commit of the partition came first in the log, dropped at an
    ABORT; a transaction still open at the log end stays pending in its group, for the marker
    that will end it."""

    def __init__(self, partition_index: int) -> None:
        self.partition_index = partition_index
        self.metadata: dict[str, GroupMetadataValue] = {}
        # group -> partition -> (offset, its record's log position)
        self.offsets: dict[str, dict[TopicPartition, tuple[OffsetAndMetadata, int]]] = {}
        # producer id -> group -> partition -> (offset, log position)
        self.pending: dict[int, dict[str, dict[TopicPartition, tuple[OffsetAndMetadata, int]]]] = {}
        self.skipped = 0
        self._producer_id = -1  # of the batch being replayed (-1: not transactional)
        self._batch_offset = -1

    def start_batch(self, producer_id: int, offset: int) -> None:
        self._producer_id, self._batch_offset = producer_id, offset

    def end_transaction(self, producer_id: int, committed: bool, offset: int) -> None:
        pending = self.pending.pop(producer_id, None)
        if pending is None or not committed:
            return
        for group_id, offsets in pending.items():
            group_offsets = self.offsets.setdefault(group_id, {})
            for tp, (value, position) in offsets.items():
                current = group_offsets.get(tp)
                if current is None or current[1] < position:
                    group_offsets[tp] = (value, position)

    def replay(self, key_bytes: bytes | None, value_bytes: bytes | None, offset: int) -> None:
        if key_bytes is None:
            self.skipped += 1
            return
        try:
            key = decode_key(key_bytes)
            if isinstance(key, OffsetCommitKey):
                self._replay_offset(key, value_bytes, offset)
            elif isinstance(key, GroupMetadataKey):
                if value_bytes is None:
                    self.metadata.pop(key.group, None)
                else:
                    self.metadata[key.group] = decode_group_metadata_value(value_bytes)
        except CoordinatorRecordError as e:
            self.skipped += 1
            log.warning(
                "skipping an unreadable offsets-topic record",
                extra={"partition": self.partition_index, "offset": offset, "error": str(e)},
            )

    def _replay_offset(self, key: OffsetCommitKey, value_bytes: bytes | None, offset: int) -> None:
        tp = TopicPartition(key.topic, key.partition)
        if value_bytes is None:
            # A tombstone deletes the committed offset and any open transaction's pending one.
            group_offsets = self.offsets.get(key.group)
            if group_offsets is not None:
                group_offsets.pop(tp, None)
                if not group_offsets:
                    del self.offsets[key.group]
            for producer_id, by_group in list(self.pending.items()):
                pending = by_group.get(key.group)
                if pending is not None and pending.pop(tp, None) is not None and not pending:
                    del by_group[key.group]
                    if not by_group:
                        del self.pending[producer_id]
            return
        if self._producer_id >= 0:
            v = decode_offset_commit_value(value_bytes)
            value = OffsetAndMetadata(
                v.offset, v.leader_epoch, v.metadata, v.commit_timestamp, v.expire_timestamp
            )
            self.pending.setdefault(self._producer_id, {}).setdefault(key.group, {})[tp] = (value, offset)
            return
        v = decode_offset_commit_value(value_bytes)
        self.offsets.setdefault(key.group, {})[tp] = (
            OffsetAndMetadata(v.offset, v.leader_epoch, v.metadata, v.commit_timestamp, v.expire_timestamp),
            offset,
        )

    def groups(self, now_ms: int) -> dict[str, ClassicGroup]:
        groups = {}
        pending_groups = {g for by_group in self.pending.values() for g in by_group}
        for group_id in self.metadata.keys() | self.offsets.keys() | pending_groups:
            group = _group_from_records(group_id, self.metadata.get(group_id), now_ms)
            for tp, (value, position) in self.offsets.get(group_id, {}).items():
                group.offsets[tp] = value
                group.offset_log_positions[tp] = position
            for producer_id, by_group in self.pending.items():
                if group_id in by_group:
                    group.pending_txn_offsets[producer_id] = dict(by_group[group_id])
            groups[group_id] = group
        return groups


def _group_from_records(group_id: str, value: GroupMetadataValue | None, now_ms: int) -> ClassicGroup:
    """A loaded group is Stable when it had members (they keep heartbeating), else Empty."""
    if value is None:
        return ClassicGroup(group_id, now_ms)
    state = GroupState.STABLE if value.members else GroupState.EMPTY
    timestamp = value.current_state_timestamp if value.current_state_timestamp >= 0 else now_ms
    group = ClassicGroup(group_id, timestamp, state)
    group.generation_id = value.generation
    group.protocol_type = value.protocol_type or None
    group.protocol_name = value.protocol
    for m in value.members:
        group.add_member(
            MemberMetadata(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                rebalance_timeout_ms=m.rebalance_timeout,
                session_timeout_ms=m.session_timeout,
                protocol_type=value.protocol_type,
                protocols=[(value.protocol or "", m.subscription)],
                assignment=m.assignment,
            )
        )
    group.leader_id = value.leader if value.leader in group.members else group.leader_id
    group.pending_sync_members.clear()
    return group
