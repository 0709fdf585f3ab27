"""Issue 18: a fetch session's fetch costs what changed, not the size of the session.

In process, against a real ReplicaManager and real Partitions and logs: a session of 3,300
partitions (a follower's share of a 10,000-partition cluster) is read in full once, then an incremental fetch reads only the partitions that an
append, a high-watermark or log-start move, or a leadership change marked (plus those it lists),
and a waiting fetch wakes on its own session's partitions. The work is counted (partitions read
and resolved), never timed; the KIP-227 answers are checked alongside.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from strom.broker.control_plane.metadata import MetadataImage, PartitionState, TopicState
from strom.broker.fetch_session import (
    INITIAL_EPOCH,
    INVALID_SESSION_ID,
    FetchSessionCache,
    PartitionKey,
    RequestedPartition,
)
from strom.broker.handlers.fetch import read_partitions
from strom.broker.partition import TopicPartition
from strom.broker.replica_manager import FetchRequestPartition, FetchResult, ReplicaManager
from strom.protocol.errors import ErrorCode
from strom.storage import LogConfig, LogManager
from unit.storage.storage_batches import make_batch

PARTITIONS = 3_300  # a follower's session on each broker of a 3-broker cluster of 10,000 partitions
TOPIC = TopicState("big", uuid.UUID(int=18), [PartitionState(p, 0, 0, [0], [0]) for p in range(PARTITIONS)])


class Broker:
    """A single node's replica manager, metadata image and fetch sessions, with the partitions each
    read of the fetch path touched counted."""

    def __init__(self, tmp_path: Path) -> None:
        self.log_manager = LogManager([tmp_path / "logs"])
        self.log_manager.startup(lambda _: LogConfig())
        self.sessions = FetchSessionCache(10)
        self.replica_manager = ReplicaManager(
            self.log_manager, lambda topic: LogConfig(), node_id=0, fetch_sessions=self.sessions
        )
        self.image = MetadataImage()
        self.image.put(TOPIC)
        self.read: list[TopicPartition] = []
        read_from_local_log = self.replica_manager.read_from_local_log

        def counting(
            requests: list[FetchRequestPartition], *args: object, **kwargs: object
        ) -> tuple[dict[TopicPartition, FetchResult], int]:
            self.read.extend(r.tp for r in requests)
            return read_from_local_log(requests, *args, **kwargs)  # type: ignore[arg-type]

        self.replica_manager.read_from_local_log = counting  # type: ignore[method-assign]

    async def fetch(
        self,
        session_id: int,
        epoch: int,
        requested: list[RequestedPartition],
        forgotten: list[PartitionKey] | None = None,
        *,
        max_wait_ms: int = 0,
        max_bytes: int = 1 << 30,
    ) -> tuple[ErrorCode, int, dict[PartitionKey, FetchResult], int]:
        """One fetch as the handler makes it: its error, session id, the partitions answered
        (with their results) and how many partitions it resolved."""
        context = self.sessions.new_context(
            session_id, epoch, requested, forgotten or [], uses_topic_ids=False, privileged=False
        )
        assert context.error == ErrorCode.none, context.error
        resolved = len(context.partitions)
        try:
            results, tps = await read_partitions(
                self.image,
                self.replica_manager,
                context,
                by_id=False,
                replica_id=-1,
                max_wait_ms=max_wait_ms,
                min_bytes=1,
                max_bytes=max_bytes,
            )
            error, new_id, answered = context.respond(results, tps)
        finally:
            context.abandon()
        return error, new_id, {key: results[key] for key in answered}, resolved

    def append(self, partition: int, records: int = 1) -> None:
        tp = TopicPartition(TOPIC.name, partition)
        result = self.replica_manager.append_records(1, [(tp, make_batch(records))])[tp]
        assert result.error == ErrorCode.none


def key(partition: int) -> PartitionKey:
    return (TOPIC.name, partition)


def request(partition: int, offset: int = 0, max_bytes: int = 1 << 20) -> RequestedPartition:
    return RequestedPartition(key(partition), offset, max_bytes)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    # One broker of 3,300 partitions for the module (creating their logs is the slow part).
    broker = Broker(tmp_path_factory.mktemp("ready-set"))
    asyncio.run(broker.replica_manager.create_partitions(TOPIC))
    yield broker
    broker.log_manager.shutdown()


def open_session(broker: Broker, partitions: range) -> int:
    async def scenario() -> int:
        error, session_id, answered, _ = await broker.fetch(
            INVALID_SESSION_ID, INITIAL_EPOCH, [request(p, broker_offset(broker, p)) for p in partitions]
        )
        assert error == ErrorCode.none and session_id != INVALID_SESSION_ID
        assert len(answered) == len(partitions)  # a full fetch answers every partition
        return session_id

    return asyncio.run(scenario())


def broker_offset(broker: Broker, partition: int) -> int:
    found = broker.replica_manager.partition(TopicPartition(TOPIC.name, partition))
    assert found is not None
    return found.high_watermark


def test_an_incremental_fetch_reads_only_what_changed(broker: Broker) -> None:
    session_id = open_session(broker, range(PARTITIONS))
    assert len(broker.read) == PARTITIONS

    async def scenario() -> None:
        # Nothing changed: the fetch reads nothing and answers nothing.
        broker.read.clear()
        error, _, answered, resolved = await broker.fetch(session_id, 1, [])
        assert (error, answered, resolved, broker.read) == (ErrorCode.none, {}, 0, [])

        # One append among all the partitions: that partition alone is read and answered.
        broker.append(1234, records=3)
        error, _, answered, resolved = await broker.fetch(session_id, 2, [])
        assert error == ErrorCode.none
        assert list(answered) == [key(1234)] and answered[key(1234)].high_watermark == 3
        assert answered[key(1234)].records != b""
        assert (resolved, len(broker.read)) == (1, 1)

        # The fetcher moves on to offset 3 (listing the partition): read once, nothing new to say.
        broker.read.clear()
        error, _, answered, resolved = await broker.fetch(session_id, 3, [request(1234, 3)])
        assert (error, answered, resolved, len(broker.read)) == (ErrorCode.none, {}, 1, 1)
        broker.read.clear()
        error, _, answered, resolved = await broker.fetch(session_id, 4, [])
        assert (error, answered, resolved, broker.read) == (ErrorCode.none, {}, 0, [])

        # A waiting fetch wakes on an append to a partition of its session and reads only it.
        waiting = asyncio.ensure_future(broker.fetch(session_id, 5, [], max_wait_ms=30_000))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        broker.append(3299)
        error, _, answered, resolved = await asyncio.wait_for(waiting, 30)
        assert error == ErrorCode.none and list(answered) == [key(3299)]
        assert len(broker.read) == 1

        # A forgotten partition is no longer watched: its appends do not make the session read it.
        broker.read.clear()
        error, _, answered, _ = await broker.fetch(session_id, 6, [], [key(3299)])
        assert error == ErrorCode.none and answered == {}
        broker.append(3299)
        broker.read.clear()
        error, _, answered, resolved = await broker.fetch(session_id, 7, [])
        assert (error, answered, resolved, broker.read) == (ErrorCode.none, {}, 0, [])

        # The log start offset moves (DeleteRecords): answered with the new log start offset.
        tp = TopicPartition(TOPIC.name, 1234)
        partition = broker.replica_manager.partition(tp)
        assert partition is not None
        assert partition.delete_records_on_leader(2) == 2
        broker.replica_manager.report_log_start_offsets([tp])
        error, _, answered, resolved = await broker.fetch(session_id, 8, [])
        assert error == ErrorCode.none and list(answered) == [key(1234)]
        assert answered[key(1234)].log_start_offset == 2 and resolved == 1

        # A partition stopped (no longer hosted while the metadata still has it, as after a
        # reassignment away) answers NOT_LEADER_OR_FOLLOWER, at every fetch until it is forgotten;
        # the other partitions are not read.
        await broker.replica_manager.stop_partitions([TopicPartition(TOPIC.name, 17)], delete=False)
        for epoch in (9, 10):
            broker.read.clear()
            error, _, answered, resolved = await broker.fetch(session_id, epoch, [])
            assert error == ErrorCode.none and list(answered) == [key(17)]
            assert answered[key(17)].error == ErrorCode.not_leader_or_follower
            assert resolved == 1 and broker.read == []
        broker.read.clear()
        error, _, answered, resolved = await broker.fetch(session_id, 11, [], [key(17)])
        assert (error, answered, resolved, broker.read) == (ErrorCode.none, {}, 0, [])

        # The session ends: it watches nothing any more.
        assert broker.sessions.remove(session_id) is not None
        assert broker.sessions._watchers == {}

    asyncio.run(scenario())


def test_partitions_left_for_the_byte_limit_are_read_at_the_next_fetch(broker: Broker) -> None:
    partitions = range(100, 110)
    session_id = open_session(broker, partitions)
    for p in partitions:
        broker.append(p, records=5)

    async def scenario() -> None:
        # A byte limit of one batch: the first partition with data gets it, the others wait.
        seen: dict[PartitionKey, int] = {}
        epoch = 1
        while len(seen) < len(partitions):
            error, _, answered, _ = await broker.fetch(session_id, epoch, [], max_bytes=1)
            epoch += 1
            assert error == ErrorCode.none
            with_records = [k for k, result in answered.items() if result.records]
            assert len(with_records) == 1
            seen[with_records[0]] = epoch
            # The fetcher moves past what it got.
            error, _, answered, _ = await broker.fetch(
                session_id, epoch, [request(with_records[0][1], broker_offset(broker, with_records[0][1]))]
            )
            epoch += 1
            assert error == ErrorCode.none
        assert sorted(seen) == [key(p) for p in partitions]
        # All read: nothing is left ready.
        broker.read.clear()
        error, _, answered, resolved = await broker.fetch(session_id, epoch, [])
        assert (error, answered, resolved, broker.read) == (ErrorCode.none, {}, 0, [])
        broker.sessions.remove(session_id)

    asyncio.run(scenario())


def test_a_partition_added_by_a_waiting_fetch_wakes_it_when_appended_to(broker: Broker) -> None:
    """The fetch that adds a partition to its session reads it (empty), then waits: an append
    meanwhile wakes it and is answered. Watched only from the fetch's answer, the session missed
    that append and never read the partition again until the next one: a follower that added a
    new partition just before the leader's first produce never fetched it, and acks=all timed out
    (tests/cluster/test_truncation.py, on a busy machine)."""
    session_id = open_session(broker, range(200, 201))
    added = 201

    async def scenario() -> None:
        waiting = asyncio.ensure_future(
            broker.fetch(session_id, 1, [request(added, broker_offset(broker, added))], max_wait_ms=30_000)
        )
        await asyncio.sleep(0.05)
        assert not waiting.done()
        broker.append(added, records=2)
        error, _, answered, _ = await asyncio.wait_for(waiting, 30)
        assert error == ErrorCode.none and list(answered) == [key(added)]
        assert answered[key(added)].records != b""

    asyncio.run(scenario())
