"""The controller against an in-memory ZooKeeper (tests/fakezk.py), with ConnectionLoss injected
at every one of its writes: whichever write fails -- before it is applied, or after with the answer
lost -- the event is retried and the cluster ends where it ends without the fault.

Brokers are sessions that register /brokers/ids/N; the test itself plays the partition leaders
where a duty needs one (a reassignment waits for its new replicas to join the ISR).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

import pytest

from fakezk import FakeZooKeeper, FakeZooKeeperServer
from strom.broker.config import KafkaConfig
from strom.broker.control_plane.controller import Controller, request_controlled_shutdown
from strom.broker.control_plane.controller import duties as controller_duties
from strom.broker.control_plane.controller import events as controller_events
from strom.broker.control_plane.controller import writer as controller_writer
from strom.broker.zk import znodes

WAIT_S = 5.0


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(controller_events, "RETRY_BACKOFF_MIN_S", 0.005)
    monkeypatch.setattr(controller_events, "RETRY_BACKOFF_MAX_S", 0.02)


class Harness:
    def __init__(self) -> None:
        self.server = FakeZooKeeperServer()
        self.admin = FakeZooKeeper(self.server)
        self.brokers: dict[int, FakeZooKeeper] = {}
        self.zk = FakeZooKeeper(self.server)
        self.controller: Controller | None = None
        for path in znodes.PERSISTENT_PATHS:
            self.server.ensure(path)

    async def broker_up(self, broker_id: int) -> None:
        session = FakeZooKeeper(self.server)
        registration = znodes.BrokerRegistration(
            broker_id, (f"PLAINTEXT://127.0.0.{10 + broker_id}:9092",), {"PLAINTEXT": "PLAINTEXT"}
        )
        await session.create(znodes.broker_path(broker_id), registration.encode(), ephemeral=True)
        self.brokers[broker_id] = session

    async def broker_down(self, broker_id: int) -> None:
        await self.brokers.pop(broker_id).stop()

    async def start_controller(self, **overrides: str) -> Controller:
        config = KafkaConfig.from_sources(
            {"zookeeper.connect": "fake:2181", "broker.id": "100", "auto.leader.rebalance.enable": "false"},
            overrides,
        )
        self.controller = Controller(self.zk, 100, config)
        await self.controller.start()
        return self.controller

    async def stop(self) -> None:
        if self.controller is not None:
            await self.controller.stop()

    def create_topic(self, topic: str, assignment: dict[int, list[int]], topic_id: bool = True) -> None:
        znode = znodes.TopicZNode(
            znodes.decode_uuid("AAAAAAAAAAAAAAAAAAAAAQ") if topic_id else None, assignment
        )
        self.server.put(znodes.topic_path(topic), znode.encode())

    def state(self, topic: str, partition: int) -> znodes.LeaderAndIsr | None:
        data = self.server.data(znodes.partition_state_path(topic, partition))
        return znodes.LeaderAndIsr.decode(data) if data is not None else None

    def states(self, topic: str) -> dict[int, znodes.LeaderAndIsr | None]:
        data = self.server.data(znodes.topic_path(topic))
        assert data is not None
        return {p: self.state(topic, p) for p in znodes.TopicZNode.decode(data).partitions}

    def set_state(self, topic: str, partition: int, state: znodes.LeaderAndIsr) -> None:
        self.server.put(znodes.partition_state_path(topic, partition), state.encode())

    async def wait(self, condition: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while not condition():
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            await asyncio.sleep(0.01)

    async def quiet(self) -> None:
        """Until the controller has nothing queued and has written nothing for a while."""
        writes = -1
        while writes != self.zk.writes:
            writes = self.zk.writes
            await asyncio.sleep(0.1)


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 120))


@dataclass
class Scenario:
    """``setup`` brings the cluster to a settled state (controller active), ``action`` makes the
    change the controller reacts to, ``converged`` says whether the cluster is where it belongs."""

    setup: Callable[[Harness], Awaitable[None]]
    action: Callable[[Harness], Awaitable[None]]
    converged: Callable[[Harness], bool]
    helper: Callable[[Harness], None] = field(default=lambda h: None)  # a leader's work, polled


async def _run_scenario(scenario: Scenario, fault: tuple[int, bool] | None) -> int:
    """Run ``scenario`` with ConnectionLoss at the controller's write ``fault[0]`` after the
    action (``fault[1]``: applied before the loss); the number of writes the controller made."""
    h = Harness()
    try:
        await scenario.setup(h)
        await h.quiet()
        before = h.zk.writes
        if fault is not None:
            h.zk.fail_write(fault[0], applied=fault[1])

        def converged() -> bool:
            scenario.helper(h)
            return scenario.converged(h)

        await scenario.action(h)
        await h.wait(converged, f"convergence (fault {fault})")
        await h.quiet()
        assert converged(), f"diverged after converging (fault {fault})"
        return h.zk.writes - before
    finally:
        await h.stop()


async def _at_every_write(scenario: Scenario) -> None:
    writes = await _run_scenario(scenario, None)
    assert writes > 0
    for index in range(writes):
        for applied in (False, True):
            await _run_scenario(scenario, (index, applied))


async def _three_brokers_and_a_topic(h: Harness) -> None:
    for broker in (1, 2, 3):
        await h.broker_up(broker)
    h.create_topic("t", {0: [1, 2, 3], 1: [2, 3, 1], 2: [3, 1, 2], 3: [1, 3, 2]})
    await h.start_controller()
    await h.wait(lambda: all(s is not None and s.leader > 0 for s in h.states("t").values()), "leaders")


# -- brokers -------------------------------------------------------------------------------------


def _without(broker: int) -> Callable[[Harness], bool]:
    def converged(h: Harness) -> bool:
        return all(
            s is not None and s.leader not in (broker, -1) and broker not in s.isr
            for s in h.states("t").values()
        )

    return converged


def test_broker_failure_converges_after_a_failed_write() -> None:
    async def down(h: Harness) -> None:
        await h.broker_down(1)

    run(lambda: _at_every_write(Scenario(_three_brokers_and_a_topic, down, _without(1))))


def test_broker_restart_converges_after_a_failed_write() -> None:
    """A broker back with a new session (a new broker epoch) leaves every ISR and leadership first."""

    async def restart(h: Harness) -> None:
        await h.broker_down(2)
        await h.broker_up(2)

    run(lambda: _at_every_write(Scenario(_three_brokers_and_a_topic, restart, _without(2))))


def test_broker_startup_brings_offline_partitions_back_after_a_failed_write() -> None:
    async def setup(h: Harness) -> None:
        await h.broker_up(3)
        h.create_topic("t", {0: [1, 2], 1: [2, 1]})
        await h.start_controller()
        await h.wait(lambda: all(s is not None for s in h.states("t").values()), "states")

    async def up(h: Harness) -> None:
        await h.broker_up(1)

    run(
        lambda: _at_every_write(
            Scenario(
                setup, up, lambda h: all(s is not None and s.leader == 1 for s in h.states("t").values())
            )
        )
    )


def test_controller_failover_converges_after_a_failed_write() -> None:
    """A new controller brings partitions whose leader died while there was none in line."""

    async def setup(h: Harness) -> None:
        for broker in (2, 3):
            await h.broker_up(broker)
        h.create_topic("t", {0: [1, 2, 3], 1: [1, 3, 2]})
        for p in (0, 1):
            h.set_state("t", p, znodes.LeaderAndIsr(1, 3, [1, 2, 3], 1))

    async def start(h: Harness) -> None:
        await h.start_controller()

    run(lambda: _at_every_write(Scenario(setup, start, _without(1))))


# -- topics --------------------------------------------------------------------------------------


def test_topic_creation_converges_after_a_failed_write() -> None:
    async def setup(h: Harness) -> None:
        for broker in (1, 2, 3):
            await h.broker_up(broker)
        await h.start_controller()

    async def create(h: Harness) -> None:
        h.create_topic("t", {p: [1 + p % 3, 1 + (p + 1) % 3] for p in range(5)})

    def converged(h: Harness) -> bool:
        return all(s is not None and s.leader > 0 for s in h.states("t").values())

    run(lambda: _at_every_write(Scenario(setup, create, converged)))


def test_topic_deletion_converges_after_a_failed_write() -> None:
    async def setup(h: Harness) -> None:
        await _three_brokers_and_a_topic(h)
        h.server.put(znodes.topic_config_path("t"), znodes.EntityConfigZNode({"retention.ms": "1"}).encode())

    async def delete(h: Harness) -> None:
        h.server.put(znodes.delete_topic_path("t"), b"")

    def converged(h: Harness) -> bool:
        return not any(
            h.server.data(p) is not None
            for p in (znodes.topic_path("t"), znodes.topic_config_path("t"), znodes.delete_topic_path("t"))
        )

    run(lambda: _at_every_write(Scenario(setup, delete, converged)))


# -- controlled shutdown, preferred election, reassignment ---------------------------------------


def test_controlled_shutdown_converges_after_a_failed_write() -> None:
    done: list[bool] = []

    async def shutdown(h: Harness) -> None:
        async def ask() -> None:
            done.append(await request_controlled_shutdown(h.brokers[1], 1, WAIT_S))

        done.clear()
        asyncio.get_running_loop().create_task(ask())

    def converged(h: Harness) -> bool:
        return done == [True] and all(
            s is not None and s.leader != 1 and 1 not in s.isr for s in h.states("t").values()
        )

    run(lambda: _at_every_write(Scenario(_three_brokers_and_a_topic, shutdown, converged)))


def test_preferred_election_converges_after_a_failed_write() -> None:
    async def setup(h: Harness) -> None:
        await _three_brokers_and_a_topic(h)
        for p in range(4):
            h.set_state("t", p, znodes.LeaderAndIsr(2 if p != 1 else 3, 5, [1, 2, 3], 1))

    async def elect(h: Harness) -> None:
        h.server.put(znodes.PREFERRED_REPLICA_ELECTION, znodes.encode_partition_list([("t", 0), ("t", 1)]))

    def converged(h: Harness) -> bool:
        s0, s1 = h.state("t", 0), h.state("t", 1)
        return (
            s0 is not None
            and s0.leader == 1
            and s1 is not None
            and s1.leader == 2
            and h.server.data(znodes.PREFERRED_REPLICA_ELECTION) is None
        )

    run(lambda: _at_every_write(Scenario(setup, elect, converged)))


def _leader_adds_new_replicas(h: Harness) -> None:
    """The partition leaders' part of a reassignment: new replicas catch up and join the ISR."""
    for topic in h.server.children(znodes.TOPICS):
        data = h.server.data(znodes.topic_path(topic))
        if data is None:
            continue
        znode = znodes.TopicZNode.decode(data)
        for partition, adding in znode.adding_replicas.items():
            state = h.state(topic, partition)
            if state is not None and not set(adding) <= set(state.isr):
                h.set_state(
                    topic,
                    partition,
                    znodes.LeaderAndIsr(
                        state.leader,
                        state.leader_epoch,
                        state.isr + [b for b in adding if b not in state.isr],
                        state.controller_epoch,
                    ),
                )


def test_reassignment_converges_after_a_failed_write() -> None:
    async def setup(h: Harness) -> None:
        for broker in (1, 2, 3, 4):
            await h.broker_up(broker)
        h.create_topic("t", {0: [1, 2], 1: [2, 3], 2: [3, 4]})
        await h.start_controller()
        await h.wait(lambda: all(s is not None for s in h.states("t").values()), "states")

    targets = {0: [3, 4], 1: [2, 1], 2: [3, 4]}

    async def reassign(h: Harness) -> None:
        h.server.put(
            znodes.REASSIGN_PARTITIONS,
            znodes.encode_reassignment([znodes.PartitionReplicas("t", p, r) for p, r in targets.items()]),
        )

    def converged(h: Harness) -> bool:
        data = h.server.data(znodes.topic_path("t"))
        assert data is not None
        znode = znodes.TopicZNode.decode(data)
        states = h.states("t")
        return (
            h.server.data(znodes.REASSIGN_PARTITIONS) is None
            and znode.partitions == targets
            and not znode.adding_replicas
            and not znode.removing_replicas
            and all(
                (s := states[p]) is not None and s.leader in r and set(s.isr) <= set(r)
                for p, r in targets.items()
            )
        )

    run(lambda: _at_every_write(Scenario(setup, reassign, converged, _leader_adds_new_replicas)))


def test_reassignment_request_survives_a_concurrent_topic_change() -> None:
    """A topic znode written meanwhile (BadVersion) is no reason to drop the request: the controller
    reads it again and starts the reassignment, and deletes the request only then."""

    async def body() -> None:
        h = Harness()
        try:
            for broker in (1, 2, 3):
                await h.broker_up(broker)
            h.create_topic("t", {0: [1, 2], 1: [2, 3]})
            await h.start_controller()
            await h.wait(lambda: all(s is not None for s in h.states("t").values()), "states")
            await h.quiet()
            # Every write of the topic znode by the controller meets a version written a moment before.
            real_multi = h.zk.multi
            bumps = [3]

            async def multi(ops: list) -> list:  # type: ignore[type-arg]
                if bumps[0] > 0 and any(getattr(op, "path", "") == znodes.topic_path("t") for op in ops):
                    bumps[0] -= 1
                    data = h.server.data(znodes.topic_path("t"))
                    assert data is not None
                    h.server.put(znodes.topic_path("t"), data)
                return await real_multi(ops)

            h.zk.multi = multi  # type: ignore[method-assign]
            h.server.put(
                znodes.REASSIGN_PARTITIONS,
                znodes.encode_reassignment(
                    [znodes.PartitionReplicas("t", 0, [3, 1]), znodes.PartitionReplicas("t", 1, [3, 1])]
                ),
            )
            await h.wait(lambda: h.server.data(znodes.REASSIGN_PARTITIONS) is None, "the request consumed")
            data = h.server.data(znodes.topic_path("t"))
            assert data is not None
            znode = znodes.TopicZNode.decode(data)
            assert znode.adding_replicas == {0: [3], 1: [1]}
            assert bumps == [0]
        finally:
            await h.stop()

    run(body)


# -- topic ids (Kafka 2.x topic znodes) ----------------------------------------------------------


def test_topic_without_an_id_gets_one_after_a_failed_write() -> None:
    """A topic znode as Kafka 2.x's --zookeeper tools write it (no topic_id) gets an id, once: a
    retry after a lost answer keeps the id written."""
    seen: list[str] = []

    async def setup(h: Harness) -> None:
        for broker in (1, 2):
            await h.broker_up(broker)
        await h.start_controller()
        seen.clear()

    async def create(h: Harness) -> None:
        h.server.put(znodes.topic_path("old"), b'{"version":1,"partitions":{"0":[1,2],"1":[2,1]}}')

    def converged(h: Harness) -> bool:
        data = h.server.data(znodes.topic_path("old"))
        assert data is not None
        znode = znodes.TopicZNode.decode(data)
        if znode.topic_id is None:
            return False
        seen.append(str(znode.topic_id))
        assert len(set(seen)) == 1, "the topic id changed"
        assert znode.partitions == {0: [1, 2], 1: [2, 1]}
        return all(s is not None and s.leader > 0 for s in h.states("old").values())

    run(lambda: _at_every_write(Scenario(setup, create, converged)))


# -- config change notifications -----------------------------------------------------------------


def test_config_change_notifications_are_purged_after_15_minutes() -> None:
    async def body() -> None:
        h = Harness()
        try:
            await h.broker_up(1)
            path = f"{znodes.CONFIG_CHANGES}/{znodes.CONFIG_CHANGE_PREFIX}"
            change = znodes.encode_config_change("topics", "t")
            h.server.clock_offset_ms = -16 * 60 * 1000
            old = [await h.admin.create(path, change, sequence=True) for _ in range(3)]
            h.server.clock_offset_ms = -10 * 60 * 1000
            recent = await h.admin.create(path, change, sequence=True)
            h.server.clock_offset_ms = 0
            await h.start_controller()
            # Purged when the controller starts, and whenever a new notification arrives.
            await h.wait(lambda: not any(h.server.data(p) is not None for p in old), "old notifications gone")
            assert h.server.data(recent) is not None
            h.server.clock_offset_ms = -20 * 60 * 1000
            older = await h.admin.create(path, change, sequence=True)
            h.server.clock_offset_ms = 0
            newest = await h.admin.create(path, change, sequence=True)
            await h.wait(lambda: h.server.data(older) is None, "the expired notification gone")
            await h.quiet()
            assert h.server.children(znodes.CONFIG_CHANGES) == sorted(
                p.rsplit("/", 1)[1] for p in (recent, newest)
            )
        finally:
            await h.stop()

    run(body)


# -- znodes the controller cannot parse ----------------------------------------------------------


def test_garbage_znodes_are_skipped_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """Garbage topic znodes (at start and new ones), a non-JSON topic config and a garbage partition
    state: the controller stays elected (its epoch does not move), elects leaders for every other
    partition, new topics included, and a controlled shutdown still finishes."""

    async def body() -> None:
        h = Harness()
        try:
            for broker in (1, 2, 3):
                await h.broker_up(broker)
            h.create_topic("good", {0: [1, 2, 3], 1: [2, 3, 1], 2: [3, 1, 2]})
            h.server.put(znodes.topic_path("garbage"), b"{not json")
            h.server.put(znodes.topic_path("list"), b"[1,2]")
            h.server.put(znodes.topic_path("badids"), b'{"version":3,"partitions":{"x":[1]},"topic_id":"?"}')
            h.server.put(znodes.topic_config_path("good"), b"\xff not json")
            garbage_state = znodes.partition_state_path("good", 2)
            h.server.put(garbage_state, b'{"leader":"one"}')
            controller = await h.start_controller()
            await h.wait(
                lambda: all((s := h.state("good", p)) is not None and s.leader > 0 for p in (0, 1)), "leaders"
            )
            epoch = controller.epoch
            assert controller.active and epoch == 1

            h.server.put(znodes.topic_path("new-garbage"), b"\x00\x01")
            h.create_topic("later", {0: [1, 2], 1: [2, 3]})
            await h.wait(
                lambda: all(s is not None and s.leader > 0 for s in h.states("later").values()), "later"
            )

            await h.broker_down(1)  # every partition of "good" is looked at again, the garbage state too
            await h.wait(
                lambda: all((s := h.state("good", p)) is not None and s.leader in (2, 3) for p in (0, 1)),
                "failover",
            )
            done = await asyncio.wait_for(request_controlled_shutdown(h.brokers[2], 2, WAIT_S), 2 * WAIT_S)
            assert done
            await h.quiet()
            assert controller.active and controller.epoch == epoch
            assert h.server.data(znodes.CONTROLLER_EPOCH) == b"1"
            assert h.server.data(garbage_state) == b'{"leader":"one"}'  # left as it is
            for topic in ("garbage", "list", "badids", "new-garbage"):
                assert h.server.data(znodes.topic_path(topic)) is not None  # never taken for deleted
            assert controller.unparseable_znodes == 6
            logged = [r for r in caplog.records if r.getMessage() == "skipping a znode that cannot be parsed"]
            assert sorted(r.__dict__["path"] for r in logged) == sorted(
                [
                    znodes.topic_path("garbage"),
                    znodes.topic_path("list"),
                    znodes.topic_path("badids"),
                    znodes.topic_path("new-garbage"),
                    znodes.topic_config_path("good"),
                    garbage_state,
                ]
            )
        finally:
            await h.stop()

    run(body)


def test_cancelled_reassignment_takes_the_added_replicas_out_of_the_isr() -> None:
    """A cancellation (the original replicas asked for again) drops the replicas the reassignment
    added from the ISR too: an ISR never names a broker that is not a replica."""

    async def setup(h: Harness) -> None:
        for broker in (1, 2, 3, 4):
            await h.broker_up(broker)
        h.create_topic("t", {0: [1, 2]})
        await h.start_controller()
        await h.wait(lambda: h.state("t", 0) is not None, "state")
        h.server.put(
            znodes.REASSIGN_PARTITIONS, znodes.encode_reassignment([znodes.PartitionReplicas("t", 0, [3, 4])])
        )
        await h.wait(lambda: h.server.data(znodes.REASSIGN_PARTITIONS) is None, "started")
        state = h.state("t", 0)
        assert state is not None
        h.set_state("t", 0, replace(state, isr=[*state.isr, 3]))  # 3 caught up, 4 not yet

    async def cancel(h: Harness) -> None:
        h.server.put(
            znodes.REASSIGN_PARTITIONS, znodes.encode_reassignment([znodes.PartitionReplicas("t", 0, [1, 2])])
        )

    def converged(h: Harness) -> bool:
        data = h.server.data(znodes.topic_path("t"))
        assert data is not None
        znode = znodes.TopicZNode.decode(data)
        state = h.state("t", 0)
        return (
            h.server.data(znodes.REASSIGN_PARTITIONS) is None
            and znode.partitions == {0: [1, 2]}
            and not znode.adding_replicas
            and state is not None
            and state.leader in (1, 2)
            and set(state.isr) <= {1, 2}
        )

    run(lambda: _at_every_write(Scenario(setup, cancel, converged)))


def test_topic_rewritten_without_its_id_gets_the_same_id_back() -> None:
    """An old tool adds a partition and writes the topic znode in Kafka 2.x's format (no id): the
    topic keeps the id its logs are under, and the new partition gets a leader."""

    async def setup(h: Harness) -> None:
        await _three_brokers_and_a_topic(h)

    async def rewrite(h: Harness) -> None:
        h.server.put(
            znodes.topic_path("t"),
            b'{"version":1,"partitions":{"0":[1,2,3],"1":[2,3,1],"2":[3,1,2],"3":[1,3,2],"4":[2,1,3]}}',
        )

    def converged(h: Harness) -> bool:
        data = h.server.data(znodes.topic_path("t"))
        assert data is not None
        znode = znodes.TopicZNode.decode(data)
        if znode.topic_id is None:
            return False
        assert znode.topic_id == znodes.decode_uuid("AAAAAAAAAAAAAAAAAAAAAQ"), znode.topic_id
        return len(znode.partitions) == 5 and all(
            s is not None and s.leader > 0 for s in h.states("t").values()
        )

    run(lambda: _at_every_write(Scenario(setup, rewrite, converged)))


# -- batched reads and writes --------------------------------------------------------------------
# Partition states are read pipelined and written STATES_PER_WRITE to a fenced multi-op; with three
# to a multi-op, seven partitions take three of them, and every fault above lands in the middle of
# a chunked duty too.

SEVEN = {p: [2, 1, 3] for p in range(7)}


@pytest.fixture
def chunks_of_three(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(controller_writer, "STATES_PER_WRITE", 3)


async def _three_brokers_and_seven_partitions(h: Harness) -> None:
    for broker in (1, 2, 3):
        await h.broker_up(broker)
    h.create_topic("t", SEVEN)
    await h.start_controller()
    await h.wait(lambda: all(s is not None and s.leader == 2 for s in h.states("t").values()), "leaders")


def _notified(h: Harness) -> list[list[tuple[str, int]]]:
    """The partitions each /isr_change_notification znode lists, oldest first."""
    return [
        znodes.decode_partition_list(h.server.data(f"{znodes.ISR_CHANGE_NOTIFICATION}/{name}") or b"")
        for name in h.server.children(znodes.ISR_CHANGE_NOTIFICATION)
    ]


@pytest.mark.usefixtures("chunks_of_three")
def test_chunked_broker_failure_converges_after_a_failed_write() -> None:
    async def down(h: Harness) -> None:
        await h.broker_down(1)

    def converged(h: Harness) -> bool:
        return all(s is not None and s.leader == 2 and s.isr == [2, 3] for s in h.states("t").values())

    run(lambda: _at_every_write(Scenario(_three_brokers_and_seven_partitions, down, converged)))


@pytest.mark.usefixtures("chunks_of_three")
def test_chunked_controller_failover_converges_after_a_failed_write() -> None:
    async def setup(h: Harness) -> None:
        for broker in (2, 3):
            await h.broker_up(broker)
        h.create_topic("t", {p: [1, 2, 3] for p in range(7)})
        for p in range(7):
            h.set_state("t", p, znodes.LeaderAndIsr(1, 3, [1, 2, 3], 1))

    async def start(h: Harness) -> None:
        await h.start_controller()

    run(lambda: _at_every_write(Scenario(setup, start, _without(1))))


@pytest.mark.usefixtures("chunks_of_three")
def test_chunked_topic_creation_and_deletion_converge_after_a_failed_write() -> None:
    async def setup(h: Harness) -> None:
        for broker in (1, 2, 3):
            await h.broker_up(broker)
        await h.start_controller()

    async def create(h: Harness) -> None:
        h.create_topic("t", SEVEN)

    def created(h: Harness) -> bool:
        return all(s is not None and s.leader == 2 for s in h.states("t").values())

    async def delete(h: Harness) -> None:
        h.server.put(znodes.delete_topic_path("t"), b"")

    def deleted(h: Harness) -> bool:
        return (
            h.server.data(znodes.topic_path("t")) is None
            and h.server.data(znodes.delete_topic_path("t")) is None
        )

    run(lambda: _at_every_write(Scenario(setup, create, created)))
    run(lambda: _at_every_write(Scenario(_three_brokers_and_seven_partitions, delete, deleted)))


@pytest.mark.usefixtures("chunks_of_three")
def test_chunked_controlled_shutdown_converges_after_a_failed_write() -> None:
    done: list[bool] = []

    async def setup(h: Harness) -> None:
        await _three_brokers_and_seven_partitions(h)

    async def shutdown(h: Harness) -> None:
        async def ask() -> None:
            done.append(await request_controlled_shutdown(h.brokers[2], 2, WAIT_S))

        done.clear()
        asyncio.get_running_loop().create_task(ask())

    def converged(h: Harness) -> bool:
        return done == [True] and all(
            s is not None and s.leader == 1 and s.isr == [1, 3] for s in h.states("t").values()
        )

    run(lambda: _at_every_write(Scenario(setup, shutdown, converged)))


async def _failure_with_a_leaders_isr_change(before_write: int | None) -> int:
    """Broker 1 dies; leader 2 shrinks partition 4's ISR just before the controller's write
    ``before_write`` (None: not at all). The number of writes the controller made."""
    h = Harness()
    try:
        await _three_brokers_and_seven_partitions(h)
        await h.quiet()
        before = h.zk.writes

        def shrink() -> None:
            state = h.state("t", 4)
            assert state is not None
            h.set_state("t", 4, replace(state, isr=[b for b in state.isr if b != 3]))

        if before_write is not None:
            h.zk.before_write(before_write, shrink)
        await h.broker_down(1)

        def converged() -> bool:
            return all(
                s is not None
                and s.leader == 2
                and s.isr == ([2] if p == 4 and before_write is not None else [2, 3])
                for p, s in h.states("t").items()
            )

        await h.wait(converged, f"convergence (leader's write before write {before_write})")
        await h.quiet()
        assert converged()
        return h.zk.writes - before
    finally:
        await h.stop()


@pytest.mark.usefixtures("chunks_of_three")
def test_a_leaders_isr_change_between_read_and_write_loses_no_decision() -> None:
    """Before each of the controller's writes in turn, the leader changes partition 4's ISR (in the
    middle of the second chunk): a multi-op that fails on partition 4's version is written without
    it, partition 4 is read and decided again -- and keeps the leader's change."""

    async def body() -> None:
        writes = await _failure_with_a_leaders_isr_change(None)
        assert writes == 3  # seven partitions, three to a multi-op
        for index in range(writes):
            await _failure_with_a_leaders_isr_change(index)

    run(body)


def test_every_state_write_announces_its_partitions() -> None:
    """Creation and every later change of partition states create a notification listing exactly
    the partitions written, in the same multi-op."""

    async def body() -> None:
        h = Harness()
        try:
            await _three_brokers_and_seven_partitions(h)
            assert _notified(h) == [[("t", p) for p in range(7)]]
            h.set_state("t", 5, znodes.LeaderAndIsr(2, 0, [2, 3], 1))  # 1 is out of 5's ISR already
            await h.broker_down(1)
            await h.wait(
                lambda: all(s is not None and 1 not in s.isr for s in h.states("t").values()), "ISRs"
            )
            await h.quiet()
            assert _notified(h)[1:] == [[("t", p) for p in range(7) if p != 5]]
        finally:
            await h.stop()

    run(body)


def test_isr_change_notifications_are_purged_after_a_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(controller_duties, "ISR_CHANGE_PURGE_INTERVAL_S", 0.05)

    async def body() -> None:
        h = Harness()
        try:
            await h.broker_up(1)
            path = f"{znodes.ISR_CHANGE_NOTIFICATION}/{znodes.ISR_CHANGE_PREFIX}"
            change = znodes.encode_partition_list([("t", 0)])
            h.server.clock_offset_ms = -2 * 60 * 1000
            old = [await h.admin.create(path, change, sequence=True) for _ in range(3)]
            h.server.clock_offset_ms = -10 * 1000
            recent = await h.admin.create(path, change, sequence=True)
            h.server.clock_offset_ms = 0
            await h.start_controller()
            await h.wait(lambda: all(h.server.data(p) is None for p in old), "old notifications gone")
            await asyncio.sleep(0.3)
            assert h.server.data(recent) is not None
        finally:
            await h.stop()

    run(body)
