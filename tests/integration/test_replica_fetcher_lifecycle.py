"""Replica fetchers over real TCP, two in-process brokers on 127.0.0.11-12 (issue 17, items 17
and 18): one partition's failure does not stall the others of its fetcher, and a fetcher that
follows nothing any more is shut down with its connection and its session on the leader.

As in test_replication.py, each broker's replica manager runs in cluster mode with a small
control plane of the test's (partition states with version-checked ISR writes, handed to every
broker); the follower's truncation of one partition fails by an injected OSError.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from strom.broker.config import KafkaConfig
from strom.broker.control_plane.metadata import PartitionState, TopicState
from strom.broker.partition import Partition, TopicPartition
from strom.broker.replica_manager import ReplicaManager, ReplicationConfig
from strom.broker.server import BrokerServer
from unit.storage.storage_batches import make_batch

TOPIC = "followed"
TOPIC_ID = uuid.UUID(int=0xF0110)
TP0, TP1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)


def host(node_id: int) -> str:
    return f"127.0.0.1{node_id}"


class Plane:
    """Partition states of one topic (two partitions, replicas 1 and 2) and the brokers."""

    def __init__(self, root: Path, *, wildcard: bool = False) -> None:
        self.root = root
        # Brokers listen on every address (0.0.0.0) yet are registered on 127.0.0.1N.
        self.wildcard = wildcard
        self.brokers: dict[int, BrokerServer] = {}
        self.states = {p: PartitionState(p, 1, 0, [1, 2], [1, 2]) for p in (0, 1)}

    @property
    def topic(self) -> TopicState:
        return TopicState(TOPIC, TOPIC_ID, list(self.states.values()), {"min.insync.replicas": "1"})

    async def start(self, node_id: int) -> BrokerServer:
        config = KafkaConfig(
            {
                "node.id": str(node_id),
                "listeners": f"PLAINTEXT://{'0.0.0.0' if self.wildcard else host(node_id)}:0",
                "log.dirs": str(self.root / f"broker-{node_id}"),
            }
        )
        server = BrokerServer(config)
        server.replica_manager = ReplicaManager(
            server.log_manager,
            server.log_config,
            node_id=node_id,
            link=Link(self, node_id),
            replication=ReplicationConfig(
                replica_lag_time_max_ms=10_000,
                replica_fetch_wait_max_ms=100,
                replica_fetch_backoff_ms=100,
                replica_socket_timeout_ms=2000,
                bind_host=None if self.wildcard else host(node_id),
            ),
            fetch_sessions=server.fetch_sessions,
        )
        await server.start()
        await server.replica_manager.start()
        server.control_plane.image.put(self.topic)
        self.brokers[node_id] = server
        for state in self.states.values():
            await server.replica_manager.become_leader_or_follower(self.topic, [state])
        return server

    async def stop_all(self) -> None:
        for server in self.brokers.values():
            await server.replica_manager.shutdown()
            await server.stop()
        self.brokers.clear()

    async def publish(self, state: PartitionState) -> None:
        self.states[state.partition] = state
        topic = self.topic
        for server in list(self.brokers.values()):
            await server.replica_manager.become_leader_or_follower(topic, [state])

    async def elect(self, partition: int, leader: int) -> None:
        old = self.states[partition]
        await self.publish(
            PartitionState(
                partition, leader, old.leader_epoch + 1, old.replicas, old.isr, old.partition_epoch + 1
            )
        )

    def partition(self, node_id: int, tp: TopicPartition) -> Partition:
        partition = self.brokers[node_id].replica_manager.partition(tp)
        assert partition is not None
        return partition


class Link:
    def __init__(self, plane: Plane, node_id: int) -> None:
        self.plane = plane
        self.node_id = node_id

    def broker_endpoint(self, broker_id: int) -> tuple[str, int] | None:
        server = self.plane.brokers.get(broker_id)
        return (host(broker_id), server.bound_ports[0]) if server is not None else None

    def peer_endpoint(self, broker_id: int) -> tuple[str, int] | None:
        return self.broker_endpoint(broker_id)

    def broker_epoch(self, broker_id: int) -> int | None:
        return 100 + broker_id if broker_id in self.plane.brokers else None

    async def alter_partition(self, topic: str, state: PartitionState) -> PartitionState | None:
        current = self.plane.states[state.partition]
        if state.partition_epoch != current.partition_epoch:
            return None
        written = PartitionState(
            state.partition,
            state.leader,
            state.leader_epoch,
            state.replicas,
            state.isr,
            current.partition_epoch + 1,
        )
        self.plane.states[state.partition] = written
        asyncio.get_running_loop().create_task(self.plane.publish(written))
        return written


async def eventually(check: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    try:
        async with asyncio.timeout(timeout):
            while not check():
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not within {timeout} s: {what}") from None


def run(scenario: Callable[[Plane], object], tmp_path: Path, *, wildcard: bool = False) -> None:
    async def main() -> None:
        plane = Plane(tmp_path, wildcard=wildcard)
        try:
            await plane.start(1)
            await plane.start(2)
            await scenario(plane)  # type: ignore[misc]
        finally:
            await plane.stop_all()

    asyncio.run(main())


def test_a_failed_partition_does_not_stall_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    failing = {"on": True}
    truncate_to = Partition.truncate_to

    async def truncate_or_fail(self: Partition, offset: int) -> None:
        if failing["on"] and self.local_id == 2 and self.tp == TP0:
            raise OSError(28, "injected: no space left while truncating")
        await truncate_to(self, offset)

    monkeypatch.setattr(Partition, "truncate_to", truncate_or_fail)
    caplog.set_level(logging.DEBUG, logger="strom.broker.replica_fetcher")

    async def scenario(plane: Plane) -> None:
        leader = plane.brokers[1].replica_manager
        fetchers = plane.brokers[2].replica_manager.fetchers
        assert fetchers is not None
        for _ in range(3):
            for tp in (TP0, TP1):
                assert (await leader.append(1, [(tp, make_batch(2))]))[tp].error == 0
        # Partition 1 replicates although partition 0 of the same fetcher cannot truncate.
        await eventually(lambda: plane.partition(2, TP1).log_end_offset == 6, "partition 1 replicated")
        assert plane.partition(2, TP0).log_end_offset == 0
        assert fetchers.failed_partitions == [TP0]
        assert fetchers.fetcher_count == 1
        assert (await leader.append(1, [(TP1, make_batch(2))]))[TP1].error == 0
        await eventually(lambda: plane.partition(2, TP1).log_end_offset == 8, "partition 1 goes on")
        # Logged once, with the cause and its traceback; no retry floods the log.
        failures = [
            r for r in caplog.records if r.getMessage().startswith("replica fetcher: partition failed")
        ]
        assert len(failures) == 1 and failures[0].levelno == logging.ERROR
        assert failures[0].exc_info is not None and "injected" in str(failures[0].exc_info[1])
        assert getattr(failures[0], "partition", None) == str(TP0)

        # A new state of the partition (here a new leader epoch) adds it again: it catches up.
        failing["on"] = False
        await plane.elect(0, 1)
        await eventually(lambda: plane.partition(2, TP0).log_end_offset == 6, "partition 0 replicated")
        assert fetchers.failed_partitions == []

    run(scenario, tmp_path)


def test_a_fetcher_without_partitions_is_shut_down(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        one, two = plane.brokers[1], plane.brokers[2]
        fetchers_2 = two.replica_manager.fetchers
        assert fetchers_2 is not None
        for tp in (TP0, TP1):
            assert (await one.replica_manager.append(1, [(tp, make_batch(1))]))[tp].error == 0

        def from_broker(server: BrokerServer, node_id: int) -> int:
            return sum(1 for c in server.network.connections if c.peer.startswith(host(node_id) + ":"))

        await eventually(
            lambda: len(one.fetch_sessions) == 1 and plane.partition(2, TP1).log_end_offset == 1,
            "broker 2's fetch session on broker 1",
        )
        assert from_broker(one, 2) == 1

        # One partition moves to broker 2's leadership: the fetcher still follows the other.
        await plane.elect(0, 2)
        await asyncio.sleep(0.3)
        assert from_broker(one, 2) == 1
        # The other moves too: broker 2 follows nothing from broker 1 any more. Its fetcher goes,
        # with its session on broker 1 (closed, not left to age) and its connection.
        await plane.elect(1, 2)
        await eventually(lambda: len(one.fetch_sessions) == 0, "broker 2's session on broker 1 closed")
        await eventually(lambda: from_broker(one, 2) == 0, "broker 2's fetcher connection closed")
        assert fetchers_2.fetcher_count == 0
        # Broker 1 now follows broker 2 through one fetcher of its own.
        fetchers_1 = one.replica_manager.fetchers
        assert fetchers_1 is not None
        await eventually(lambda: len(two.fetch_sessions) == 1, "broker 1's fetch session on broker 2")
        assert fetchers_1.fetcher_count == 1 and from_broker(two, 1) == 1

    run(scenario, tmp_path)


def test_a_wildcard_listener_fetches_from_the_registered_host(tmp_path: Path) -> None:
    """Without a listener address of its own, a follower connects from its registered host:
    the leader serves only that address as the follower."""

    async def scenario(plane: Plane) -> None:
        leader = plane.brokers[1].replica_manager
        for tp in (TP0, TP1):
            assert (await leader.append(1, [(tp, make_batch(3))]))[tp].error == 0
        await eventually(
            lambda: all(plane.partition(2, tp).log_end_offset == 3 for tp in (TP0, TP1)), "replicated"
        )
        await eventually(lambda: plane.partition(1, TP0).high_watermark == 3, "the HW moved by broker 2")

    run(scenario, tmp_path, wildcard=True)
