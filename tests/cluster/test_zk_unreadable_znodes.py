"""Issue 17 items 3, 7 and 17 (the broker's side), in process: a ``ZkControlPlane`` on a real
ZooKeeper, garbage written there with kazoo.

What a broker cannot read it skips, counts and logs once with the path, keeping what it last read
(or withholding a topic it never read well); only a topic znode that is gone ends a topic. A watch
callback that raises is re-read until it succeeds, and a registration lost with a session is made
again however often the first tries fail.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss

from strom.broker.config import KafkaConfig
from strom.broker.control_plane.zookeeper import ZkControlPlane
from strom.broker.zk import znodes
from strom.broker.zk.client import SessionState
from zkserver import ZooKeeperServer, java_available

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(not java_available(), reason="needs Debian's zookeeper package and java"),
]

CHROOT = "/strom-unreadable"
NODE_ID = 7


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
    yield client
    client.stop()
    client.close()


class Broker:
    """What BrokerServer gives the control plane: the topics it was told changed."""

    def __init__(self) -> None:
        self.told: list[str] = []
        self.fail_next: set[str] = set()

    def topic_changed(self, name: str) -> None:
        if name in self.fail_next:
            self.fail_next.discard(name)
            raise RuntimeError(f"applying {name} failed")
        self.told.append(name)


def run(
    zookeeper: ZooKeeperServer, tmp_path: Path, scenario: Callable[[ZkControlPlane, Broker], Awaitable[None]]
) -> None:
    async def main() -> None:
        config = KafkaConfig(
            {
                "node.id": str(NODE_ID),
                "log.dirs": str(tmp_path / "logs"),
                "zookeeper.connect": zookeeper.connect + CHROOT,
                "zookeeper.session.timeout.ms": "4000",
            }
        )
        broker = Broker()
        plane = ZkControlPlane(config, [tmp_path / "logs"], broker.topic_changed, lambda: None)
        await plane.start()
        try:
            await scenario(plane, broker)
        finally:
            await plane.close()

    asyncio.run(main())


async def until(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.05)


def topic_json(topic_id: uuid.UUID | None, partitions: int = 2) -> bytes:
    return znodes.TopicZNode(topic_id, {p: [NODE_ID] for p in range(partitions)}).encode()


def state_json(leader_epoch: int) -> bytes:
    return znodes.LeaderAndIsr(NODE_ID, leader_epoch, [NODE_ID], 1).encode()


def write_state(zk: KazooClient, topic: str, partition: int, data: bytes, *, create: bool = False) -> None:
    """Write a partition state as the controller and leaders do: with its change notification."""
    path = znodes.partition_state_path(topic, partition)
    zk.ensure_path(znodes.ISR_CHANGE_NOTIFICATION)
    if create:
        zk.ensure_path(znodes.partition_path(topic, partition))
    transaction = zk.transaction()
    if create:
        transaction.create(path, data)
    else:
        transaction.set_data(path, data)
    transaction.create(
        f"{znodes.ISR_CHANGE_NOTIFICATION}/{znodes.ISR_CHANGE_PREFIX}",
        znodes.encode_partition_list([(topic, partition)]),
        sequence=True,
    )
    results = transaction.commit()
    assert not any(isinstance(r, Exception) for r in results), results


def create_topic(zk: KazooClient, name: str, topic_id: uuid.UUID | None, config: dict[str, Any]) -> None:
    zk.create(
        znodes.topic_config_path(name), json.dumps({"version": 1, "config": config}).encode(), makepath=True
    )
    zk.create(znodes.topic_path(name), topic_json(topic_id), makepath=True)
    for p in range(2):
        write_state(zk, name, p, state_json(0), create=True)


def test_garbage_in_a_known_topics_znodes_changes_nothing(
    zookeeper: ZooKeeperServer, zk: KazooClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    topic_id = uuid.uuid4()
    create_topic(zk, "known", topic_id, {"cleanup.policy": "compact"})

    async def scenario(plane: ZkControlPlane, broker: Broker) -> None:
        await until(lambda: ZkControlPlane.is_ready(plane.image.topic("known")), "the topic is read")
        before = plane.image.topic("known")
        assert before is not None and before.configs == {"cleanup.policy": "compact"}
        # A Kafka 2.x (id-less) topic znode and an invalid config value: the topic stays as it was.
        told = len(broker.told)
        zk.set(
            znodes.topic_path("known"), json.dumps({"version": 2, "partitions": {"0": [NODE_ID]}}).encode()
        )
        zk.set(
            znodes.topic_config_path("known"),
            json.dumps({"version": 1, "config": {"min.insync.replicas": "x"}}).encode(),
        )
        skipped = {znodes.topic_path("known"), znodes.topic_config_path("known")}
        await until(
            lambda: plane.image.topic("known") != before or skipped <= set(plane.unreadable_znodes()),
            "both znodes are read (and skipped)",
        )
        assert plane.image.topic("known") == before
        assert broker.told[told:] == []  # the broker was told of no change (no deletion)
        assert "topic_id" in plane.unreadable_znodes()[znodes.topic_path("known")]
        assert "min.insync.replicas" in plane.unreadable_znodes()[znodes.topic_config_path("known")]
        # Garbage, twice in the config.
        garbage = {
            znodes.topic_path("known"): b"\x00not json",
            znodes.topic_config_path("known"): b"[1, 2",
            znodes.partition_state_path("known", 0): b'{"leader": "x"}',
        }
        for path, data in garbage.items():
            if path == znodes.partition_state_path("known", 0):
                write_state(zk, "known", 0, data)
            else:
                zk.set(path, data)
        zk.set(znodes.topic_config_path("known"), b"{}}")
        await until(
            lambda: all("Error" in plane.unreadable_znodes().get(path, "") for path in garbage),
            "every garbage znode is skipped",
        )
        await asyncio.sleep(0.5)
        # Still served, as it was: same id, partitions, states and configs; never removed.
        assert plane.image.topic("known") == before
        assert plane.skipped_znode_reads >= 6
        assert not plane.is_withheld("known")
        errors = [r for r in caplog.records if r.levelname == "ERROR" and r.name.startswith("strom")]
        assert all(getattr(r, "path", None) in {*garbage} for r in errors)
        # One error per path and reason, no tracebacks.
        assert not any(r.exc_info for r in errors)
        assert len(errors) <= 2 * len(garbage) + 1

        # Readable again: adopted.
        zk.set(
            znodes.topic_config_path("known"),
            json.dumps({"version": 1, "config": {"retention.ms": "5"}}).encode(),
        )
        write_state(zk, "known", 0, state_json(3))
        await until(
            lambda: (
                (t := plane.image.topic("known")) is not None
                and t.configs == {"retention.ms": "5"}
                and t.partitions[0].leader_epoch == 3
            ),
            "the readable config and state are adopted",
        )
        assert znodes.topic_config_path("known") not in plane.unreadable_znodes()

        # Only the controller's deletion (the topic znode removed) ends the topic.
        zk.delete(znodes.topic_path("known"), recursive=True)
        await until(lambda: plane.image.topic("known") is None, "the deleted topic leaves the image")
        assert not plane.is_withheld("known")

    run(zookeeper, tmp_path, scenario)


def test_a_topic_never_read_well_is_withheld_with_its_valid_config(
    zookeeper: ZooKeeperServer, zk: KazooClient, tmp_path: Path
) -> None:
    create_topic(zk, "old-format", None, {"cleanup.policy": "compact"})
    create_topic(zk, "bad-config", uuid.uuid4(), {"min.insync.replicas": "x"})
    zk.create(znodes.topic_path("garbage"), b"garbage", makepath=True)

    async def scenario(plane: ZkControlPlane, broker: Broker) -> None:
        # Started despite all three (a broker on main exits on the invalid value).
        bad = plane.image.topic("bad-config")
        assert bad is not None and bad.configs == {}  # the defaults: never valid
        assert plane.is_withheld("old-format") and plane.image.topic("old-format") is None
        assert plane.topic_configs("old-format") == {"cleanup.policy": "compact"}
        assert plane.is_withheld("garbage")
        # The controller gives the old-format topic an id: it is served from then on.
        topic_id = uuid.uuid4()
        zk.set(znodes.topic_path("old-format"), topic_json(topic_id))
        await until(lambda: plane.image.topic("old-format") is not None, "the upgraded topic is read")
        topic = plane.image.topic("old-format")
        assert (
            topic is not None
            and topic.topic_id == topic_id
            and topic.configs == {"cleanup.policy": "compact"}
        )
        assert not plane.is_withheld("old-format")
        # A topic id rewritten in place (no deletion: the same znode) does not replace the hosted topic.
        zk.set(znodes.topic_path("old-format"), topic_json(uuid.uuid4()))
        await until(
            lambda: (
                "without a deletion" in plane.unreadable_znodes().get(znodes.topic_path("old-format"), "")
            ),
            "the changed id is skipped",
        )
        assert plane.image.topic("old-format") == topic

    run(zookeeper, tmp_path, scenario)


def test_a_failing_watch_callback_is_re_read_until_the_topic_converges(
    zookeeper: ZooKeeperServer, zk: KazooClient, tmp_path: Path
) -> None:
    async def scenario(plane: ZkControlPlane, broker: Broker) -> None:
        create_topic(zk, "flaky", uuid.uuid4(), {})
        await until(lambda: ZkControlPlane.is_ready(plane.image.topic("flaky")), "the topic is read")
        await until(lambda: "flaky" in broker.told, "the broker is told of the topic")
        # Applying the next change fails once; nothing else changes afterwards.
        broker.fail_next.add("flaky")
        told = len(broker.told)
        write_state(zk, "flaky", 1, state_json(5))
        await until(lambda: len(broker.told) > told, "the broker is told of the new state after the failure")
        topic = plane.image.topic("flaky")
        assert topic is not None and topic.partitions[1].leader_epoch == 5
        # Later changes flow as before.
        told = len(broker.told)
        write_state(zk, "flaky", 0, state_json(6))
        await until(lambda: len(broker.told) > told, "the broker is told of a later state")

    run(zookeeper, tmp_path, scenario)


def test_re_registration_after_a_session_expiry_is_retried_until_it_succeeds(
    zookeeper: ZooKeeperServer, zk: KazooClient, tmp_path: Path
) -> None:
    async def scenario(plane: ZkControlPlane, broker: Broker) -> None:
        await plane.register(plane.registration([("PLAINTEXT", "127.0.0.1", 9092)]))
        path = znodes.broker_path(NODE_ID)
        assert zk.exists(path) is not None
        # The session expires: its ephemeral registration goes, and the first tries to register
        # again meet a lost connection.
        create = plane.zk.create
        failures = 3

        async def flaky_create(*args: Any, **kwargs: Any) -> str:
            nonlocal failures
            if args and args[0] == path and failures > 0:
                failures -= 1
                raise ConnectionLoss()
            return await create(*args, **kwargs)

        plane.zk.create = flaky_create  # type: ignore[method-assign]
        plane._on_session(SessionState.EXPIRED)
        zk.delete(path)
        plane._on_session(SessionState.CONNECTED)
        await until(lambda: zk.exists(path) is not None, "the broker is registered again")
        assert failures == 0
        assert zk.exists(path).ephemeralOwner == plane.zk.session_id

    run(zookeeper, tmp_path, scenario)


def test_a_deleted_topic_leaves_nothing_behind(
    zookeeper: ZooKeeperServer, zk: KazooClient, tmp_path: Path
) -> None:
    """Issue 17 item 18: what the control plane keeps per topic goes with the topic."""

    async def scenario(plane: ZkControlPlane, broker: Broker) -> None:
        names = [f"gone-{n}" for n in range(5)]
        for name in names:
            create_topic(zk, name, uuid.uuid4(), {})
        await until(lambda: all(ZkControlPlane.is_ready(plane.image.topic(n)) for n in names), "topics read")
        # One grows (CreatePartitions), one has an unreadable state.
        topic_id = plane.image.topic(names[0]).topic_id  # type: ignore[union-attr]
        zk.set(znodes.topic_path(names[0]), topic_json(topic_id, partitions=4))
        for p in (2, 3):
            write_state(zk, names[0], p, state_json(0), create=True)
        write_state(zk, names[1], 0, b"garbage")
        await until(
            lambda: (
                len(plane.image.topic(names[0]).partitions) == 4  # type: ignore[union-attr]
                and ZkControlPlane.is_ready(plane.image.topic(names[0]))
                and znodes.partition_state_path(names[1], 0) in plane.unreadable_znodes()
            ),
            "the new partitions and the unreadable state are read",
        )
        for name in names:
            zk.delete(znodes.topic_path(name), recursive=True)
            zk.delete(znodes.topic_config_path(name))
        await until(lambda: not any(n in plane.image for n in names), "the topics are gone")
        await asyncio.sleep(0.2)  # the cancelled watches' last events
        kept = {
            "topics": [n for n in plane._topics if n in names],
            "configs": [n for n in plane._configs if n in names],
            "states": [k for k in plane._states if k[0] in names],
            "watches": [n for n in plane._topic_watches if n in names],
            "unreadable": [p for p in plane.unreadable_znodes() if any(n in p for n in names)],
        }
        assert kept == {k: [] for k in kept}

    run(zookeeper, tmp_path, scenario)
