"""The leader's check of who may fetch as a follower, and ISR expansion by live brokers only
(issue 17, item 1), on one replica manager with the fake cluster link of
test_replication_partition; tests/cluster/test_replica_identity.py tries it from outside."""

from __future__ import annotations

import asyncio
from pathlib import Path

from strom.broker.control_plane.metadata import PartitionState
from strom.broker.replica_manager import ReplicaManager
from strom.storage import LogConfig, LogManager
from unit.storage.storage_batches import make_batch
from unit.test_replication_partition import TP, Clock, FakeLink, follower_fetch, make_manager, topic_state


def test_only_a_live_brokers_own_fetcher_is_accepted(tmp_path: Path) -> None:
    async def scenario() -> None:
        link = FakeLink(1)
        manager = make_manager(tmp_path, Clock(), link)
        accepts = manager.accepts_replica_fetch
        # Broker 2 is registered on 127.0.0.12 with epoch 102.
        assert await accepts(2, -1, "127.0.0.12")  # no epoch before Fetch v15: the host decides
        assert await accepts(2, 102, "127.0.0.12")
        assert await accepts(2, 102, "::ffff:127.0.0.12")  # IPv4 through an IPv6 socket
        assert not await accepts(2, 101, "127.0.0.12")  # a stale (or any other) epoch
        assert not await accepts(2, 102, "127.0.0.1")  # another host
        assert not await accepts(2, 102, "127.0.0.13")  # another broker's host
        assert not await accepts(1, 101, "127.0.0.11")  # this broker itself
        assert not await accepts(7, -1, "127.0.0.17")  # not registered
        del link.epochs[3]
        assert not await accepts(3, 103, "127.0.0.13")  # its registration is gone

    asyncio.run(scenario())


def test_a_registered_host_name_is_resolved(tmp_path: Path) -> None:
    class NamedLink(FakeLink):
        def broker_endpoint(self, broker_id: int) -> tuple[str, int] | None:
            return ("localhost", 9092) if broker_id in self.epochs else None

    async def scenario() -> None:
        manager = make_manager(tmp_path, Clock(), NamedLink(1))
        assert await manager.accepts_replica_fetch(2, 102, "127.0.0.1")
        assert not await manager.accepts_replica_fetch(2, 102, "127.0.0.12")

    asyncio.run(scenario())


def test_a_single_node_has_no_followers(tmp_path: Path) -> None:
    async def scenario() -> None:
        log_manager = LogManager([tmp_path / "logs"])
        log_manager.startup(lambda _: LogConfig())
        manager = ReplicaManager(log_manager, lambda topic: LogConfig(), node_id=1)
        for replica_id in (0, 1, 2):
            assert not await manager.accepts_replica_fetch(replica_id, -1, "127.0.0.1")
        log_manager.shutdown()

    asyncio.run(scenario())


def test_only_a_live_broker_rejoins_the_isr(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock, link = Clock(), FakeLink(1)
        manager = make_manager(tmp_path, clock, link)
        state = PartitionState(0, 1, 0, [1, 2, 3], [1])
        link.states[("t", 0)] = state
        await manager.become_leader_or_follower(topic_state(state), [state])
        partition = manager.partition(TP)
        assert partition is not None and partition.isr == [1]
        assert (await manager.append(1, [(TP, make_batch(2))]))[TP].error == 0
        # Broker 3's registration is gone (dead, or fenced by a new session not seen yet): caught
        # up or not, it does not join the ISR; broker 2 does.
        del link.epochs[3]
        await follower_fetch(manager, 3, 2)
        await asyncio.sleep(0.01)
        assert partition.isr == [1] and link.writes == []
        await follower_fetch(manager, 2, 2)
        await asyncio.sleep(0.01)
        assert partition.isr == [1, 2]
        await manager.shutdown()
        manager.log_manager.shutdown()

    asyncio.run(scenario())
