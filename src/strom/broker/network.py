"""The network layer: one asyncio protocol per client connection.

Frames are cut from the byte stream as they arrive and handled strictly one at a
time per connection, so responses leave in request order (Kafka mutes a channel
while its request is in flight for the same reason). Anything that is not a
well-formed request costs the sender its connection and nothing else.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import cast

from strom.protocol.framing import SIZE

log = logging.getLogger(__name__)

# Pause reading from a client that has this many requests queued: back-pressure to the socket.
MAX_QUEUED_REQUESTS = 64


class CloseConnection(Exception):
    """Raised by a handler when the only correct answer is to close the connection."""


RequestHandler = Callable[["KafkaConnection", memoryview], Awaitable[bytes | None]]


class KafkaConnection(asyncio.Protocol):
    def __init__(
        self, handle: RequestHandler, max_request_size: int, connections: set[KafkaConnection]
    ) -> None:
        self._handle = handle
        self._max_request_size = max_request_size
        self._connections = connections
        self._head = bytearray()  # the 4-byte size of the next frame, as it arrives
        self._frame: bytearray | None = None  # the frame being received, allocated at its full size
        self._filled = 0
        self._queue: deque[memoryview] = deque()
        self._wakeup: asyncio.Event = asyncio.Event()
        self._transport: asyncio.Transport | None = None
        self._reading_paused = False
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._task: asyncio.Task[None] | None = None
        self._in_flight = False
        self.last_active = time.monotonic()
        self.peer = "?"

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self._connections.add(self)
        self._task = asyncio.get_running_loop().create_task(self._process())

    def data_received(self, data: bytes) -> None:
        self.last_active = time.monotonic()
        # Each frame is copied once, from the received chunks into a buffer of its own size:
        # a 1 MiB produce request is not re-assembled through a growing stream buffer.
        view = memoryview(data)
        queued = False
        while view:
            frame = self._frame
            if frame is None:
                head = self._head
                taken = 4 - len(head)
                head += view[:taken]
                view = view[taken:]
                if len(head) < 4:
                    break
                (size,) = SIZE.unpack(head)
                head.clear()
                if size < 0 or size > self._max_request_size:
                    log.warning(
                        "closing connection: request size out of bounds",
                        extra={"peer": self.peer, "size": size, "max": self._max_request_size},
                    )
                    self.close()
                    return
                frame = self._frame = bytearray(size)
                self._filled = 0
            taken = min(len(view), len(frame) - self._filled)
            frame[self._filled : self._filled + taken] = view[:taken]
            self._filled += taken
            view = view[taken:]
            if self._filled == len(frame):
                self._queue.append(memoryview(frame).toreadonly())  # kio decodes read-only buffers only
                self._frame = None
                queued = True
        if queued:
            self._wakeup.set()
            if len(self._queue) >= MAX_QUEUED_REQUESTS and self._transport is not None:
                self._transport.pause_reading()
                self._reading_paused = True

    def connection_lost(self, exc: Exception | None) -> None:
        self._connections.discard(self)
        self._transport = None
        self._can_write.set()
        if self._task is not None:
            self._task.cancel()

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    # -- request processing -------------------------------------------------------------------

    async def _process(self) -> None:
        try:
            while self._transport is not None:
                if not self._queue:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                frame = self._queue.popleft()
                if self._reading_paused and len(self._queue) < MAX_QUEUED_REQUESTS // 2:
                    self._reading_paused = False
                    if self._transport is not None:
                        self._transport.resume_reading()
                self._in_flight = True
                response = await self._handle(self, frame)
                if response is not None and self._transport is not None:
                    self._transport.write(response)
                    await self._can_write.wait()
                self._in_flight = False
                self.last_active = time.monotonic()
        except CloseConnection as exc:
            log.info("closing connection", extra={"peer": self.peer, "reason": str(exc)})
            self.close()
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("closing connection after an unexpected error", extra={"peer": self.peer})
            self.close()

    def idle_since(self, now: float) -> float:
        """Seconds without traffic; 0 while a request is being served (a long-poll fetch is not idle)."""
        return 0.0 if self._in_flight or self._queue else now - self.last_active

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        self._queue.clear()
        self._frame = None
