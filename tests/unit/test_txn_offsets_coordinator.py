"""TxnOffsetCommit through the group coordinator on a real offsets partition: the offsets are
written as a transactional batch, stay pending (not fetched, UNSTABLE_OFFSET_COMMIT with
require_stable, not expired) until the marker path (``write_markers_locally``) lands the
transaction's COMMIT or ABORT; a stale producer epoch is refused; a tombstone (OffsetDelete,
DeleteGroups) drops pending offsets too; and a reload from the log ends in the same state."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from strom.broker.control_plane.metadata import PartitionState, TopicState
from strom.broker.coordinator.group import OffsetAndMetadata
from strom.broker.coordinator.group_coordinator import GroupConfig, GroupCoordinator, JoinRequest
from strom.broker.coordinator.group_metadata_manager import GroupMetadataManager, TransactionalProducer
from strom.broker.partition import TopicPartition
from strom.broker.replica_manager import ReplicaManager
from strom.broker.transaction.markers import TxnMarker, write_markers_locally
from strom.protocol.errors import ErrorCode
from strom.records.control import ControlRecordType
from strom.storage import LogConfig, LogManager

OFFSETS_TP = TopicPartition("__consumer_offsets", 0)
TP, TP1 = TopicPartition("t", 0), TopicPartition("t", 1)
PRODUCER = TransactionalProducer(producer_id=4000, producer_epoch=3)
RETENTION_MS = 24 * 3600 * 1000
T0 = 1_700_000_000_000


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


@dataclass
class Broker:
    log_manager: LogManager
    replica_manager: ReplicaManager
    clock: Clock
    coordinator: GroupCoordinator | None = None

    def start(self) -> GroupCoordinator:
        """A coordinator that loads the offsets partition as it is now (a restart)."""
        if self.coordinator is not None:
            self.coordinator.shutdown()
        config = GroupConfig(
            min_session_timeout_ms=1000,
            max_session_timeout_ms=RETENTION_MS,
            initial_rebalance_delay_ms=0,
            max_size=100,
            offsets_retention_ms=RETENTION_MS,
            offset_metadata_max_bytes=4096,
        )
        manager = GroupMetadataManager(self.replica_manager, 1)
        self.coordinator = GroupCoordinator(config, manager, lambda: None, time_ms=self.clock)
        self.coordinator.startup()
        return self.coordinator

    async def marker(self, committed: bool, producer: TransactionalProducer = PRODUCER) -> None:
        assert self.coordinator is not None
        result = ControlRecordType.COMMIT if committed else ControlRecordType.ABORT
        marker = TxnMarker(producer.producer_id, producer.producer_epoch, 0, result, (OFFSETS_TP,))
        errors = await write_markers_locally(self.replica_manager, self.coordinator, marker, 1000)
        assert errors == {OFFSETS_TP: ErrorCode.none}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    log_manager = LogManager([tmp_path / "logs"])
    log_manager.startup(lambda _: LogConfig())
    replica_manager = ReplicaManager(log_manager, lambda topic: LogConfig(cleanup_policy="compact"))
    replica_manager.lead_on_single_node(
        TopicState(OFFSETS_TP.topic, uuid.UUID(int=1), [PartitionState(0, 0, 0, [0], [0])])
    )
    broker = Broker(log_manager, replica_manager, Clock())
    yield broker
    if broker.coordinator is not None:
        broker.coordinator.shutdown()
    log_manager.shutdown()


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())  # type: ignore[arg-type]


def offset(value: int, clock: Clock) -> OffsetAndMetadata:
    return OffsetAndMetadata(value, -1, "", clock.now)


async def txn_commit(
    coordinator: GroupCoordinator,
    group: str,
    offsets: dict[TopicPartition, OffsetAndMetadata],
    *,
    producer: TransactionalProducer = PRODUCER,
    generation: int = -1,
    member: str = "",
    instance: str | None = None,
) -> dict[TopicPartition, ErrorCode]:
    return await coordinator.commit_transactional_offsets(
        group, producer, generation, member, instance, offsets
    )


def committed(coordinator: GroupCoordinator, group: str, tp: TopicPartition = TP) -> int | None:
    found = coordinator.fetch_offsets(group, [tp])[tp]
    return None if found is None else found.offset


def test_offsets_stay_pending_until_the_commit_marker_lands(broker: Broker) -> None:
    async def scenario() -> None:
        coordinator = broker.start()
        plain = await coordinator.commit_offsets("g", -1, "", None, {TP: offset(5, broker.clock)}, 8)
        assert plain == {TP: ErrorCode.none}
        assert await txn_commit(coordinator, "g", {TP: offset(10, broker.clock)}) == {TP: ErrorCode.none}
        # Not visible: the last committed offset is what a fetch answers; require_stable waits.
        assert committed(coordinator, "g") == 5
        assert coordinator.unstable_offsets("g", [TP, TP1]) == {TP}
        await broker.marker(committed=True)
        assert committed(coordinator, "g") == 10
        assert coordinator.unstable_offsets("g", [TP]) == set()

    run(scenario)
    # The batch in the log is the producer's transactional batch.
    partition = broker.replica_manager.partition(OFFSETS_TP)
    assert partition is not None
    entry = partition.log.producer_state.last_entry(PRODUCER.producer_id)
    assert entry is not None and entry.producer_epoch == PRODUCER.producer_epoch


def test_an_abort_drops_the_pending_offsets(broker: Broker) -> None:
    async def scenario() -> None:
        coordinator = broker.start()
        assert await txn_commit(coordinator, "g", {TP: offset(10, broker.clock)}) == {TP: ErrorCode.none}
        await broker.marker(committed=False)
        assert committed(coordinator, "g") is None
        assert coordinator.unstable_offsets("g", [TP]) == set()

    run(scenario)


def test_a_plain_commit_written_after_the_transactions_offsets_wins(broker: Broker) -> None:
    async def scenario() -> None:
        coordinator = broker.start()
        await txn_commit(coordinator, "g", {TP: offset(10, broker.clock), TP1: offset(11, broker.clock)})
        plain = await coordinator.commit_offsets("g", -1, "", None, {TP: offset(99, broker.clock)}, 8)
        assert plain == {TP: ErrorCode.none}
        await broker.marker(committed=True)
        assert (committed(coordinator, "g"), committed(coordinator, "g", TP1)) == (99, 11)
        reloaded = broker.start()  # a reload of the log ends the same way
        assert (committed(reloaded, "g"), committed(reloaded, "g", TP1)) == (99, 11)

    run(scenario)


def test_a_transaction_open_at_a_reload_stays_pending_until_its_marker(broker: Broker) -> None:
    async def scenario() -> None:
        await txn_commit(broker.start(), "g", {TP: offset(10, broker.clock)})
        coordinator = broker.start()  # restarted: the transaction is still open in the log
        assert committed(coordinator, "g") is None
        assert coordinator.unstable_offsets("g", [TP]) == {TP}
        await broker.marker(committed=True)
        assert committed(coordinator, "g") == 10

    run(scenario)


def test_a_stale_producer_epoch_is_refused(broker: Broker) -> None:
    async def scenario() -> None:
        coordinator = broker.start()
        assert await txn_commit(coordinator, "g", {TP: offset(10, broker.clock)}) == {TP: ErrorCode.none}
        await broker.marker(committed=False)
        zombie = TransactionalProducer(PRODUCER.producer_id, PRODUCER.producer_epoch - 1)
        errors = await txn_commit(coordinator, "g", {TP: offset(20, broker.clock)}, producer=zombie)
        assert errors == {TP: ErrorCode.invalid_producer_epoch}
        assert coordinator.unstable_offsets("g", [TP]) == set() and committed(coordinator, "g") is None

    run(scenario)


async def stable_member(
    coordinator: GroupCoordinator, group: str, instance: str | None = None
) -> tuple[str, int]:
    joined = await coordinator.join_group(
        JoinRequest(
            group_id=group,
            member_id="",
            group_instance_id=instance,
            client_id="c",
            client_host="/127.0.0.1",
            session_timeout_ms=RETENTION_MS,
            rebalance_timeout_ms=1000,
            protocol_type="consumer",
            protocols=[("range", b"")],
            require_known_member_id=False,
            supports_skip_assignment=True,
        )
    )
    assert joined.error == ErrorCode.none
    synced = await coordinator.sync_group(
        group, joined.generation_id, joined.member_id, instance, None, None, {joined.member_id: b""}
    )
    assert synced.error == ErrorCode.none
    return joined.member_id, joined.generation_id


def test_member_fields_are_checked_as_kafka_checks_them(broker: Broker) -> None:
    async def scenario() -> None:
        coordinator = broker.start()
        offsets = {TP: offset(10, broker.clock)}
        # No group yet: a generation it never had; without one, a simple group is created.
        assert await txn_commit(coordinator, "new", offsets, generation=1, member="m") == {
            TP: ErrorCode.illegal_generation
        }
        member, generation = await stable_member(coordinator, "g", instance="i")
        cases = [
            ({"generation": generation, "member": "other"}, ErrorCode.unknown_member_id),
            ({"generation": generation + 1, "member": member}, ErrorCode.illegal_generation),
            ({"generation": generation, "member": "other", "instance": "i"}, ErrorCode.fenced_instance_id),
            ({}, ErrorCode.none),  # v0-v2: no member fields, accepted although the group has members
            ({"generation": generation, "member": member, "instance": "i"}, ErrorCode.none),
        ]
        for fields, expected in cases:
            assert await txn_commit(coordinator, "g", offsets, **fields) == {TP: expected}, fields  # type: ignore[arg-type]
        assert await txn_commit(coordinator, "", offsets) == {TP: ErrorCode.invalid_group_id}

    run(scenario)


def test_an_offset_delete_drops_a_pending_offset_for_good(broker: Broker) -> None:
    async def scenario() -> None:
        coordinator = broker.start()
        await txn_commit(coordinator, "g", {TP: offset(10, broker.clock)})
        error, results = await coordinator.delete_offsets("g", [TP])
        assert (error, results) == (ErrorCode.none, {TP: ErrorCode.none})
        assert coordinator.unstable_offsets("g", [TP]) == set()
        await broker.marker(committed=True)  # the COMMIT does not bring it back
        assert committed(coordinator, "g") is None
        assert committed(broker.start(), "g") is None  # nor does a reload of the log

    run(scenario)


def test_deleting_an_empty_group_deletes_its_pending_offsets(broker: Broker) -> None:
    async def scenario() -> None:
        coordinator = broker.start()
        await txn_commit(coordinator, "g", {TP: offset(10, broker.clock)})
        assert await coordinator.delete_groups(["g"]) == {"g": ErrorCode.none}
        assert coordinator.group("g") is None
        await broker.marker(committed=True)
        assert committed(coordinator, "g") is None
        assert broker.start().group("g") is None

    run(scenario)


def test_offsets_with_a_pending_transaction_do_not_expire(broker: Broker) -> None:
    async def scenario() -> None:
        coordinator = broker.start()
        await coordinator.commit_offsets("g", -1, "", None, {TP: offset(5, broker.clock)}, 8)
        await txn_commit(coordinator, "g", {TP: offset(10, broker.clock), TP1: offset(11, broker.clock)})
        broker.clock.now += 2 * RETENTION_MS
        assert await coordinator.expire_offsets() == 0
        assert coordinator.group("g") is not None and committed(coordinator, "g") == 5
        await broker.marker(committed=False)
        assert await coordinator.expire_offsets() == 1  # now the committed one may go, and the group
        assert coordinator.group("g") is None

    run(scenario)


def test_the_transactions_first_write_to_the_offsets_partition_is_verified(broker: Broker) -> None:
    asked: list[TopicPartition] = []
    answer = ErrorCode.invalid_txn_state

    async def verify(tp: TopicPartition) -> ErrorCode:
        asked.append(tp)
        return answer

    async def scenario() -> None:
        nonlocal answer
        coordinator = broker.start()
        offsets = {TP: offset(10, broker.clock)}
        # Not in the transaction (a commit arriving after its end): refused, nothing written.
        errors = await coordinator.commit_transactional_offsets("g", PRODUCER, -1, "", None, offsets, verify)
        assert errors == {TP: ErrorCode.invalid_txn_state}
        assert coordinator.unstable_offsets("g", [TP]) == set()
        partition = broker.replica_manager.partition(OFFSETS_TP)
        assert partition is not None and partition.log_end_offset == 0
        answer = ErrorCode.none
        errors = await coordinator.commit_transactional_offsets("g", PRODUCER, -1, "", None, offsets, verify)
        assert errors == {TP: ErrorCode.none}
        # The transaction is open in the partition now: later commits of it are not asked about.
        errors = await coordinator.commit_transactional_offsets("g", PRODUCER, -1, "", None, offsets, verify)
        assert errors == {TP: ErrorCode.none}
        assert asked == [OFFSETS_TP, OFFSETS_TP]

    run(scenario)
