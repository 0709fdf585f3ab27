"""Kafka's Partition/ReplicaManager leader logic: HW over the ISR, ISR shrink and expand through
the cluster link, min.insync.replicas and delayed (acks=all) produces.

The cluster link is a fake here (a dict of partition states with a version check): these tests
are about one broker's decisions; tests/integration/test_replication.py runs real brokers."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from strom.broker.control_plane.metadata import PartitionState, TopicState
from strom.broker.partition import Partition, TopicPartition
from strom.broker.replica_fetcher import truncation_offset
from strom.broker.replica_manager import FetchRequestPartition, ReplicaManager, ReplicationConfig
from strom.protocol.errors import ErrorCode
from strom.storage import LogConfig, LogManager, UnifiedLog
from unit.storage.storage_batches import make_batch

TP = TopicPartition("t", 0)
LAG_MS = 1000


class FakeLink:
    """Conditional ISR writes against a versioned state, as the ZooKeeper state znode does."""

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.states: dict[tuple[str, int], PartitionState] = {}
        self.writes: list[PartitionState] = []
        self.gate: asyncio.Event | None = None
        # The live brokers' epochs (KIP-903) and hosts.
        self.epochs: dict[int, int] = {1: 101, 2: 102, 3: 103}

    def broker_endpoint(self, broker_id: int) -> tuple[str, int] | None:
        return (f"127.0.0.1{broker_id}", 9092) if broker_id in self.epochs else None

    def broker_epoch(self, broker_id: int) -> int | None:
        return self.epochs.get(broker_id)

    def peer_endpoint(self, broker_id: int) -> tuple[str, int] | None:
        return None

    async def alter_partition(self, topic: str, state: PartitionState) -> PartitionState | None:
        if self.gate is not None:
            await self.gate.wait()
        self.writes.append(state)
        current = self.states[(topic, state.partition)]
        if current.partition_epoch != state.partition_epoch:
            return None
        written = PartitionState(
            state.partition,
            state.leader,
            state.leader_epoch,
            state.replicas,
            state.isr,
            state.partition_epoch + 1,
        )
        self.states[(topic, state.partition)] = written
        return written


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def leader_partition(tmp_path: Path, isr: list[int], min_isr: int = 2) -> Partition:
    log = UnifiedLog.open(tmp_path / "t-0", LogConfig(min_insync_replicas=min_isr))
    partition = Partition(TP, log, -1, [], local_id=1, replicated=True, high_watermark=0)
    log.leader_epoch_cache.assign(0, 0)
    partition.make_leader(PartitionState(0, 1, 0, [1, 2, 3], isr), now_ms=0)
    return partition


def test_high_watermark_is_the_smallest_isr_leo_and_never_goes_back(tmp_path: Path) -> None:
    partition = leader_partition(tmp_path, [1, 2, 3])
    partition.append_records_to_leader(make_batch(5), required_acks=-1)
    assert partition.high_watermark == 0  # the followers' LEOs are unknown in a new epoch
    assert not partition.update_follower_fetch_state(2, 5, 0, now_ms=10, leader_leo=5)
    assert partition.update_follower_fetch_state(3, 3, 0, now_ms=10, leader_leo=5)
    assert partition.high_watermark == 3
    assert partition.update_follower_fetch_state(3, 5, 0, now_ms=11, leader_leo=5)
    assert partition.high_watermark == 5
    # A follower that truncated (a fetch below the HW) never moves it back.
    partition.update_follower_fetch_state(3, 2, 0, now_ms=12, leader_leo=5)
    assert partition.high_watermark == 5
    # Consumers read below the HW; followers up to the LEO.
    partition.append_records_to_leader(make_batch(2), required_acks=1)
    assert partition.read_records(5, 1 << 20, True).records == b""
    assert partition.read_records(5, 1 << 20, True, up_to_log_end=True).records != b""
    partition.log.close()


def test_high_watermark_waits_for_min_insync_replicas(tmp_path: Path) -> None:
    # KIP-966 (Kafka 4.x): with the ISR below min.insync.replicas nothing commits, even acks=1.
    partition = leader_partition(tmp_path, [1], min_isr=2)
    partition.append_records_to_leader(make_batch(3), required_acks=1)
    assert partition.high_watermark == 0
    alone = leader_partition(tmp_path / "alone", [1], min_isr=1)
    alone.append_records_to_leader(make_batch(3), required_acks=-1)
    assert alone.high_watermark == 3  # a leader alone in its ISR commits its own appends
    partition.log.close()
    alone.log.close()


def test_a_new_leaders_high_watermark_lags_its_epoch_start_until_the_isr_fetches(tmp_path: Path) -> None:
    # A follower's HW trails the leader's; elected, it answers ListOffsets "latest" with
    # OFFSET_NOT_AVAILABLE until its HW reaches the start of its epoch (Kafka's lagging-HW state).
    log = UnifiedLog.open(tmp_path / "t-0", LogConfig(min_insync_replicas=2))
    partition = Partition(TP, log, -1, [], local_id=1, replicated=True, high_watermark=0)
    log.leader_epoch_cache.assign(0, 0)
    partition.make_follower(PartitionState(0, 2, 0, [1, 2, 3], [1, 2, 3]))
    asyncio.run(partition.append_records_as_follower(bytes(make_batch(5))))
    partition.update_follower_high_watermark(3)
    assert not partition.high_watermark_lags_epoch_start  # only a leader's can
    log.leader_epoch_cache.assign(1, 5)
    partition.make_leader(PartitionState(0, 1, 1, [1, 2, 3], [1, 3]), now_ms=0)
    assert partition.high_watermark == 3 and partition.leader_epoch_start_offset == 5
    assert partition.high_watermark_lags_epoch_start
    assert partition.update_follower_fetch_state(3, 5, 0, now_ms=10, leader_leo=5)
    assert partition.high_watermark == 5
    assert not partition.high_watermark_lags_epoch_start
    partition.log.close()


def test_isr_shrink_and_expand_proposals(tmp_path: Path) -> None:
    partition = leader_partition(tmp_path, [1, 2, 3])
    partition.append_records_to_leader(make_batch(4), required_acks=1)
    partition.update_follower_fetch_state(2, 4, 0, now_ms=100, leader_leo=4)
    partition.update_follower_fetch_state(3, 1, 0, now_ms=100, leader_leo=4)
    # Every ISR member counts as caught up when the leader took over (time 0).
    assert partition.isr_shrink(now_ms=LAG_MS, lag_max_ms=LAG_MS) is None
    assert partition.isr_shrink(now_ms=LAG_MS + 1, lag_max_ms=LAG_MS) == [1, 2]
    partition.isr = [1, 2]
    partition.maybe_increment_high_watermark()
    assert partition.high_watermark == 4
    # Back only once it reached the HW (and the start of the leader's epoch).
    assert partition.isr_expansion(3) is None
    partition.update_follower_fetch_state(3, 4, 0, now_ms=LAG_MS + 2, leader_leo=4)
    assert partition.isr_expansion(2) is None  # already in
    assert partition.isr_expansion(3) == [1, 2, 3]
    partition.pending_isr = [1, 2, 3]
    assert partition.isr_expansion(3) is None  # one change in flight
    partition.log.close()


def test_follower_caught_up_to_an_older_leo_counts_from_that_fetch(tmp_path: Path) -> None:
    partition = leader_partition(tmp_path, [1, 2, 3])
    partition.append_records_to_leader(make_batch(4), required_acks=1)
    partition.update_follower_fetch_state(2, 0, 0, now_ms=500, leader_leo=4)
    partition.append_records_to_leader(make_batch(4), required_acks=1)
    # It reached what the leader had at its previous fetch: caught up as of that fetch (500).
    partition.update_follower_fetch_state(2, 4, 0, now_ms=2000, leader_leo=8)
    follower = partition.followers[2]
    assert follower.last_caught_up_time_ms == 500
    assert not follower.is_caught_up(8, now_ms=2000, lag_max_ms=LAG_MS)
    partition.log.close()


def test_diverging_epoch_answer(tmp_path: Path) -> None:
    partition = leader_partition(tmp_path, [1, 2, 3])
    partition.append_records_to_leader(make_batch(3), required_acks=1)  # epoch 0: 0..2
    partition.log.leader_epoch_cache.assign(2, 3)
    partition.leader_epoch = 2
    partition.append_records_to_leader(make_batch(3), required_acks=1)  # epoch 2: 3..5
    assert partition.diverging_epoch(3, 0) is None  # ends where our epoch 0 ends
    assert partition.diverging_epoch(5, 0) == (0, 3)  # went on in epoch 0 past where we did
    assert partition.diverging_epoch(4, 1) == (0, 3)  # an epoch we never had
    assert partition.diverging_epoch(6, 2) is None
    assert partition.diverging_epoch(6, -1) is None
    partition.log.close()


def test_follower_truncation_offsets(tmp_path: Path) -> None:
    """Kafka's getOffsetTruncationState against a follower whose epochs are 0@0, 1@2, 3@4, LEO 6."""
    log = UnifiedLog.open(tmp_path / "t-0", LogConfig())
    for epoch, start in ((0, 0), (1, 2), (3, 4)):
        log.leader_epoch_cache.assign(epoch, start)
        log.append_as_leader(make_batch(2), epoch)
    follower = Partition(TP, log, -1, [], local_id=2, replicated=True, high_watermark=3)
    # The leader ended epoch 1 at 3: we truncate there, done.
    assert truncation_offset(follower, 1, 3) == (3, True)
    # The leader's epoch 2 is unknown to us: cut back to the end of our epoch 1 and ask again.
    assert truncation_offset(follower, 2, 5) == (4, False)
    # The leader knows our epoch 3 and is ahead of us: nothing to cut.
    assert truncation_offset(follower, 3, 9) == (6, True)
    # The leader has no epoch at all for us: keep only what was committed.
    assert truncation_offset(follower, -1, -1) == (3, True)
    log.close()


# -- through the replica manager, with the fake link -------------------------------------------


def make_manager(tmp_path: Path, clock: Clock, link: FakeLink) -> ReplicaManager:
    log_manager = LogManager([tmp_path / "logs"])
    log_manager.startup(lambda _: LogConfig())
    return ReplicaManager(
        log_manager,
        lambda topic: LogConfig.from_props(topic.configs),
        link=link,
        replication=ReplicationConfig(replica_lag_time_max_ms=LAG_MS),
        time_ms=clock,
    )


def topic_state(state: PartitionState) -> TopicState:
    return TopicState("t", uuid.UUID(int=7), [state], {"min.insync.replicas": "2"})


async def follower_fetch(manager: ReplicaManager, replica_id: int, offset: int) -> None:
    manager.read_from_local_log(
        [FetchRequestPartition(TP, offset, 1 << 20)], 1 << 20, replica_id, record_follower_state=True
    )


def test_acks_all_waits_for_the_isr(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock, link = Clock(), FakeLink(1)
        manager = make_manager(tmp_path, clock, link)
        state = PartitionState(0, 1, 0, [1, 2, 3], [1, 2, 3])
        link.states[("t", 0)] = state
        await manager.become_leader_or_follower(topic_state(state), [state])
        partition = manager.partition(TP)
        assert partition is not None and partition.is_leader

        produce = asyncio.ensure_future(manager.append(-1, [(TP, make_batch(3))], timeout_ms=5000))
        await asyncio.sleep(0.01)
        assert not produce.done()
        await follower_fetch(manager, 2, 3)
        await asyncio.sleep(0.01)
        assert not produce.done()  # broker 3 has not fetched: the HW waits for it
        await follower_fetch(manager, 3, 3)
        result = (await asyncio.wait_for(produce, 1))[TP]
        assert (result.error, result.base_offset, partition.high_watermark) == (ErrorCode.none, 0, 3)

        # Timeout: REQUEST_TIMED_OUT, the records stay appended.
        result = (await manager.append(-1, [(TP, make_batch(1))], timeout_ms=50))[TP]
        assert result.error == ErrorCode.request_timed_out and partition.log_end_offset == 4

        # Leadership lost while waiting: NOT_LEADER_OR_FOLLOWER.
        produce = asyncio.ensure_future(manager.append(-1, [(TP, make_batch(1))], timeout_ms=5000))
        await asyncio.sleep(0.01)
        newer = PartitionState(0, 2, 1, [1, 2, 3], [1, 2, 3], partition_epoch=1)
        await manager.become_leader_or_follower(topic_state(newer), [newer])
        assert (await produce)[TP].error == ErrorCode.not_leader_or_follower
        assert not partition.is_leader
        assert manager.leader_hint(TP) == (2, 1)
        # A produce on a follower is refused at once.
        assert (await manager.append(1, [(TP, make_batch(1))]))[TP].error == ErrorCode.not_leader_or_follower
        # A stale state (older epoch) is ignored.
        await manager.become_leader_or_follower(topic_state(state), [state])
        assert not partition.is_leader
        await manager.shutdown()
        manager.log_manager.shutdown()

    asyncio.run(scenario())


def test_isr_shrinks_through_the_link_and_min_insync_refuses_acks_all(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock, link = Clock(), FakeLink(1)
        manager = make_manager(tmp_path, clock, link)
        state = PartitionState(0, 1, 0, [1, 2, 3], [1, 2, 3])
        link.states[("t", 0)] = state
        await manager.become_leader_or_follower(topic_state(state), [state])
        partition = manager.partition(TP)
        assert partition is not None
        waiting = asyncio.ensure_future(manager.append(-1, [(TP, make_batch(2))], timeout_ms=5000))
        await asyncio.sleep(0.01)
        await follower_fetch(manager, 2, 2)
        clock.now += LAG_MS + 1
        # One change in flight at a time: hold the write, shrink twice, one write happens.
        link.gate = asyncio.Event()
        manager._shrink_isrs()
        manager._shrink_isrs()
        link.gate.set()
        await asyncio.sleep(0.01)
        assert [w.isr for w in link.writes] == [[1, 2]]
        assert partition.isr == [1, 2] and partition.partition_epoch == 1
        # Without broker 3 in the ISR the HW moved to broker 2's LEO: the produce completes.
        assert (await asyncio.wait_for(waiting, 1))[TP].error == ErrorCode.none
        # The watch then delivers the same state: not newer, ignored.
        await manager.become_leader_or_follower(topic_state(link.states[("t", 0)]), [link.states[("t", 0)]])
        assert partition.isr == [1, 2]

        # Broker 2 stops fetching while records arrive: the ISR falls below min.insync.replicas = 2.
        assert (await manager.append(1, [(TP, make_batch(1))]))[TP].error == ErrorCode.none
        clock.now += LAG_MS + 1
        manager._shrink_isrs()
        await asyncio.sleep(0.01)
        assert partition.isr == [1]
        result = (await manager.append(-1, [(TP, make_batch(1))], timeout_ms=100))[TP]
        assert result.error == ErrorCode.not_enough_replicas
        assert (await manager.append(1, [(TP, make_batch(1))]))[TP].error == ErrorCode.none
        hw = partition.high_watermark
        assert hw < partition.log_end_offset  # nothing commits below min.insync

        # Broker 3 catches up to the HW: it rejoins (expansion through the link); broker 2, whose
        # last fetch was at the HW too, does not: only a fetching follower joins.
        await follower_fetch(manager, 3, hw)
        await asyncio.sleep(0.01)
        assert partition.isr == [1, 3]
        await follower_fetch(manager, 3, partition.log_end_offset)
        assert partition.high_watermark == partition.log_end_offset
        await manager.shutdown()
        manager.log_manager.shutdown()

    asyncio.run(scenario())


def test_refused_isr_change_waits_for_the_newer_state(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock, link = Clock(), FakeLink(1)
        manager = make_manager(tmp_path, clock, link)
        state = PartitionState(0, 1, 0, [1, 2, 3], [1, 2, 3])
        # The controller changed the state meanwhile (version 5): our write is refused.
        link.states[("t", 0)] = PartitionState(0, 1, 0, [1, 2, 3], [1, 2, 3], partition_epoch=5)
        await manager.become_leader_or_follower(topic_state(state), [state])
        partition = manager.partition(TP)
        assert partition is not None
        clock.now += LAG_MS + 1
        manager._shrink_isrs()
        await asyncio.sleep(0.01)
        assert partition.isr == [1, 2, 3] and partition.pending_isr is None
        newer = link.states[("t", 0)]
        await manager.become_leader_or_follower(topic_state(newer), [newer])
        manager._shrink_isrs()
        await asyncio.sleep(0.01)
        assert partition.isr == [1] and partition.partition_epoch == 6
        await manager.shutdown()
        manager.log_manager.shutdown()

    asyncio.run(scenario())
