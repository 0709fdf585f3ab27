"""Replication over real TCP, without ZooKeeper: three in-process brokers on 127.0.0.11-13.

Each broker's replica manager runs in cluster mode with ``MiniControlPlane`` as its cluster link:
a dict of partition states with version-checked ISR writes that, like a ZooKeeper watch, hands
every written state to every running broker. The test plays the controller (leader elections,
which broker hears of which state). Followers fetch from leaders with the real Fetch and
OffsetForLeaderEpoch APIs through strom's own connection code; clients talk to the brokers with
the real Produce and Fetch APIs.
"""

from __future__ import annotations

import asyncio
import datetime
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from strom.broker.config import KafkaConfig
from strom.broker.control_plane.metadata import PartitionState, TopicState
from strom.broker.partition import TopicPartition
from strom.broker.replica_manager import ReplicaManager, ReplicationConfig
from strom.broker.server import BrokerServer
from strom.network.connection import BrokerConnection
from strom.protocol.apis import ApiKey, request_module
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import build
from unit.storage.storage_batches import make_batch

TOPIC = "replicated"
TP = TopicPartition(TOPIC, 0)
TOPIC_ID = uuid.UUID(int=0x5EED)
LAG_MS = 1000


class MiniControlPlane:
    """The cluster's partition states, and the brokers that hear about them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.brokers: dict[int, BrokerServer] = {}
        self.state = PartitionState(0, 1, 0, [1, 2, 3], [1, 2, 3])
        self.topic = TopicState(TOPIC, TOPIC_ID, [self.state], {"min.insync.replicas": "2"})
        # Brokers cut off from the control plane hear of no new state.
        self.deaf: set[int] = set()

    def link(self, node_id: int) -> Link:
        return Link(self, node_id)

    async def start(self, node_id: int) -> BrokerServer:
        host = f"127.0.0.1{node_id}"
        config = KafkaConfig(
            {
                "node.id": str(node_id),
                "listeners": f"PLAINTEXT://{host}:0",
                "log.dirs": str(self.root / f"broker-{node_id}"),
            }
        )
        server = BrokerServer(config)
        # Cluster mode for the replica manager (BrokerServer's ZooKeeper wiring is not used here).
        server.replica_manager = ReplicaManager(
            server.log_manager,
            server.log_config,
            node_id=node_id,
            link=self.link(node_id),
            replication=ReplicationConfig(
                replica_lag_time_max_ms=LAG_MS,
                replica_fetch_wait_max_ms=100,
                replica_fetch_backoff_ms=100,
                replica_socket_timeout_ms=2000,
                replica_high_watermark_checkpoint_interval_ms=200,
                bind_host=host,
            ),
            fetch_sessions=server.fetch_sessions,
        )
        await server.start()
        await server.replica_manager.start()
        server.control_plane.image.put(self.topic)
        self.brokers[node_id] = server
        await server.replica_manager.become_leader_or_follower(self.topic, [self.state])
        return server

    async def stop(self, node_id: int) -> None:
        server = self.brokers.pop(node_id)
        await server.replica_manager.shutdown()
        await server.stop()

    async def publish(self, state: PartitionState) -> None:
        """A new state, as the controller writes it: every running broker applies it."""
        self.state = state
        await asyncio.gather(
            *(
                server.replica_manager.become_leader_or_follower(self.topic, [state])
                for node_id, server in self.brokers.items()
                if node_id not in self.deaf
            )
        )

    async def elect(self, leader: int, isr: list[int]) -> None:
        state = self.state
        await self.publish(
            PartitionState(0, leader, state.leader_epoch + 1, state.replicas, isr, state.partition_epoch + 1)
        )

    def endpoint(self, node_id: int) -> tuple[str, int]:
        server = self.brokers[node_id]
        return f"127.0.0.1{node_id}", server.bound_ports[0]

    def partition(self, node_id: int) -> Any:
        partition = self.brokers[node_id].replica_manager.partition(TP)
        assert partition is not None
        return partition

    def log_bytes(self, node_id: int) -> bytes:
        return bytes(self.partition(node_id).log.read(0, 1 << 24).records)


class Link:
    def __init__(self, plane: MiniControlPlane, node_id: int) -> None:
        self.plane = plane
        self.node_id = node_id

    def broker_endpoint(self, broker_id: int) -> tuple[str, int] | None:
        return self.plane.endpoint(broker_id) if broker_id in self.plane.brokers else None

    def broker_epoch(self, broker_id: int) -> int | None:
        return 100 + broker_id if broker_id in self.plane.brokers else None

    def peer_endpoint(self, broker_id: int) -> tuple[str, int] | None:
        return self.broker_endpoint(broker_id)

    async def alter_partition(self, topic: str, state: PartitionState) -> PartitionState | None:
        current = self.plane.state
        if state.partition_epoch != current.partition_epoch or self.node_id in self.plane.deaf:
            return None
        written = PartitionState(
            state.partition,
            state.leader,
            state.leader_epoch,
            state.replicas,
            state.isr,
            current.partition_epoch + 1,
        )
        # The watch delivers it to every broker a moment later.
        asyncio.get_running_loop().create_task(self.plane.publish(written))
        self.plane.state = written
        return written


async def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.02)


async def connect(plane: MiniControlPlane, node_id: int, *, as_broker: int | None = None) -> BrokerConnection:
    """A connection to broker ``node_id``; ``as_broker``: from that broker's address."""
    host, port = plane.endpoint(node_id)
    local_host = None if as_broker is None else f"127.0.0.1{as_broker}"
    return await BrokerConnection.open(
        host, port, client_id="replication-test", timeout=5, local_host=local_host
    )


async def produce(connection: BrokerConnection, records: bytes, acks: int, timeout_ms: int = 5000) -> Any:
    """One batch to partition 0; the partition's answer."""
    module = request_module(ApiKey.PRODUCE, 11)
    request = build(
        module.ProduceRequest,
        transactional_id=None,
        acks=acks,
        timeout=datetime.timedelta(milliseconds=timeout_ms),
        topic_data=(
            build(
                module.TopicProduceData,
                name=TOPIC,
                partition_data=(build(module.PartitionProduceData, index=0, records=records),),
            ),
        ),
    )
    response = await connection.send(request, timeout=10)
    return response.responses[0].partition_responses[0]


async def consumer_fetch(connection: BrokerConnection, offset: int) -> Any:
    module = request_module(ApiKey.FETCH, 17)
    request = build(
        module.FetchRequest,
        max_wait=datetime.timedelta(milliseconds=0),
        min_bytes=1,
        topics=(
            build(
                module.FetchTopic,
                topic_id=TOPIC_ID,
                partitions=(
                    build(
                        module.FetchPartition, partition=0, fetch_offset=offset, partition_max_bytes=1 << 20
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
    )
    return await connection.send(request, timeout=10)


async def replica_fetch(
    connection: BrokerConnection, replica_id: int, offset: int, last_fetched_epoch: int, leader_epoch: int
) -> Any:
    """A follower's Fetch (v17: the replica in replica_state); the partition's answer."""
    module = request_module(ApiKey.FETCH, 17)
    request = build(
        module.FetchRequest,
        replica_state=module.ReplicaState(replica_id=replica_id, replica_epoch=-1),
        max_wait=datetime.timedelta(milliseconds=0),
        min_bytes=1,
        topics=(
            build(
                module.FetchTopic,
                topic_id=TOPIC_ID,
                partitions=(
                    build(
                        module.FetchPartition,
                        partition=0,
                        current_leader_epoch=leader_epoch,
                        fetch_offset=offset,
                        last_fetched_epoch=last_fetched_epoch,
                        partition_max_bytes=1 << 20,
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
    )
    return (await connection.send(request, timeout=10)).responses[0].partitions[0]


def run(scenario: Callable[[MiniControlPlane], Any], tmp_path: Path) -> None:
    async def main() -> None:
        plane = MiniControlPlane(tmp_path)
        try:
            for node_id in (1, 2, 3):
                await plane.start(node_id)
            await scenario(plane)
        finally:
            for node_id in list(plane.brokers):
                await plane.stop(node_id)

    asyncio.run(main())


def test_followers_replicate_and_acks_all_waits_for_them(tmp_path: Path) -> None:
    async def scenario(plane: MiniControlPlane) -> None:
        leader = await connect(plane, 1)
        for i in range(5):
            answer = await produce(leader, make_batch(3, value_size=100), acks=-1)
            assert (answer.error_code, answer.base_offset) == (ErrorCode.none, 3 * i)
        # acks=all answered: the HW covers the records, so every ISR member holds them.
        assert plane.partition(1).high_watermark == 15
        for follower in (2, 3):
            assert plane.partition(follower).log_end_offset >= 15
        await eventually(lambda: all(plane.partition(n).high_watermark == 15 for n in (2, 3)))
        # Byte for byte the leader's batches: same offsets, same leader epochs.
        assert plane.log_bytes(2) == plane.log_bytes(1) == plane.log_bytes(3)
        assert plane.partition(2).log.leader_epoch_cache.entries == [(0, 0)]

        # A follower answers clients NOT_LEADER_OR_FOLLOWER with KIP-951's leader hint.
        follower = await connect(plane, 2)
        response = await consumer_fetch(follower, 0)
        data = response.responses[0].partitions[0]
        assert data.error_code == ErrorCode.not_leader_or_follower
        assert (data.current_leader.leader_id, data.current_leader.leader_epoch) == (1, 0)
        assert [(e.node_id, e.host, e.port) for e in response.node_endpoints] == [(1, *plane.endpoint(1))]
        answer = await produce(follower, make_batch(1), acks=1)
        assert answer.error_code == ErrorCode.not_leader_or_follower
        assert answer.current_leader.leader_id == 1
        # The leader serves consumers below the HW.
        response = await consumer_fetch(leader, 0)
        assert response.responses[0].partitions[0].high_watermark == 15
        leader.close()
        follower.close()

    run(scenario, tmp_path)


def test_isr_shrinks_and_expands_and_min_insync_holds(tmp_path: Path) -> None:
    async def scenario(plane: MiniControlPlane) -> None:
        leader = await connect(plane, 1)
        assert (await produce(leader, make_batch(2), acks=-1)).error_code == 0
        await eventually(lambda: plane.partition(3).high_watermark == 2)
        await plane.stop(3)
        # Its HW is checkpointed at shutdown (Kafka's replication-offset-checkpoint).
        checkpoint = plane.root / "broker-3" / "replication-offset-checkpoint"
        assert checkpoint.read_text() == f"0\n1\n{TOPIC} 0 2\n"
        # Broker 3 stopped fetching while records arrive: after replica.lag.time.max.ms the leader
        # drops it from the ISR (a replica at the leader's LEO is never behind, as in Kafka), and
        # acks=all goes on with brokers 1 and 2 (min.insync.replicas = 2).
        answer = await produce(leader, make_batch(2), acks=-1, timeout_ms=10_000)
        assert (answer.error_code, answer.base_offset) == (ErrorCode.none, 2)
        assert plane.state.isr == [1, 2]
        assert plane.partition(1).isr == [1, 2]

        # Broker 3 restarts (its HW from the checkpoint), learns the state, catches up and rejoins.
        await plane.start(3)
        assert plane.partition(3).high_watermark >= 2
        await eventually(lambda: plane.state.isr == [1, 2, 3])
        await eventually(lambda: plane.log_bytes(3) == plane.log_bytes(1))

        # Two replicas down: acks=all is refused before the append, acks=1 is taken but the HW stays.
        await plane.stop(2)
        await plane.stop(3)
        answer = await produce(leader, make_batch(1), acks=1)
        assert answer.error_code == ErrorCode.none
        await eventually(lambda: plane.state.isr == [1])
        answer = await produce(leader, make_batch(1), acks=-1)
        assert answer.error_code == ErrorCode.not_enough_replicas
        hw = plane.partition(1).high_watermark
        answer = await produce(leader, make_batch(1), acks=1)
        assert answer.error_code == ErrorCode.none
        assert plane.partition(1).high_watermark == hw < plane.partition(1).log_end_offset
        leader.close()

    run(scenario, tmp_path)


def test_caught_up_followers_dropped_by_the_controller_rejoin_the_isr(tmp_path: Path) -> None:
    """The controller takes both followers out of the ISR in the same epoch (as when their
    ZooKeeper sessions bounce) while they keep fetching, caught up. Nothing is appended (acks=all
    is refused below min.insync.replicas), so their fetch sessions' reads of the partition are
    what must bring them back: the ISR change marks it ready in the sessions."""

    async def scenario(plane: MiniControlPlane) -> None:
        leader = await connect(plane, 1)
        assert (await produce(leader, make_batch(2), acks=-1)).error_code == 0
        await eventually(lambda: all(plane.partition(n).high_watermark == 2 for n in (1, 2, 3)))
        state = plane.state
        await plane.publish(
            PartitionState(0, 1, state.leader_epoch, state.replicas, [1], state.partition_epoch + 1)
        )
        assert plane.partition(1).isr == [1]
        await eventually(lambda: sorted(plane.state.isr) == [1, 2, 3])
        answer = await produce(leader, make_batch(1), acks=-1)
        assert (answer.error_code, answer.base_offset) == (ErrorCode.none, 2)
        leader.close()

    run(scenario, tmp_path)


def test_old_leader_truncates_to_the_new_leaders_log(tmp_path: Path) -> None:
    async def scenario(plane: MiniControlPlane) -> None:
        leader = await connect(plane, 1)
        assert (await produce(leader, make_batch(5), acks=-1)).error_code == 0
        await eventually(lambda: all(plane.partition(n).high_watermark == 5 for n in (1, 2, 3)))
        # Broker 1 is cut off from its followers and the control plane; it takes acks=1 writes
        # nobody else will have.
        plane.deaf.add(1)
        for n in (2, 3):
            fetchers = plane.brokers[n].replica_manager.fetchers
            assert fetchers is not None
            fetchers.remove_partitions([plane.partition(n).tp])  # until the next state re-adds it
        answer = await produce(leader, make_batch(3), acks=1)
        assert (answer.error_code, answer.base_offset) == (ErrorCode.none, 5)
        assert plane.partition(1).log_end_offset == 8
        # The controller elects broker 2 (epoch 1); the new leader takes other records at 5 and 6.
        await plane.elect(2, [2, 3])
        new_leader = await connect(plane, 2)
        answer = await produce(new_leader, make_batch(2), acks=-1)
        assert (answer.error_code, answer.base_offset) == (ErrorCode.none, 5)

        # Healed: broker 1 becomes a follower, truncates its unreplicated records by
        # OffsetForLeaderEpoch and fetches the new leader's; no offset holds two values.
        plane.deaf.discard(1)
        await plane.publish(plane.state)
        await eventually(lambda: plane.log_bytes(1) == plane.log_bytes(2))
        assert plane.partition(1).log_end_offset == 7
        assert plane.partition(1).log.leader_epoch_cache.entries == [(0, 0), (1, 5)]
        await eventually(lambda: plane.state.isr == [2, 3, 1])

        # KIP-320 on the leader: a replica whose log went on in epoch 0 up to 8 is told where it
        # diverges (epoch 0 ends at 5 here); one in step gets records up to the LEO. (Fetched as
        # broker 3, from its address: the leader serves replica fetches only from there.)
        as_3 = await connect(plane, 2, as_broker=3)
        data = await replica_fetch(as_3, 3, offset=8, last_fetched_epoch=0, leader_epoch=1)
        assert (data.error_code, data.diverging_epoch.epoch, data.diverging_epoch.end_offset) == (0, 0, 5)
        assert not data.records
        data = await replica_fetch(as_3, 3, offset=5, last_fetched_epoch=0, leader_epoch=1)
        assert data.diverging_epoch.epoch == -1 and data.records
        data = await replica_fetch(as_3, 3, offset=5, last_fetched_epoch=0, leader_epoch=0)
        assert data.error_code == ErrorCode.fenced_leader_epoch
        # A broker outside the replica set is no follower.
        data = await replica_fetch(as_3, 9, offset=5, last_fetched_epoch=0, leader_epoch=1)
        assert data.error_code == ErrorCode.not_leader_or_follower
        leader.close()
        new_leader.close()
        as_3.close()

    run(scenario, tmp_path)
