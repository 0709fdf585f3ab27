"""The in-memory ZooKeeper (tests/fakezk.py) behaves as ZooKeeper does where the controller relies
on it: versions, all-or-nothing multi-ops with Check, ephemerals, czxids, sequential znodes,
watches, and the faults it injects."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from kazoo.exceptions import BadVersionError, ConnectionLoss, NodeExistsError, NoNodeError, NotEmptyError

from fakezk import FakeZooKeeper, FakeZooKeeperServer
from strom.broker.zk.client import Check, Create, Delete, MultiOpFailed, SetData


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 30))


def test_versions_and_conditional_writes() -> None:
    async def body() -> None:
        zk = FakeZooKeeper(FakeZooKeeperServer())
        await zk.create("/a", b"1")
        data, stat = await zk.get("/a")
        assert (data, stat.version) == (b"1", 0)
        assert (await zk.set("/a", b"2", 0)).version == 1
        with pytest.raises(BadVersionError):
            await zk.set("/a", b"3", 0)
        with pytest.raises(NodeExistsError):
            await zk.create("/a")
        with pytest.raises(NoNodeError):
            await zk.create("/missing/child")
        await zk.create("/a/b")
        with pytest.raises(NotEmptyError):
            await zk.delete("/a")
        await zk.delete("/a", recursive=True)
        assert await zk.exists("/a") is None

    run(body)


def test_multi_is_all_or_nothing_and_names_the_failed_op() -> None:
    async def body() -> None:
        zk = FakeZooKeeper(FakeZooKeeperServer())
        await zk.create("/epoch", b"1")
        with pytest.raises(MultiOpFailed) as failed:
            await zk.multi([Check("/epoch", 0), Create("/x"), Create("/x/y"), SetData("/epoch", b"2", 5)])
        assert failed.value.index == 3 and isinstance(failed.value.cause, BadVersionError)
        assert await zk.exists("/x") is None  # nothing of it applied
        results = await zk.multi(
            [Check("/epoch", 0), Create("/x"), Create("/x/y"), SetData("/epoch", b"2", 0)]
        )
        assert results[3].version == 1 and await zk.exists("/x/y") is not None
        with pytest.raises(MultiOpFailed) as failed:
            await zk.multi([Check("/epoch", 0), Delete("/x/y")])
        assert failed.value.index == 0

    run(body)


def test_ephemerals_go_with_their_session_and_czxid_is_new_each_time() -> None:
    async def body() -> None:
        server = FakeZooKeeperServer()
        admin, broker = FakeZooKeeper(server), FakeZooKeeper(server)
        await admin.create("/ids")
        await broker.create("/ids/1", ephemeral=True)
        first = await admin.exists("/ids/1")
        assert first is not None and first.ephemeralOwner == broker.session_id
        await broker.stop()
        assert await admin.exists("/ids/1") is None
        again = FakeZooKeeper(server)
        await again.create("/ids/1", ephemeral=True)
        second = await admin.exists("/ids/1")
        assert second is not None and second.czxid > first.czxid

    run(body)


def test_sequential_znodes_and_ctime() -> None:
    async def body() -> None:
        server = FakeZooKeeperServer()
        zk = FakeZooKeeper(server)
        await zk.create("/changes")
        server.clock_offset_ms = -60_000
        old = await zk.create("/changes/c_", sequence=True)
        server.clock_offset_ms = 0
        new = await zk.create("/changes/c_", sequence=True)
        assert (old, new) == ("/changes/c_0000000000", "/changes/c_0000000001")
        old_stat, new_stat = await zk.exists(old), await zk.exists(new)
        assert old_stat is not None and new_stat is not None
        assert new_stat.ctime - old_stat.ctime >= 59_000

    run(body)


def test_watches_fire_now_and_on_each_change_of_their_kind() -> None:
    async def body() -> None:
        zk = FakeZooKeeper(FakeZooKeeperServer())
        await zk.create("/t", b"v0")
        data_calls: list[bytes | None] = []
        child_calls: list[list[str]] = []
        await zk.watch_data("/t", lambda data, _stat: data_calls.append(data))
        watch = await zk.watch_children("/t", child_calls.append)
        assert data_calls == [b"v0"] and child_calls == [[]]
        await zk.create("/t/p")  # children only
        await asyncio.sleep(0)
        assert data_calls == [b"v0"] and child_calls == [[], ["p"]]
        await zk.set("/t", b"v1")  # data only
        await asyncio.sleep(0)
        assert data_calls == [b"v0", b"v1"] and child_calls == [[], ["p"]]
        watch.cancel()
        await zk.delete("/t", recursive=True)
        await asyncio.sleep(0)
        assert data_calls == [b"v0", b"v1", None] and child_calls == [[], ["p"]]

    run(body)


def test_injected_connection_loss_before_or_after_the_write() -> None:
    async def body() -> None:
        zk = FakeZooKeeper(FakeZooKeeperServer())
        zk.fail_write(0)
        with pytest.raises(ConnectionLoss):
            await zk.create("/a")
        assert await zk.exists("/a") is None
        zk.fail_write(1, applied=True)
        await zk.create("/a")
        with pytest.raises(ConnectionLoss):
            await zk.multi([Create("/a/b")])
        assert await zk.exists("/a/b") is not None  # applied; only the answer was lost
        assert zk.writes == 3

    run(body)
