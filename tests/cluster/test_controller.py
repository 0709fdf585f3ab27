"""The controller against a real ZooKeeper: election, failover, fencing and its duties.

Brokers are stand-ins here: kazoo sessions that register /brokers/ids/N as a broker does, so a
broker dies when its session closes. Controllers run in the test's event loop, each on its own
ZooKeeper session. Every test works under its own chroot of one module-wide ZooKeeper server.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from strom.broker.config import KafkaConfig
from strom.broker.control_plane.controller import (
    ControlledShutdownReport,
    Controller,
    request_controlled_shutdown,
    request_preferred_leader_election,
)
from strom.broker.zk import znodes
from strom.broker.zk.client import READS_PER_REQUEST, AsyncZooKeeper, Create
from zkserver import ZooKeeperServer, java_available

SESSION_MS = 1500
WAIT_S = 10.0

_chroots = itertools.count()


@pytest.fixture(scope="module")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    if not java_available():
        pytest.skip("ZooKeeper (Debian's zookeeper package) and java are needed")
    folder: Path = tmp_path_factory.mktemp("zookeeper")
    with ZooKeeperServer(folder) as server:
        yield server


async def wait_until(condition: Callable[[], Awaitable[bool]], what: str, timeout: float = WAIT_S) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


class Cluster:
    """ZooKeeper under one chroot, stand-in brokers and controllers."""

    def __init__(self, connect: str) -> None:
        self.connect = connect
        self.admin = AsyncZooKeeper(connect, SESSION_MS, 5000)
        self.brokers: dict[int, KazooClient] = {}
        self.controllers: dict[int, tuple[Controller, AsyncZooKeeper]] = {}

    async def start(self) -> None:
        await self.admin.start()
        for path in znodes.PERSISTENT_PATHS:
            await self.admin.ensure_path(path)

    async def close(self) -> None:
        for controller, zk in self.controllers.values():
            await controller.stop()
            await zk.stop()
        for broker in list(self.brokers):
            await self.broker_down(broker)
        await self.admin.stop()

    # -- brokers --

    async def broker_up(self, broker_id: int) -> None:
        client = KazooClient(hosts=self.connect, timeout=SESSION_MS / 1000)
        await asyncio.to_thread(client.start, 5)
        registration = znodes.BrokerRegistration(
            broker_id, (f"PLAINTEXT://127.0.0.{10 + broker_id}:9092",), {"PLAINTEXT": "PLAINTEXT"}
        )
        await asyncio.to_thread(
            client.create, znodes.broker_path(broker_id), registration.encode(), ephemeral=True
        )
        self.brokers[broker_id] = client

    async def broker_down(self, broker_id: int) -> None:
        """Closing the session deletes the registration at once, as a broker's death does after its
        session timeout."""
        client = self.brokers.pop(broker_id)
        await asyncio.to_thread(client.stop)
        await asyncio.to_thread(client.close)

    # -- controllers --

    async def start_controller(self, broker_id: int, **overrides: str) -> Controller:
        zk = AsyncZooKeeper(self.connect, SESSION_MS, 5000)
        await zk.start()
        config = KafkaConfig.from_sources(
            {
                "zookeeper.connect": self.connect,
                "broker.id": str(broker_id),
                "auto.leader.rebalance.enable": "false",
            },
            overrides,
        )
        controller = Controller(zk, broker_id, config)
        await controller.start()
        self.controllers[broker_id] = (controller, zk)
        return controller

    def active(self) -> list[Controller]:
        return [c for c, _ in self.controllers.values() if c.active]

    async def wait_for_controller(self, other_than: Controller | None = None) -> Controller:
        async def one_active() -> bool:
            active = self.active()
            return len(active) == 1 and active[0] is not other_than

        await wait_until(one_active, "exactly one active controller")
        return self.active()[0]

    # -- znodes --

    async def create_topic(self, topic: str, assignment: dict[int, list[int]]) -> None:
        await self.admin.create(znodes.topic_path(topic), znodes.TopicZNode(None, assignment).encode())

    async def state(self, topic: str, partition: int) -> znodes.LeaderAndIsr | None:
        got = await self.admin.get_or_none(znodes.partition_state_path(topic, partition))
        return znodes.LeaderAndIsr.decode(got[0]) if got else None

    async def wait_state(
        self, topic: str, partition: int, check: Callable[[znodes.LeaderAndIsr], bool], what: str
    ) -> znodes.LeaderAndIsr:
        async def holds() -> bool:
            state = await self.state(topic, partition)
            return state is not None and check(state)

        await wait_until(holds, f"{topic}-{partition}: {what}")
        state = await self.state(topic, partition)
        assert state is not None
        return state

    async def set_isr(self, topic: str, partition: int, isr: list[int]) -> None:
        """What a leader does when its ISR grows or shrinks: a conditional write, same leader epoch."""
        data, stat = await self.admin.get(znodes.partition_state_path(topic, partition))
        state = znodes.LeaderAndIsr.decode(data)
        new = znodes.LeaderAndIsr(state.leader, state.leader_epoch, isr, state.controller_epoch)
        await self.admin.set(znodes.partition_state_path(topic, partition), new.encode(), stat.version)


@asynccontextmanager
async def cluster(zookeeper: ZooKeeperServer) -> AsyncIterator[Cluster]:
    c = Cluster(f"{zookeeper.connect}/controller-test-{next(_chroots)}")
    await c.start()
    try:
        yield c
    finally:
        await c.close()


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 60))


# -- election ------------------------------------------------------------------------------------


def test_one_controller_and_failover_bumps_the_epoch(zookeeper: ZooKeeperServer) -> None:
    async def body() -> None:
        async with cluster(zookeeper) as c:
            for broker in (1, 2, 3):
                await c.start_controller(broker)
            first = await c.wait_for_controller()
            await asyncio.sleep(0.3)
            assert c.active() == [first]
            data, _ = await c.admin.get(znodes.CONTROLLER)
            assert znodes.ControllerZNode.decode(data).broker_id in c.controllers
            epoch = znodes.decode_controller_epoch((await c.admin.get(znodes.CONTROLLER_EPOCH))[0])
            assert first.epoch == epoch >= 1

            await first.stop()  # a clean stop deletes /controller at once
            second = await c.wait_for_controller(other_than=first)
            assert second.epoch == epoch + 1
            assert first.epoch == -1 and not first.active
            await first.stop()  # idempotent

            # A controller whose session closes without a stop: its ephemeral goes with the session.
            (zk_of_second,) = [zk for ctl, zk in c.controllers.values() if ctl is second]
            await zk_of_second.stop()
            third = await c.wait_for_controller(other_than=second)
            assert third.epoch == epoch + 2

    run(body)


# -- partitions and brokers ----------------------------------------------------------------------


def test_new_topics_broker_failure_and_rejoin(zookeeper: ZooKeeperServer) -> None:
    async def body() -> None:
        async with cluster(zookeeper) as c:
            for broker in (1, 2, 3):
                await c.broker_up(broker)
            controller = await c.start_controller(1)
            await c.wait_for_controller()
            epoch = controller.epoch
            await c.create_topic("t", {0: [1, 2, 3], 1: [2, 3, 1], 2: [3, 1, 2]})
            for p, replicas in {0: [1, 2, 3], 1: [2, 3, 1], 2: [3, 1, 2]}.items():
                state = await c.wait_state("t", p, lambda s: True, "created")
                assert state == znodes.LeaderAndIsr(replicas[0], 0, replicas, epoch)

            # Broker 1 dies: it leads p0 (-> 2, the next in assignment order in the ISR), follows p1, p2.
            await c.broker_down(1)
            s0 = await c.wait_state("t", 0, lambda s: s.leader == 2, "leader 2")
            assert (s0.isr, s0.leader_epoch) == ([2, 3], 1)
            s1 = await c.wait_state("t", 1, lambda s: 1 not in s.isr, "1 out of the ISR")
            assert (s1.leader, s1.isr, s1.leader_epoch) == (2, [2, 3], 1)
            s2 = await c.wait_state("t", 2, lambda s: 1 not in s.isr, "1 out of the ISR")
            assert (s2.leader, s2.isr, s2.leader_epoch) == (3, [3, 2], 1)

            # A new partition of a running topic, with a dead replica first.
            await c.admin.set(
                znodes.topic_path("t"),
                znodes.TopicZNode(None, {0: [1, 2, 3], 1: [2, 3, 1], 2: [3, 1, 2], 3: [1, 3, 2]}).encode(),
            )
            s3 = await c.wait_state("t", 3, lambda s: True, "created")
            assert (s3.leader, s3.isr, s3.leader_epoch) == (3, [3, 2], 0)

            # 2 and 3 die too: each partition goes offline with its last ISR, never an empty one.
            await c.broker_down(2)
            await c.wait_state("t", 0, lambda s: s.leader == 3, "leader 3")
            await c.broker_down(3)
            for p in range(4):
                state = await c.wait_state("t", p, lambda s: s.leader == -1, "offline")
                assert state.isr == [3]
            offline_epoch = (await c.state("t", 0)).leader_epoch  # type: ignore[union-attr]

            # A topic created with no replica live starts offline, its ISR the whole assignment.
            await c.create_topic("nobody", {0: [2, 1]})
            assert await c.wait_state("nobody", 0, lambda s: True, "created") == znodes.LeaderAndIsr(
                -1, 0, [2, 1], epoch
            )

            # 1 comes back, out of sync everywhere: no unclean election. "nobody" gets it as leader.
            await c.broker_up(1)
            await c.wait_state("nobody", 0, lambda s: s.leader == 1, "leader 1")
            await asyncio.sleep(0.3)
            assert (await c.state("t", 0)) == znodes.LeaderAndIsr(-1, offline_epoch, [3], epoch)

            # 3, the last in-sync replica, comes back: it leads again, one epoch later.
            await c.broker_up(3)
            for p in range(4):
                state = await c.wait_state("t", p, lambda s: s.leader == 3, "leader 3")
                assert state.isr == [3]
            assert (await c.state("t", 0)).leader_epoch == offline_epoch + 1  # type: ignore[union-attr]

    run(body)


def test_restarted_broker_leaves_isr_and_leadership(zookeeper: ZooKeeperServer) -> None:
    async def body() -> None:
        async with cluster(zookeeper) as c:
            for broker in (1, 2):
                await c.broker_up(broker)
            await c.start_controller(1)
            await c.wait_for_controller()
            await c.create_topic("r", {0: [2, 1], 1: [1, 2]})
            await c.wait_state("r", 1, lambda s: s.isr == [1, 2], "created")
            # A restart within one watch round: the registration's czxid changes (a new broker epoch).
            await c.broker_down(2)
            await c.broker_up(2)
            s0 = await c.wait_state("r", 0, lambda s: s.leader_epoch >= 1 and s.leader == 1, "leader 1")
            assert s0.isr == [1]
            s1 = await c.wait_state("r", 1, lambda s: 2 not in s.isr, "2 out of the ISR")
            assert (s1.leader, s1.leader_epoch) == (1, 1)

    run(body)


def test_unclean_election_only_when_the_topic_allows_it(zookeeper: ZooKeeperServer) -> None:
    async def body() -> None:
        async with cluster(zookeeper) as c:
            for broker in (1, 2):
                await c.broker_up(broker)
            await c.start_controller(1)
            await c.wait_for_controller()
            await c.admin.create(
                znodes.topic_config_path("dirty"),
                znodes.EntityConfigZNode({"unclean.leader.election.enable": "true"}).encode(),
            )
            await c.create_topic("dirty", {0: [1, 2]})
            await c.create_topic("clean", {0: [1, 2]})
            for topic in ("dirty", "clean"):
                await c.wait_state(topic, 0, lambda s: s.isr == [1, 2], "created")
                await c.set_isr(topic, 0, [1])  # the leader shrank the ISR: 2 fell behind
            await c.broker_down(1)
            dirty = await c.wait_state("dirty", 0, lambda s: s.leader == 2, "unclean leader 2")
            assert dirty.isr == [2]
            clean = await c.wait_state("clean", 0, lambda s: s.leader == -1, "offline")
            assert clean.isr == [1]

    run(body)


# -- fencing -------------------------------------------------------------------------------------


def test_a_fenced_controller_fails_its_write_and_resigns(zookeeper: ZooKeeperServer) -> None:
    async def body() -> None:
        async with cluster(zookeeper) as c:
            await c.broker_up(1)
            controller = await c.start_controller(1)
            await c.wait_for_controller()
            old_epoch = controller.epoch
            # Another controller's epoch bump, as if this one had been replaced while it slept.
            await c.admin.set(znodes.CONTROLLER_EPOCH, znodes.encode_controller_epoch(old_epoch + 5))
            await c.create_topic("f", {0: [1]})
            # Its write fails the epoch check; it resigns, frees /controller and wins a new term.
            await wait_until(
                lambda: _true(controller.epoch == old_epoch + 6), "re-election at the next epoch"
            )
            state = await c.wait_state("f", 0, lambda s: True, "created")
            assert state.controller_epoch == old_epoch + 6

    run(body)


async def _true(value: bool) -> bool:
    return value


def test_an_expired_controller_resigns_and_another_takes_over(zookeeper: ZooKeeperServer) -> None:
    async def body() -> None:
        async with cluster(zookeeper) as c:
            await c.broker_up(1)
            await c.broker_up(2)
            for broker in (1, 2):
                await c.start_controller(broker)
            first = await c.wait_for_controller()
            epoch = first.epoch
            (zk_of_first,) = [zk for ctl, zk in c.controllers.values() if ctl is first]
            # Expire its session from the server's side: another client with the same session id and
            # password closes it (the classic ZooKeeper test trick).
            session_id, password = zk_of_first._client.client_id
            thief = KazooClient(hosts=c.connect, client_id=(session_id, password))
            await asyncio.to_thread(thief.start, 5)
            await asyncio.to_thread(thief.stop)
            await asyncio.to_thread(thief.close)
            second = await c.wait_for_controller(other_than=first)
            assert second.epoch == epoch + 1
            await wait_until(
                lambda: _true(not first.active and first.epoch == -1), "the old controller resigned"
            )
            # The new term writes; the old one, back on a new session, stays a follower.
            await c.create_topic("x", {0: [2, 1]})
            state = await c.wait_state("x", 0, lambda s: True, "created")
            assert state.controller_epoch == epoch + 1
            assert c.active() == [second]

    run(body)


# -- controlled shutdown, preferred election, deletion --------------------------------------------


def test_controlled_shutdown_moves_leadership_and_isr(zookeeper: ZooKeeperServer) -> None:
    async def body() -> None:
        async with cluster(zookeeper) as c:
            for broker in (1, 2, 3):
                await c.broker_up(broker)
            await c.start_controller(2)
            await c.wait_for_controller()
            await c.create_topic("cs", {0: [1, 2, 3], 1: [2, 1, 3], 2: [3, 2, 1]})
            await c.create_topic("single", {0: [1]})
            for p in range(3):
                await c.wait_state("cs", p, lambda s: len(s.isr) == 3, "created")
            assert await request_controlled_shutdown(c.admin, 1, 5.0)
            for p in range(3):
                state = await c.wait_state("cs", p, lambda s: True, "")
                assert state.leader != 1 and 1 not in state.isr and state.leader_epoch == 1
            assert (await c.state("cs", 0)).leader == 2  # type: ignore[union-attr]
            # A single-replica partition cannot move and does not hold the shutdown up.
            assert (await c.state("single", 0)).leader == 1  # type: ignore[union-attr]
            assert await c.admin.exists(znodes.controlled_shutdown_path(1)) is None

            # A leader whose followers are all out of sync cannot hand over: not done in time.
            await c.set_isr("cs", 0, [2])
            assert not await request_controlled_shutdown(c.admin, 2, 1.0)
            assert (await c.state("cs", 0)).leader == 2  # type: ignore[union-attr]
            assert await c.admin.exists(znodes.controlled_shutdown_path(2)) is None

    run(body)


def test_controlled_shutdown_report_json() -> None:
    request = ControlledShutdownReport(3, "abc")
    assert json.loads(request.encode_request()) == {"version": 1, "broker": 3, "request_id": "abc"}
    report = ControlledShutdownReport(3, "abc", 7, 0, 1, False)
    assert ControlledShutdownReport.decode(report.encode()) == report
    assert ControlledShutdownReport.decode(request.encode_request()) == request


def test_preferred_and_automatic_leader_election(zookeeper: ZooKeeperServer) -> None:
    async def body() -> None:
        async with cluster(zookeeper) as c:
            for broker in (1, 2, 3):
                await c.broker_up(broker)
            await c.start_controller(3)
            await c.wait_for_controller()
            await c.create_topic("p", {0: [1, 2, 3], 1: [1, 3, 2]})
            for p in range(2):
                await c.wait_state("p", p, lambda s: s.leader == 1, "created")
            await c.broker_down(1)
            for p in range(2):
                await c.wait_state("p", p, lambda s: s.leader != 1 and 1 not in s.isr, "failed over")
            await c.broker_up(1)
            # Broker 1 caught up and its leaders took it back into the ISR.
            await c.set_isr("p", 0, [2, 3, 1])
            await request_preferred_leader_election(c.admin, [("p", 0), ("p", 1)])
            s0 = await c.wait_state("p", 0, lambda s: s.leader == 1, "preferred leader back")
            assert (s0.isr, s0.leader_epoch) == ([2, 3, 1], 2)
            await wait_until(
                lambda: _absent(c.admin, znodes.PREFERRED_REPLICA_ELECTION), "the election request removed"
            )
            assert (await c.state("p", 1)).leader == 3  # type: ignore[union-attr]  # 1 not in its ISR

            # The periodic check: a controller with auto.leader.rebalance.enable moves p1 back by itself.
            for ctl, _ in c.controllers.values():
                await ctl.stop()
            await c.start_controller(
                2,
                **{
                    "auto.leader.rebalance.enable": "true",
                    "leader.imbalance.check.interval.seconds": "1",
                    "leader.imbalance.per.broker.percentage": "10",
                },
            )
            await c.set_isr("p", 1, [3, 2, 1])
            await c.wait_state("p", 1, lambda s: s.leader == 1, "rebalanced to the preferred leader")

    run(body)


async def _absent(zk: AsyncZooKeeper, path: str) -> bool:
    return await zk.exists(path) is None


def test_topic_deletion(zookeeper: ZooKeeperServer) -> None:
    async def body() -> None:
        async with cluster(zookeeper) as c:
            await c.broker_up(1)
            await c.start_controller(1)
            await c.wait_for_controller()
            await c.admin.create(znodes.topic_config_path("gone"), znodes.EntityConfigZNode({}).encode())
            await c.create_topic("gone", {0: [1], 1: [1]})
            await c.create_topic("kept", {0: [1]})
            await c.wait_state("gone", 1, lambda s: True, "created")
            await c.admin.create(znodes.delete_topic_path("gone"))
            await c.admin.create(znodes.delete_topic_path("never-existed"))
            for path in (
                znodes.topic_path("gone"),
                znodes.topic_config_path("gone"),
                znodes.delete_topic_path("gone"),
                znodes.delete_topic_path("never-existed"),
            ):
                await wait_until(lambda p=path: _absent(c.admin, p), f"{path} deleted")  # type: ignore[misc]
            assert await c.state("kept", 0) is not None

    run(body)


def test_partition_reassignment(zookeeper: ZooKeeperServer) -> None:
    async def body() -> None:
        async with cluster(zookeeper) as c:
            for broker in (1, 2, 3):
                await c.broker_up(broker)
            await c.start_controller(3)
            await c.wait_for_controller()
            await c.create_topic("ra", {0: [1, 2], 1: [2, 3]})
            await c.wait_state("ra", 0, lambda s: s.isr == [1, 2], "created")
            await c.admin.create(
                znodes.REASSIGN_PARTITIONS,
                znodes.encode_reassignment([znodes.PartitionReplicas("ra", 0, [2, 3])]),
            )

            async def topic() -> znodes.TopicZNode:
                return znodes.TopicZNode.decode((await c.admin.get(znodes.topic_path("ra")))[0])

            async def started() -> bool:
                return (await topic()).adding_replicas == {0: [3]}

            await wait_until(started, "the reassignment in the topic znode")
            znode = await topic()
            assert (znode.partitions, znode.removing_replicas) == ({0: [2, 3, 1], 1: [2, 3]}, {0: [1]})
            assert (await c.state("ra", 0)).leader_epoch == 1  # type: ignore[union-attr]
            await wait_until(lambda: _absent(c.admin, znodes.REASSIGN_PARTITIONS), "the request removed")

            await c.set_isr("ra", 0, [1, 2, 3])  # the new replica caught up
            state = await c.wait_state("ra", 0, lambda s: s.leader == 2, "leadership moved into the targets")
            assert (state.isr, state.leader_epoch) == ([2, 3], 2)
            znode = await topic()
            assert znode.partitions == {0: [2, 3], 1: [2, 3]}
            assert (znode.adding_replicas, znode.removing_replicas) == ({}, {})

    run(body)


# -- batched reads -------------------------------------------------------------------------------


def test_get_many_reads_every_znode_in_multi_reads(zookeeper: ZooKeeperServer) -> None:
    """The controller's batched reads against a real ZooKeeper, under a chroot: more paths than one
    multiRead carries, znodes that do not exist (None, where a plain read raises), and what kazoo's
    one-at-a-time reads say about each."""

    async def body() -> None:
        zk = AsyncZooKeeper(f"{zookeeper.connect}/batched-reads", SESSION_MS, 5000)
        await zk.start()
        try:
            await zk.ensure_path("/r")
            count = READS_PER_REQUEST + 7
            for start in range(0, count, 250):
                await zk.multi(
                    [Create(f"/r/n{i}", f"data-{i}".encode()) for i in range(start, min(start + 250, count))]
                )
            await zk.set("/r/n3", b"changed")
            paths = [f"/r/n{i}" for i in range(count)] + ["/r/missing", "/no/such/parent"]
            got = await zk.get_many(paths)
            assert got[-2:] == [None, None]
            for path, answer in zip(paths[:-2], got[:-2], strict=True):
                assert answer is not None
                one = await zk.get(path)
                assert answer[0] == one[0] and answer[1].version == one[1].version, path
            assert got[3] is not None and got[3][1].version == 1
            children = await zk.get_children_many(["/r", "/r/n0", "/r/missing"])
            assert children[0] is not None and sorted(children[0]) == sorted(
                p.rsplit("/", 1)[1] for p in paths[:-2]
            )
            assert children[1:] == [[], None]
            assert await zk.get_many([]) == []
        finally:
            await zk.stop()

    run(body)
