"""A TCP proxy for network faults between processes on one machine (this kernel has no netem).

``NetProxy(target).start()`` listens on a loopback address and forwards every connection to
``target`` in both directions. Its mode applies to every connection, present and future:

- ``pass_through()``: bytes flow as they arrive.
- ``delay(seconds)``: each chunk is forwarded ``seconds`` after the proxy read it (order kept).
- ``blackhole()``: nothing flows either way and connections stay open, as in a network
  partition; what the proxy reads meanwhile is held back, not dropped, and flows once the link
  heals, as TCP retransmission would deliver it (dropping bytes would corrupt the stream, which
  no real partition does). New connections are accepted but reach the target only after healing.
- ``reset()``: every connection is closed with a TCP RST on both sides, and new ones are reset
  on arrival, until another mode is set: a peer that restarts or a firewall that rejects.

A broker reaches ZooKeeper through a proxy when its ``zookeeper.connect`` names the proxy; a
broker's inbound links (clients and followers) go through one when it advertises the proxy's
address. The proxy runs its own asyncio loop in a thread, so synchronous tests drive it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import socket
import struct
import threading
import time
from collections.abc import Coroutine
from types import TracebackType
from typing import Any

CHUNK = 65536


class Mode(enum.Enum):
    PASS = "pass"
    DELAY = "delay"
    BLACKHOLE = "blackhole"
    RESET = "reset"


def _abort_with_rst(writer: asyncio.StreamWriter) -> None:
    """Close so that the peer gets a RST rather than a FIN: linger on, with a timeout of 0."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Link:
    """One client connection and its connection to the target, with a pump each way."""

    def __init__(
        self, proxy: NetProxy, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        self.proxy = proxy
        self.client_reader = client_reader
        self.client_writer = client_writer
        self.upstream_writer: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.closed = False

    async def run(self) -> None:
        # Client-to-target bytes are queued from the start: while blackholed, the target is not
        # even connected yet, yet the client may already be writing.
        to_upstream: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        reader = asyncio.create_task(self._read(self.client_reader, to_upstream))
        self.tasks.append(reader)
        await self.proxy._flowing()
        if self.closed:  # reset (or the proxy stopped) while this link waited for the link to heal
            return
        try:
            upstream_reader, self.upstream_writer = await asyncio.open_connection(*self.proxy.target)
        except OSError:
            self.close(rst=True)  # the target refuses: the client sees its connection reset
            return
        if self.closed:  # reset while this link waited to connect
            _abort_with_rst(self.upstream_writer)
            return
        to_client: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        self.tasks += [
            asyncio.create_task(self._write(to_upstream, self.upstream_writer)),
            asyncio.create_task(self._read(upstream_reader, to_client)),
            asyncio.create_task(self._write(to_client, self.client_writer)),
        ]
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.close(rst=False)

    async def _read(self, reader: asyncio.StreamReader, queue: asyncio.Queue[tuple[float, bytes]]) -> None:
        try:
            while data := await reader.read(CHUNK):
                queue.put_nowait((time.monotonic() + self.proxy.delay_seconds, data))
        except OSError:
            pass
        queue.put_nowait((0.0, b""))  # end of stream

    async def _write(self, queue: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                due, data = await queue.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                await self.proxy._flowing()
                if not data:
                    # A half-close travels on as a half-close; the other direction may go on.
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()
        except OSError:
            # One side is gone: take the whole link down, as a broken TCP path would.
            self.close(rst=True)

    def close(self, *, rst: bool) -> None:
        if self.closed:
            return
        self.closed = True
        for task in self.tasks:
            if task is not asyncio.current_task():
                task.cancel()
        for writer in (self.client_writer, self.upstream_writer):
            if writer is None:
                continue
            if rst:
                _abort_with_rst(writer)
            else:
                writer.close()
        self.proxy._links.discard(self)


class NetProxy:
    """A TCP proxy from ``listen_host:listen_port`` (0: a free port) to ``target`` (``host:port``)."""

    def __init__(self, target: str, *, listen_host: str = "127.0.0.1", listen_port: int = 0) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.host = listen_host
        self.port = listen_port
        self.mode = Mode.PASS
        self.delay_seconds = 0.0
        self._links: set[_Link] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._healed: asyncio.Event | None = None

    @property
    def address(self) -> str:
        """``host:port`` to connect to instead of the target."""
        return f"{self.host}:{self.port}"

    @property
    def connections(self) -> int:
        """Connections currently open through the proxy."""
        return len(self._links)

    # -- lifecycle, from the test's thread ---------------------------------------------------

    def start(self) -> NetProxy:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def run() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._listen())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name=f"netproxy-{self.target[1]}", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError(f"proxy to {self.target} did not start")
        return self

    async def _listen(self) -> None:
        self._healed = asyncio.Event()
        self._healed.set()
        self._server = await asyncio.start_server(self._accept, self.host, self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        if self._loop is None:
            return
        self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        assert self._thread is not None
        self._thread.join(10)
        self._loop.close()
        self._loop = None

    async def _shutdown(self) -> None:
        assert self._server is not None and self._healed is not None
        self._server.close()
        self._healed.set()  # links still waiting for the link to heal give up (they are closed)
        for link in list(self._links):
            link.close(rst=False)
        await self._server.wait_closed()

    def __enter__(self) -> NetProxy:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _call(self, coroutine: Coroutine[Any, Any, None]) -> None:
        assert self._loop is not None, "proxy not started"
        asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(10)

    # -- faults ------------------------------------------------------------------------------

    def pass_through(self) -> None:
        self._call(self._set(Mode.PASS, 0.0))

    def delay(self, seconds: float) -> None:
        self._call(self._set(Mode.DELAY, seconds))

    def blackhole(self) -> None:
        self._call(self._set(Mode.BLACKHOLE, self.delay_seconds))

    def reset(self) -> None:
        self._call(self._set(Mode.RESET, 0.0))

    async def _set(self, mode: Mode, delay: float) -> None:
        assert self._healed is not None
        self.mode = mode
        self.delay_seconds = delay
        if mode is Mode.BLACKHOLE:
            self._healed.clear()
        else:
            self._healed.set()
        if mode is Mode.RESET:
            for link in list(self._links):
                link.close(rst=True)

    async def _flowing(self) -> None:
        assert self._healed is not None
        await self._healed.wait()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link(self, reader, writer)
        if self.mode is Mode.RESET:
            link.closed = True
            _abort_with_rst(writer)
            return
        self._links.add(link)
        await link.run()
