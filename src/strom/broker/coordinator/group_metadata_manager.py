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
from strom.records.codec import RecordSpec, decode_batches, encode_batch

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"
_LOAD_READ_BYTES = 4 * 1024 * 1024


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

    def partition_of(self, group_id: str) -> TopicPartition:
        return TopicPartition(OFFSETS_TOPIC, partition_for(group_id, self.num_partitions))

    # --- writing -------------------------------------------------------------------------

    async def _append(self, group_id: str, records: list[RecordSpec], *, offsets: bool) -> AppendOutcome:
        """Append ``records`` to the group's offsets partition with acks=-1 and answer once the
        HW passes them (or offsets.commit.timeout.ms passes): only then does a commit or an
        assignment survive the loss of this broker, so only then may the caller apply it in
        memory and answer its client. On a single node the HW moves with the append."""
        tp = self.partition_of(group_id)
        batch = encode_batch(records)
        results = await self._replica_manager.append(-1, [(tp, batch)], timeout_ms=self._commit_timeout_ms)
        result = results[tp]
        if result.error == ErrorCode.none:
            return AppendOutcome(ErrorCode.none)
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
        self, group_id: str, offsets: dict[TopicPartition, OffsetAndMetadata]
    ) -> AppendOutcome:
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
        return await self._append(group_id, records, offsets=True)

    async def delete_offsets(self, group_id: str, tps: Iterable[TopicPartition]) -> AppendOutcome:
        records = [
            RecordSpec(encode_offset_commit_key(OffsetCommitKey(group_id, tp.topic, tp.partition)), None)
            for tp in tps
        ]
        if not records:
            return AppendOutcome(ErrorCode.none)
        return await self._append(group_id, records, offsets=True)

    async def delete_group(self, group: ClassicGroup) -> AppendOutcome:
        """Tombstones for every offset of the group and for its metadata."""
        records = [
            RecordSpec(
                encode_offset_commit_key(OffsetCommitKey(group.group_id, tp.topic, tp.partition)), None
            )
            for tp in group.offsets
        ]
        records.append(RecordSpec(encode_group_metadata_key(GroupMetadataKey(group.group_id)), None))
        return await self._append(group.group_id, records, offsets=False)

    # --- loading -------------------------------------------------------------------------

    def load(self, partitions: Iterable[int] | None = None) -> dict[str, ClassicGroup]:
        """Every group and offset in the offsets topic's ``partitions`` (None: all), replayed in
        offset order up to the log end, as Kafka loads: a new leader's log is the partition's
        truth, and what it holds above its HW (a former leader's last writes, acknowledged once
        the ISR had them) becomes committed as its followers fetch it."""
        started = time.monotonic()
        metadata: dict[str, GroupMetadataValue] = {}
        offsets: dict[str, dict[TopicPartition, OffsetAndMetadata]] = {}
        records = skipped = 0
        for partition_index in range(self.num_partitions) if partitions is None else partitions:
            partition = self._replica_manager.partition(TopicPartition(OFFSETS_TOPIC, partition_index))
            if partition is None or partition.offline:  # an offline log dir answers KAFKA_STORAGE_ERROR
                continue
            offset = partition.log_start_offset
            while offset < partition.log_end_offset:
                data = partition.read_records(
                    offset, _LOAD_READ_BYTES, min_one_batch=True, up_to_log_end=True
                ).records
                if not data:
                    break
                for batch in decode_batches(data):
                    offset = batch.header.last_offset + 1
                    if batch.header.is_control:
                        continue
                    for record in batch.records:
                        if record.key is None:
                            skipped += 1
                            continue
                        try:
                            self._replay(record.key, record.value, metadata, offsets)
                            records += 1
                        except CoordinatorRecordError as e:
                            skipped += 1
                            log.warning(
                                "skipping an unreadable offsets-topic record",
                                extra={
                                    "partition": partition_index,
                                    "offset": record.offset,
                                    "error": str(e),
                                },
                            )
        groups = {}
        now = self._time_ms()
        for group_id in metadata.keys() | offsets.keys():
            group = _group_from_records(group_id, metadata.get(group_id), now)
            group.offsets = offsets.get(group_id, {})
            groups[group_id] = group
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

    @staticmethod
    def _replay(
        key_bytes: bytes,
        value_bytes: bytes | None,
        metadata: dict[str, GroupMetadataValue],
        offsets: dict[str, dict[TopicPartition, OffsetAndMetadata]],
    ) -> None:
        key = decode_key(key_bytes)
        if isinstance(key, OffsetCommitKey):
            tp = TopicPartition(key.topic, key.partition)
            if value_bytes is None:
                group_offsets = offsets.get(key.group)
                if group_offsets is not None:
                    group_offsets.pop(tp, None)
                    if not group_offsets:
                        del offsets[key.group]
                return
            v = decode_offset_commit_value(value_bytes)
            offsets.setdefault(key.group, {})[tp] = OffsetAndMetadata(
                v.offset, v.leader_epoch, v.metadata, v.commit_timestamp, v.expire_timestamp
            )
        elif isinstance(key, GroupMetadataKey):
            if value_bytes is None:
                metadata.pop(key.group, None)
            else:
                metadata[key.group] = decode_group_metadata_value(value_bytes)


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
