"""``GET /metrics`` over HTTP/1.x, on the broker's event loop.

The endpoint is an asyncio server on the loop, as the Kafka listeners are: the collectors read the
broker's structures, which only the loop may touch. One request per connection (the answer closes
it). Whatever a scraper does costs it, not the broker: at most ``MAX_CLIENTS`` connections at a time
(more are closed at once), ``MAX_HEADER_BYTES`` of request head read within ``HEAD_TIMEOUT_S``, and
the answer written within ``WRITE_TIMEOUT_S`` or the connection is dropped. Anything but
``GET /metrics`` is answered 404. Concurrent scrapes share one collection at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

MAX_CLIENTS = 8
MAX_HEADER_BYTES = 8192
HEAD_TIMEOUT_S = 5.0
WRITE_TIMEOUT_S = 10.0


def _response(status: str, content_type: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


_NOT_FOUND = _response(
    "404 Not Found", "text/plain; charset=utf-8", b"Not found: Strom serves GET /metrics\n"
)


class MetricsEndpoint:
    """Serves ``scrape()``'s bytes (Prometheus' text format, ``content_type``) at ``/metrics``."""

    def __init__(self, scrape: Callable[[], Awaitable[bytes]], content_type: str) -> None:
        self._scrape = scrape
        self._content_type = content_type
        self._server: asyncio.Server | None = None
        self._clients: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Listen on ``host``:``port`` (an empty host: all interfaces; 0: a free port); the address bound."""
        self._server = await asyncio.start_server(
            self._serve, host or None, port, limit=MAX_HEADER_BYTES, reuse_address=True
        )
        bound = self._server.sockets[0].getsockname()
        return str(bound[0]), int(bound[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._clients):
            task.cancel()
        for task in list(self._clients):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if len(self._clients) >= MAX_CLIENTS or task is None:
            writer.transport.abort()
            return
        self._clients.add(task)
        answered = False
        try:
            await self._answer(reader, writer)
            answered = True
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass  # the scraper went away, sent too much, or too slowly: its connection goes
        except Exception:
            log.exception("serving /metrics failed")
        finally:
            self._clients.discard(task)
            if not answered:
                writer.transport.abort()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        parts = head.split(b"\r\n", 1)[0].split()
        path = parts[1].split(b"?", 1)[0] if len(parts) == 3 else b""
        if parts[:1] != [b"GET"] or path != b"/metrics":
            response = _NOT_FOUND
        else:
            async with self._lock:
                body = await self._scrape()
            response = _response("200 OK", self._content_type, body)
        writer.write(response)
        writer.close()  # once the answer is written
        await asyncio.wait_for(writer.wait_closed(), WRITE_TIMEOUT_S)
