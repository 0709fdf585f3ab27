"""KafkaConnection's limits, driven with fake transports: request memory and connection quotas."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import pytest

from strom.broker import network
from strom.broker.network import ConnectionQuotas, KafkaConnection, NetworkLimits, RequestMemory


class FakeTransport:
    def __init__(self, ip: str) -> None:
        self.ip = ip
        self.reading = True
        self.closed = False
        self.written: list[bytes] = []

    def get_extra_info(self, name: str) -> Any:
        return (self.ip, 1234) if name == "peername" else None

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def writelines(self, parts: list[bytes]) -> None:
        self.written.append(b"".join(parts))

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True


def limits(memory: int, per_ip: int = 100, total: int = 100) -> NetworkLimits:
    return NetworkLimits(
        max_request_size=1 << 20,
        queued_max_requests=4,
        memory=RequestMemory(memory),
        quotas=ConnectionQuotas(total, per_ip, {"10.0.0.9": 1}),
    )


def connect(
    shared: NetworkLimits, ip: str = "10.0.0.1", answered: asyncio.Event | None = None
) -> tuple[KafkaConnection, FakeTransport]:
    async def handle(_conn: KafkaConnection, frame: memoryview) -> list[bytes]:
        if answered is not None:
            await answered.wait()
        return [b"ok", bytes(frame[:2])]

    connection = KafkaConnection(handle, shared)
    transport = FakeTransport(ip)
    connection.connection_made(transport)  # type: ignore[arg-type]
    return connection, transport


def test_partial_requests_stop_reading_at_the_bound_and_the_furthest_may_finish() -> None:
    async def run() -> None:
        shared = limits(memory=1000)
        a, ta = connect(shared)
        b, tb = connect(shared)
        a.data_received(struct.pack(">i", 800) + b"a" * 600)  # 604 bytes of a request
        assert ta.reading and shared.memory.used == 604
        b.data_received(struct.pack(">i", 800) + b"b" * 500)  # 504 more: over the bound
        # Only partial requests hold memory: nothing would ever free it, so one may finish.
        assert shared.memory.used == 1108
        assert ta.reading and not tb.reading
        a.data_received(b"a" * 200)  # a's request is whole; it is handled and answered
        await asyncio.sleep(0)
        assert ta.written and shared.memory.used == 504
        assert tb.reading  # memory freed: everyone reads again
        a.close()
        b.close()
        assert shared.memory.used == 0 and shared.memory.answerable == 0

    asyncio.run(run())


def test_whole_requests_awaiting_answers_keep_readers_paused_until_answered() -> None:
    async def run() -> None:
        shared = limits(memory=100)
        gate = asyncio.Event()
        a, ta = connect(shared, answered=gate)
        b, tb = connect(shared)
        a.data_received(struct.pack(">i", 150) + b"x" * 150)
        await asyncio.sleep(0)
        b.data_received(struct.pack(">i", 10) + b"y" * 2)
        assert not ta.reading and not tb.reading  # a's answer will release memory: no exemption
        gate.set()
        await asyncio.sleep(0.01)
        assert ta.reading and tb.reading and shared.memory.used == 6
        a.close()
        b.close()

    asyncio.run(run())


def test_connection_quotas_close_the_newest_and_count_closes() -> None:
    async def run() -> None:
        shared = limits(memory=0, per_ip=2, total=4)
        first = [connect(shared, "10.0.0.1") for _ in range(2)]
        refused, t_refused = connect(shared, "10.0.0.1")  # over max.connections.per.ip
        assert t_refused.closed and refused not in shared.connections
        overridden, _ = connect(shared, "10.0.0.9")
        _, t_second = connect(shared, "10.0.0.9")  # its override allows one
        assert t_second.closed
        other, _ = connect(shared, "10.0.0.2")
        _, t_over = connect(shared, "10.0.0.3")  # over max.connections
        assert t_over.closed
        first[0][0].close()
        again, t_again = connect(shared, "10.0.0.1")
        assert not t_again.closed and again in shared.connections
        for conn in (first[1][0], overridden, other, again):
            conn.close()
        assert not shared.connections

    asyncio.run(run())


def test_when_the_finishing_sender_leaves_another_partial_request_may_finish() -> None:
    async def run() -> None:
        shared = limits(memory=1000)
        a, ta = connect(shared)
        b, tb = connect(shared)
        c, tc = connect(shared)
        a.data_received(struct.pack(">i", 800) + b"a" * 700)
        b.data_received(struct.pack(">i", 800) + b"b" * 550)
        c.data_received(struct.pack(">i", 800) + b"c" * 500)
        assert ta.reading and not tb.reading and not tc.reading  # a is furthest along
        a.close()  # it leaves without finishing; memory is still over the bound
        assert shared.memory.used == 1058 and shared.memory.exhausted
        assert tb.reading and not tc.reading  # now b, the furthest of those left, may finish
        b.close()
        c.close()
        assert shared.memory.used == 0 and shared.memory.answerable == 0

    asyncio.run(run())


def test_the_request_let_through_must_keep_arriving_or_lose_its_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(network, "PROGRESS_WINDOW_S", 0.05)
    monkeypatch.setattr(network, "MIN_PROGRESS_RATE", 2_000)  # 100 bytes a window

    async def run() -> None:
        shared = limits(memory=1000)
        a, ta = connect(shared)
        b, tb = connect(shared)
        c, tc = connect(shared)
        a.data_received(struct.pack(">i", 800) + b"a" * 600)
        b.data_received(struct.pack(">i", 800) + b"b" * 550)
        assert ta.reading and not tb.reading  # a may finish
        a.data_received(b"a" * 150)  # enough for the first window, but it buys nothing after
        for _ in range(10):  # then a trickle: far below the minimum rate
            await asyncio.sleep(0.02)
            a.data_received(b"a")
            if ta.closed:
                break
        assert ta.closed  # a lost its connection and its memory
        assert tb.reading  # memory suffices again: b (and everyone) reads
        assert shared.memory.used == 554  # b's
        c.data_received(struct.pack(">i", 10) + b"c" * 10)  # served as usual
        await asyncio.sleep(0)
        assert tc.written
        b.close()
        c.close()
        assert shared.memory.used == 0

    asyncio.run(run())


def test_bytes_of_an_unfinished_request_are_not_activity() -> None:
    async def run() -> None:
        shared = limits(memory=10_000)
        a, _ = connect(shared)
        connected = a.last_active
        a.data_received(struct.pack(">i", 800) + b"a" * 10)
        await asyncio.sleep(0.01)
        a.data_received(b"a" * 10)
        assert a.last_active == connected
        assert a.idle_since(connected + 5) == pytest.approx(5)
        a.data_received(b"a" * 780)  # the request is whole: that is activity
        assert a.last_active > connected
        a.close()

    asyncio.run(run())


def frame(tag: bytes) -> bytes:
    return struct.pack(">i", len(tag)) + tag


def test_a_request_waiting_in_purgatory_lets_the_next_ones_in_and_responses_keep_their_order() -> None:
    """An acks=all produce answers with a task once appended: the requests behind it are handled
    while it waits for its followers, and every response still leaves in request order."""

    async def run() -> None:
        shared = limits(memory=1 << 20)  # queued.max.requests 4
        replicated: dict[bytes, asyncio.Future[None]] = {}
        handled: list[bytes] = []

        async def handle(_conn: KafkaConnection, request: memoryview) -> network.Response:
            tag = bytes(request)
            handled.append(tag)
            if not tag.startswith(b"wait"):
                return [b"re:" + tag]
            future = replicated[tag] = asyncio.get_running_loop().create_future()

            async def when_replicated() -> list[bytes] | None:
                await future
                return [b"re:" + tag]

            return asyncio.get_running_loop().create_task(when_replicated())

        connection = KafkaConnection(handle, shared)
        transport = FakeTransport("10.0.0.1")
        connection.connection_made(transport)  # type: ignore[arg-type]
        connection.data_received(frame(b"wait-1") + frame(b"meta") + frame(b"wait-2") + frame(b"meta-2"))
        await asyncio.sleep(0.01)
        # All four handled though the first still waits; nothing answered before it.
        assert handled == [b"wait-1", b"meta", b"wait-2", b"meta-2"]
        assert transport.written == [] and connection.idle_since(1e12) == 0.0
        replicated[b"wait-2"].set_result(None)
        await asyncio.sleep(0.01)
        assert transport.written == []  # wait-2 is done, but wait-1 is answered first
        replicated[b"wait-1"].set_result(None)
        await asyncio.sleep(0.01)
        assert transport.written == [b"re:wait-1", b"re:meta", b"re:wait-2", b"re:meta-2"]
        assert shared.memory.used == 0  # each request's bytes released once answered

        # At most queued.max.requests responses wait: the fifth request is not handled until one
        # of them is written.
        handled.clear()
        transport.written.clear()
        connection.data_received(b"".join(frame(b"wait-%d" % i) for i in range(3, 9)))
        await asyncio.sleep(0.01)
        assert handled == [b"wait-3", b"wait-4", b"wait-5", b"wait-6"]
        replicated[b"wait-3"].set_result(None)
        await asyncio.sleep(0.01)
        assert transport.written == [b"re:wait-3"] and handled[-1] == b"wait-7"

        # A closed connection cancels what still waits.
        waiting = [f for tag, f in replicated.items() if not f.done()]
        connection.connection_lost(None)
        await asyncio.sleep(0.01)
        assert shared.memory.used == 0
        assert waiting and all(f.cancelled() for f in waiting)  # their waits were cancelled
        assert len(transport.written) == 1

    asyncio.run(run())
