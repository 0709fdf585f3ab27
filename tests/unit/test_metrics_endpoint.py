"""The /metrics endpoint (strom.broker.metrics.endpoint) on a loop of its own: what it answers, and
that stalled or surplus scrapers cost only their own connections."""

from __future__ import annotations

import asyncio

import pytest

from strom.broker.metrics import endpoint
from strom.broker.metrics.endpoint import MetricsEndpoint


async def _read_all(reader: asyncio.StreamReader) -> bytes:
    """What the endpoint sent until it closed the connection (b"" if it aborted it unanswered)."""
    try:
        return await asyncio.wait_for(reader.read(), 5)
    except ConnectionResetError:
        return b""


async def _get(port: int, head: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)
    answer = await _read_all(reader)
    writer.close()
    return answer


async def _started(body: bytes = b"up 1\n") -> tuple[MetricsEndpoint, int]:
    async def scrape() -> bytes:
        return body

    server = MetricsEndpoint(scrape, "text/plain; version=0.0.4")
    _, port = await server.start("127.0.0.1", 0)
    return server, port


def test_get_metrics_is_answered_and_stop_closes_the_listener() -> None:
    async def run() -> None:
        server, port = await _started()
        answer = await _get(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
        assert answer.endswith(b"\r\n\r\nup 1\n")
        assert b"Content-Length: 5\r\n" in answer
        for head in (b"GET / HTTP/1.1\r\n\r\n", b"HEAD /metrics HTTP/1.1\r\n\r\n", b"nonsense\r\n\r\n"):
            assert (await _get(port, head)).startswith(b"HTTP/1.1 404 Not Found\r\n")
        await server.stop()
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)

    asyncio.run(run())


def test_stalled_and_surplus_scrapers_lose_only_their_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(endpoint, "HEAD_TIMEOUT_S", 0.3)
    monkeypatch.setattr(endpoint, "MAX_CLIENTS", 2)

    async def run() -> None:
        server, port = await _started()
        # Two clients that send half a request head and stall take every slot...
        stalled = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        for _, writer in stalled:
            writer.write(b"GET /metr")
        await asyncio.sleep(0.05)
        # ...so a third is closed at once, unanswered,
        assert await _get(port, b"GET /metrics HTTP/1.1\r\n\r\n") == b""
        # and the stalled ones are closed at the head timeout, freeing the slots.
        for reader, _ in stalled:
            assert await _read_all(reader) == b""
        assert (await _get(port, b"GET /metrics HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 200")
        await server.stop()

    asyncio.run(run())
