"""The broker's ZooKeeper plane and partition states at scale (issue 18), against a real ZooKeeper:
one ChildrenWatch on /isr_change_notification instead of a DataWatch per partition state; a
notified change updates only its partitions in the topic's image; every state is read again,
pipelined, after a reconnection (a notification may have been missed, or purged meanwhile)."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from netproxy import NetProxy
from strom.broker.config import KafkaConfig
from strom.broker.control_plane.zookeeper import ZkControlPlane
from strom.broker.zk import znodes
from zkserver import ZooKeeperServer, java_available

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(not java_available(), reason="needs Debian's zookeeper package and java"),
]

CHROOT = "/strom-states"
NODE_ID = 4
PARTITIONS = 2000
TOPIC = "wide"


@pytest.fixture(scope="module")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    with ZooKeeperServer(tmp_path_factory.mktemp("zookeeper")) as server:
        yield server


@pytest.fixture(scope="module")
def zk(zookeeper: ZooKeeperServer) -> Iterator[KazooClient]:
    client = KazooClient(hosts=zookeeper.connect)
    client.start(timeout=10)
    client.ensure_path(CHROOT)
    client.chroot = CHROOT
    for path in (znodes.TOPICS, znodes.ISR_CHANGE_NOTIFICATION):
        client.ensure_path(path)
    # One topic of PARTITIONS partitions, its states written as the controller writes them:
    # chunked multi-ops, each with its change notification.
    client.create(znodes.topic_path(TOPIC), topic_json(uuid.UUID(int=99)))
    client.create(znodes.partitions_path(TOPIC))
    for first in range(0, PARTITIONS, 500):
        chunk = range(first, min(first + 500, PARTITIONS))
        transaction = client.transaction()
        for p in chunk:
            transaction.create(znodes.partition_path(TOPIC, p))
            transaction.create(znodes.partition_state_path(TOPIC, p), state_json(0))
        transaction.create(
            notification_path(), znodes.encode_partition_list([(TOPIC, p) for p in chunk]), sequence=True
        )
        assert not any(isinstance(r, Exception) for r in transaction.commit())
    yield client
    client.stop()
    client.close()


def notification_path() -> str:
    return f"{znodes.ISR_CHANGE_NOTIFICATION}/{znodes.ISR_CHANGE_PREFIX}"


def topic_json(topic_id: uuid.UUID) -> bytes:
    return znodes.TopicZNode(topic_id, {p: [NODE_ID, 5, 6] for p in range(PARTITIONS)}).encode()


def state_json(leader_epoch: int) -> bytes:
    return znodes.LeaderAndIsr(NODE_ID, leader_epoch, [NODE_ID, 5, 6], 1).encode()


def write_state(zk: KazooClient, partition: int, data: bytes, *, announce: bool = True) -> None:
    transaction = zk.transaction()
    transaction.set_data(znodes.partition_state_path(TOPIC, partition), data)
    if announce:
        transaction.create(
            notification_path(), znodes.encode_partition_list([(TOPIC, partition)]), sequence=True
        )
    assert not any(isinstance(r, Exception) for r in transaction.commit())


def four_letter_word(server: ZooKeeperServer, word: bytes) -> str:
    host, _, port = server.connect.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(word)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer.decode()


def watch_count(server: ZooKeeperServer) -> int:
    """Every watch the server holds (mntr): the plane's, as the test's own client sets none."""
    for line in four_letter_word(server, b"mntr").splitlines():
        key, _, value = line.partition("\t")
        if key == "zk_watch_count":
            return int(value)
    raise AssertionError("mntr reported no zk_watch_count")


def run(connect: str, tmp_path: Path, scenario: Callable[[ZkControlPlane], Awaitable[None]]) -> None:
    async def main() -> None:
        config = KafkaConfig(
            {
                "node.id": str(NODE_ID),
                "log.dirs": str(tmp_path / "logs"),
                "zookeeper.connect": connect + CHROOT,
                "zookeeper.session.timeout.ms": "10000",
            }
        )
        plane = ZkControlPlane(config, [tmp_path / "logs"], lambda name: None, lambda: None)
        await plane.start()
        try:
            await scenario(plane)
        finally:
            await plane.close()

    asyncio.run(main())


async def until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.05)


def leader_epoch(plane: ZkControlPlane, partition: int) -> int:
    topic = plane.image.topic(TOPIC)
    assert topic is not None
    return topic.partitions[partition].leader_epoch


def test_one_watch_serves_every_partition_state(
    zookeeper: ZooKeeperServer, zk: KazooClient, tmp_path: Path
) -> None:
    async def scenario(plane: ZkControlPlane) -> None:
        # Read in full at start (pipelined), before the broker would serve.
        assert ZkControlPlane.is_ready(plane.image.topic(TOPIC))
        # The controller, the brokers, the topics, the notifications, the topic and its config:
        # a handful, not one per partition (main armed PARTITIONS more).
        assert watch_count(zookeeper) < 20

    run(zookeeper.connect, tmp_path, scenario)


def test_a_notified_change_updates_only_its_partitions(
    zookeeper: ZooKeeperServer, zk: KazooClient, tmp_path: Path
) -> None:
    async def scenario(plane: ZkControlPlane) -> None:
        before = plane.image.topic(TOPIC)
        assert before is not None
        write_state(zk, 7, state_json(5))
        await until(lambda: leader_epoch(plane, 7) == 5, "the notified state is read")
        after = plane.image.topic(TOPIC)
        assert after is not None and after is not before  # a new TopicState: the broker compares them
        assert after.partitions[7].partition_epoch == before.partitions[7].partition_epoch + 1
        # Every other partition's state is the object it was: not rebuilt.
        assert all(after.partitions[p] is before.partitions[p] for p in range(PARTITIONS) if p != 7)
        # A state written without a notification is not read (nothing watches it)...
        write_state(zk, 8, state_json(6), announce=False)
        write_state(zk, 9, state_json(6))
        await until(lambda: leader_epoch(plane, 9) == 6, "a later notified state is read")
        assert leader_epoch(plane, 8) == 0

    run(zookeeper.connect, tmp_path, scenario)


def test_every_state_is_read_again_after_a_reconnection(
    zookeeper: ZooKeeperServer, zk: KazooClient, tmp_path: Path
) -> None:
    with NetProxy(zookeeper.connect) as proxy:

        async def scenario(plane: ZkControlPlane) -> None:
            session = plane.zk.session_id
            # A change whose notification this broker never saw (as if purged while it was away).
            write_state(zk, 11, state_json(8), announce=False)
            await asyncio.sleep(0.5)
            assert leader_epoch(plane, 11) == 0
            proxy.reset()  # the connection drops...
            await until(lambda: not plane.zk.connected, "the connection is lost")
            proxy.pass_through()  # ...and kazoo reconnects, to the same session
            await until(lambda: leader_epoch(plane, 11) == 8, "every state is read again")
            assert plane.zk.session_id == session
            assert watch_count(zookeeper) < 20  # the watches came back, not multiplied

        run(proxy.address, tmp_path, scenario)


def test_garbage_notifications_are_skipped_and_the_next_one_is_read(
    zookeeper: ZooKeeperServer, zk: KazooClient, tmp_path: Path
) -> None:
    async def scenario(plane: ZkControlPlane) -> None:
        before = plane.image.topic(TOPIC)
        assert before is not None
        garbage = zk.create(notification_path(), b"not json {", sequence=True)
        # Names no partition a broker could hold: an illegal topic name and a partition past the bound.
        zk.create(
            notification_path(),
            b'{"version":1,"partitions":[{"topic":"../x","partition":3},'
            b'{"topic":"' + TOPIC.encode() + b'","partition":4294967296}]}',
            sequence=True,
        )
        write_state(zk, 11, state_json(7))
        await until(lambda: leader_epoch(plane, 11) == 7, "the valid notification after the garbage is read")
        assert garbage in plane.unreadable_znodes()
        after = plane.image.topic(TOPIC)
        assert after is not None
        assert all(after.partitions[p] is before.partitions[p] for p in range(PARTITIONS) if p != 11)

    run(zookeeper.connect, tmp_path, scenario)
