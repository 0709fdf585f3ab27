"""The network layer: one asyncio protocol per client connection, and the limits they share.

Frames are cut from the byte stream by ``FrameDecoder`` as bytes arrive (a buffer
grows only with the bytes received) and handled one at a time per connection, so requests
take effect in the order they were sent and responses leave in that order (Kafka mutes a
channel while its request is in flight for the same reason). One departure from Kafka: a
request whose handler has done its work and only waits in purgatory -- an acks=all produce,
appended and waiting for its followers -- answers with a task (``asyncio.Task``), and the
connection goes on with its next request while that waits; the responses still leave in
request order. librdkafka sends a produce request per partition, so with a muted channel a
connection producing to a thousand partitions could send at most one acks=all request per
replication round trip, and its records queued for seconds. At most ``queued.max.requests``
responses wait so. Anything that is not a well-formed request costs the sender its
connection and nothing else.

Memory is bounded by bytes, broker-wide: ``RequestMemory`` counts every byte of a
request from its arrival until its response is written (``queued.max.request.bytes``);
while the count is above the bound, connections stop reading (Kafka mutes their
channels) until responses free memory. Per connection, at most ``queued.max.requests``
requests wait behind the one in flight.

A request must keep arriving: only a whole request (or a response) counts as activity for
``connections.max.idle.ms``, so a sender that trickles a byte now and then without ever
finishing its request is closed as idle, its bytes released. And when only requests still
arriving hold the memory, the one let through to finish must arrive at ``MIN_PROGRESS_RATE``
in every ``PROGRESS_WINDOW_S``, or lose its connection (see ``RequestMemory``). ``ConnectionQuotas`` enforces
``max.connections`` and ``max.connections.per.ip`` (with its overrides) at accept time:
a connection over a limit is closed at once, the newest one, as KIP-402 does.

Each connection counts itself in its listener's ``ListenerStats`` and times each request for its
API's ``RequestStats`` (queue, handler, purgatory, response queue, send: Kafka's RequestMetrics);
a delayed fetch's wait inside the handler is found through ``CURRENT_REQUEST``, set once in the
connection's task (strom.broker.metrics.stats).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from time import perf_counter
from typing import cast

from strom.broker.metrics.stats import (
    CURRENT_REQUEST,
    DelayedOperations,
    ListenerStats,
    RequestStats,
    RequestWait,
)
from strom.protocol.framing import FrameDecoder, FrameSizeError

log = logging.getLogger(__name__)


class CloseConnection(Exception):
    """Raised by a handler when the only correct answer is to close the connection."""


# A request's response frame comes in parts (protocol.framing.encode_response_parts), written
# with one writelines: a fetch's records are not copied into one frame first.
# A request's response: its parts, None (no response: acks=0), or a task that waits in
# purgatory and then gives them.
Response = list[bytes] | None | asyncio.Task[list[bytes] | None]
RequestHandler = Callable[["KafkaConnection", memoryview], Awaitable[Response]]

# While request memory is exhausted and held only by requests still arriving, the request let
# through must receive MIN_PROGRESS_RATE bytes a second in every window of PROGRESS_WINDOW_S (or
# finish), else its connection is closed and the next one is let through. Kafka's clients give up
# on a request after request.timeout.ms (30 s): at 1 MiB/s a 30 MiB request arrives in time, and a
# sender slower than this would only hold every other client hostage for a request its own client
# abandons. Windows, not an average: a burst cannot buy a stall. Kafka has no such rule (its
# default queued.max.request.bytes is unbounded).
MIN_PROGRESS_RATE = 1 << 20
PROGRESS_WINDOW_S = 2.0


class RequestMemory:
    """Bytes of requests received and not yet answered, across all connections.

    ``limit`` <= 0 means unbounded (Kafka's -1). When the bound is reached, connections
    that receive more stop reading until memory is released. Should the memory be held
    only by requests still arriving -- so that no response will ever free any -- the
    connection furthest into its request is let through to finish it: memory stays
    bounded by the limit plus one request (plus the one read each connection may have
    in progress when the bound is reached). The request let through must then arrive at
    MIN_PROGRESS_RATE in every PROGRESS_WINDOW_S, else its connection is closed (freeing its
    bytes) and the next is let through: no set of slow senders can wedge the rest.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.answerable = 0  # of ``used``, the bytes of whole requests: responses will free them
        self._waiting: set[KafkaConnection] = set()
        self._exempt: KafkaConnection | None = None
        # How many bytes of its request the exempt connection had when its current window began.
        self._exempt_from_bytes = 0
        self._progress_check: asyncio.TimerHandle | None = None

    @property
    def exhausted(self) -> bool:
        return 0 < self.limit <= self.used

    def acquire(self, nbytes: int) -> None:
        self.used += nbytes

    def release(self, nbytes: int, answerable: int) -> None:
        self.used -= nbytes
        self.answerable -= answerable
        if self._waiting and not self.exhausted:
            waiting, self._waiting = self._waiting, set()
            self._set_exempt(None)
            for connection in waiting:
                connection.update_reading()

    def may_read(self, connection: KafkaConnection) -> bool:
        """False (and the connection waits for memory) while the bound is reached."""
        if not self.exhausted or connection is self._exempt:
            return True
        self._waiting.add(connection)
        return False

    def forget(self, connection: KafkaConnection) -> None:
        self._waiting.discard(connection)
        if self._exempt is connection:
            self._set_exempt(None)

    def ensure_progress(self, connections: set[KafkaConnection]) -> None:
        """Let one request finish when only partial requests hold the memory."""
        if not self.exhausted or self._exempt is not None or not self._waiting:
            return
        if self.answerable > 0:
            return  # a response will release memory
        furthest = max(connections, key=lambda c: c.partial_bytes, default=None)
        if furthest is None or not furthest.partial_bytes:
            return
        self._waiting.discard(furthest)
        self._set_exempt(furthest)
        furthest.update_reading()

    def frame_completed(self, connection: KafkaConnection) -> None:
        if self._exempt is connection:
            self._set_exempt(None)

    def _set_exempt(self, connection: KafkaConnection | None) -> None:
        self._exempt = connection
        if self._progress_check is not None:
            self._progress_check.cancel()
            self._progress_check = None
        if connection is not None:
            self._exempt_from_bytes = connection.partial_bytes
            self._progress_check = asyncio.get_running_loop().call_later(
                PROGRESS_WINDOW_S, self._check_progress
            )

    def _check_progress(self) -> None:
        """At the end of a window: close the exempt connection if its request fell behind
        MIN_PROGRESS_RATE during it."""
        self._progress_check = None
        exempt = self._exempt
        if exempt is None:
            return
        received = exempt.partial_bytes - self._exempt_from_bytes
        if received < MIN_PROGRESS_RATE * PROGRESS_WINDOW_S:
            log.warning(
                "closing connection: its request stalls while it alone may use the exhausted request memory",
                extra={"peer": exempt.peer, "received": received, "seconds": PROGRESS_WINDOW_S},
            )
            exempt.close()  # forgets it (ending the exemption) and lets the next one through
            return
        self._exempt_from_bytes = exempt.partial_bytes
        self._progress_check = asyncio.get_running_loop().call_later(PROGRESS_WINDOW_S, self._check_progress)


@dataclass(slots=True)
class ConnectionQuotas:
    max_connections: int
    max_per_ip: int
    per_ip_overrides: Mapping[str, int] = field(default_factory=dict)
    _per_ip: Counter[str] = field(default_factory=Counter)
    _total: int = 0

    def admit(self, ip: str, protected: bool = False) -> str | None:
        """Count a new connection from ``ip``; the reason it must be closed if over a limit.

        ``protected``: it arrived on the inter-broker listener of a broker with more than one
        listener, which KIP-402 exempts from max.connections (not from the per-address limits),
        so no client connections (nor a max.connections of 0) keep replicas from fetching."""
        limit = self.per_ip_overrides.get(ip, self.max_per_ip)
        if self._per_ip[ip] >= limit:
            return f"too many connections from {ip} (max.connections.per.ip={limit})"
        if self._total >= self.max_connections and not protected:
            return f"too many connections (max.connections={self.max_connections})"
        self._per_ip[ip] += 1
        self._total += 1
        return None

    def release(self, ip: str) -> None:
        self._total -= 1
        self._per_ip[ip] -= 1
        if self._per_ip[ip] <= 0:
            del self._per_ip[ip]


@dataclass(slots=True)
class NetworkLimits:
    """What every connection of the broker shares: its limits and the set of open connections."""

    max_request_size: int
    queued_max_requests: int
    memory: RequestMemory
    quotas: ConnectionQuotas
    connections: set[KafkaConnection] = field(default_factory=set)
    # Requests waiting in purgatory (a metric; delayed fetches count themselves in).
    delayed: DelayedOperations = field(default_factory=DelayedOperations)


@dataclass(slots=True)
class _Timing:
    """A pending response's request times (perf_counter), for its request metrics."""

    stats: RequestStats | None
    received: float
    dequeued: float
    handled: float
    waited: float  # of the handler's time, in a delayed fetch
    ready: float  # the response complete: its purgatory wait over

    def completed(self, _: object) -> None:
        self.ready = perf_counter()


# A response waiting behind an earlier one: the size of its request, the response, its times.
_Pending = tuple[int, Response, _Timing]


class KafkaConnection(asyncio.Protocol):
    def __init__(
        self,
        handle: RequestHandler,
        limits: NetworkLimits,
        *,
        protected: bool = False,
        listener: ListenerStats | None = None,
    ) -> None:
        self._handle = handle
        self._protected = protected  # on the inter-broker listener (ConnectionQuotas.admit)
        self._limits = limits
        self._memory = limits.memory
        self._decoder = FrameDecoder(limits.max_request_size)
        # Whole requests and when each became whole (perf_counter: its RequestQueueTimeMs).
        self._queue: deque[tuple[memoryview, float]] = deque()
        self._listener = listener
        # The stats of the request being handled: the dispatcher sets them (None: not counted).
        self.request_stats: RequestStats | None = None
        self._wait = RequestWait(limits.delayed)
        self._held = 0  # bytes received and not yet answered, counted in RequestMemory
        self._answerable = 0  # of those, the bytes of whole requests (queued or in flight)
        self._wakeup: asyncio.Event = asyncio.Event()
        self._transport: asyncio.Transport | None = None
        self._reading = True
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._task: asyncio.Task[None] | None = None
        self._in_flight: memoryview | None = None
        # Responses behind one that waits in purgatory, in request order (with the size of their
        # request), and the task that writes them as they complete.
        self._pending: deque[_Pending] = deque()
        self._pending_writer: asyncio.Task[None] | None = None
        self._pending_room = asyncio.Event()
        self._ip: str | None = None  # set once admitted by the connection quotas
        # What holds state for this connection and lets it go when it closes (fetch sessions).
        self._on_close: dict[object, Callable[[], None]] = {}
        # The last whole request received or response written (connections.max.idle.ms).
        self.last_active = time.monotonic()
        self.peer = "?"

    @property
    def partial_bytes(self) -> int:
        """Bytes of a request still arriving."""
        return self._decoder.buffered

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        ip = str(peer[0]) if peer else "?"
        refused = self._limits.quotas.admit(ip, self._protected)
        if refused is not None:
            log.warning("closing new connection: %s", refused, extra={"peer": self.peer})
            self._transport.abort()
            self._transport = None
            return
        self._ip = ip
        self._limits.connections.add(self)
        if self._listener is not None:
            self._listener.connections += 1
            self._listener.created += 1
        self._task = asyncio.get_running_loop().create_task(self._process())

    def data_received(self, data: bytes) -> None:
        if self._transport is None:
            return
        self._held += len(data)
        self._memory.acquire(len(data))
        try:
            frames = self._decoder.feed(data)
        except FrameSizeError as exc:
            log.warning(
                "closing connection: request size out of bounds",
                extra={"peer": self.peer, "size": exc.size, "max": self._limits.max_request_size},
            )
            self.close()
            return
        if frames:
            # Only a whole request is activity: bytes of one still arriving do not keep an idle
            # connection open, so a trickle cannot hold its request memory past the idle timeout.
            self.last_active = time.monotonic()
            completed = sum(len(frame) + 4 for frame in frames)
            self._answerable += completed
            self._memory.answerable += completed
            now = perf_counter()
            self._queue.extend((frame, now) for frame in frames)
            self._wakeup.set()
            self._memory.frame_completed(self)
        self.update_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._can_write.set()
        self._release_all()
        if self._task is not None:
            self._task.cancel()
        if self._pending_writer is not None:
            self._pending_writer.cancel()
        for _, response, _ in self._pending:
            if isinstance(response, asyncio.Task):
                response.cancel()
        self._pending.clear()

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    def update_reading(self) -> None:
        """Read while the queue has room and request memory is available."""
        transport = self._transport
        if transport is None:
            return
        queue_full = len(self._queue) >= self._limits.queued_max_requests
        reading = not queue_full and self._memory.may_read(self)
        if reading != self._reading:
            self._reading = reading
            if reading:
                transport.resume_reading()
            else:
                transport.pause_reading()
        if not reading and not queue_full:
            self._memory.ensure_progress(self._limits.connections)

    # -- request processing -------------------------------------------------------------------

    @contextlib.contextmanager
    def _closed_on_failure(self) -> Iterator[None]:
        """A failure of request handling costs the connection, logged once; cancellation (the
        connection is gone) ends it quietly."""
        try:
            yield
        except CloseConnection as exc:
            log.info("closing connection", extra={"peer": self.peer, "reason": str(exc)})
            self.close()
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("closing connection after an unexpected error", extra={"peer": self.peer})
            self.close()

    async def _process(self) -> None:
        wait = self._wait
        CURRENT_REQUEST.set(wait)  # in this task's context only: its delayed fetches add to it
        with self._closed_on_failure():
            while self._transport is not None:
                if not self._queue:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                frame, received = self._queue.popleft()
                self._in_flight = frame
                self.request_stats = None
                wait.seconds = 0.0
                dequeued = perf_counter()
                response = await self._handle(self, frame)
                handled = perf_counter()
                stats = self.request_stats
                size = len(frame) + 4
                if isinstance(response, asyncio.Task) or self._pending:
                    # It waits in purgatory, or is behind one that does: written in order.
                    self._in_flight = None
                    timing = _Timing(stats, received, dequeued, handled, wait.seconds, handled)
                    if isinstance(response, asyncio.Task):
                        response.add_done_callback(timing.completed)
                    await self._write_after_pending(size, response, timing)
                    continue
                if response is not None and self._transport is not None:
                    self._transport.writelines(response)
                    await self._can_write.wait()
                if stats is not None:
                    stats.responded(
                        received,
                        dequeued,
                        handled,
                        handled,
                        handled,
                        perf_counter(),
                        wait.seconds,
                        0 if response is None else sum(map(len, response)),
                    )
                self._in_flight = None
                self._responded(size)

    def _responded(self, size: int) -> None:
        """The response to a request of ``size`` bytes is written (or none was due)."""
        self._release(size, size)
        self.last_active = time.monotonic()
        self.update_reading()

    async def _write_after_pending(self, size: int, response: Response, timing: _Timing) -> None:
        """Queue ``response`` behind the pending ones; while ``queued.max.requests`` wait, the
        connection takes no further request."""
        self._pending.append((size, response, timing))
        if self._pending_writer is None:
            self._pending_writer = asyncio.get_running_loop().create_task(self._write_pending())
        while len(self._pending) >= self._limits.queued_max_requests and self._transport is not None:
            self._pending_room.clear()
            await self._pending_room.wait()

    async def _write_pending(self) -> None:
        """Write the pending responses in request order, each once it is complete."""
        try:
            with self._closed_on_failure():
                while self._pending and self._transport is not None:
                    size, response, timing = self._pending[0]
                    if isinstance(response, asyncio.Task):
                        response = await response
                    write_start = perf_counter()
                    if response is not None and self._transport is not None:
                        self._transport.writelines(response)
                        await self._can_write.wait()
                    if timing.stats is not None:
                        timing.stats.responded(
                            timing.received,
                            timing.dequeued,
                            timing.handled,
                            min(timing.ready, write_start),
                            write_start,
                            perf_counter(),
                            timing.waited,
                            0 if response is None else sum(map(len, response)),
                        )
                    self._pending.popleft()
                    self._responded(size)
                    self._pending_room.set()
        finally:
            self._pending_writer = None
            self._pending_room.set()

    def _release(self, nbytes: int, answerable: int) -> None:
        nbytes = min(nbytes, self._held)
        answerable = min(answerable, self._answerable)
        self._held -= nbytes
        self._answerable -= answerable
        self._memory.release(nbytes, answerable)
        if self._memory.exhausted:  # still: perhaps nothing but partial requests hold it now
            self._memory.ensure_progress(self._limits.connections)

    def on_close(self, key: object, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the connection closes (one callback per ``key``)."""
        if self._transport is None:
            callback()
        else:
            self._on_close[key] = callback

    def _release_all(self) -> None:
        callbacks, self._on_close = self._on_close, {}
        for callback in callbacks.values():
            callback()
        self._queue.clear()
        self._memory.forget(self)
        if self._ip is not None:
            self._limits.connections.discard(self)
            self._limits.quotas.release(self._ip)
            self._ip = None
            if self._listener is not None:
                self._listener.connections -= 1
                self._listener.closed += 1
        self._release(self._held, self._answerable)

    def idle_since(self, now: float) -> float:
        """Seconds since the last whole request or response; 0 while a request is being served
        (a long-poll fetch is not idle). A request still arriving does not count."""
        return 0.0 if self._in_flight is not None or self._queue or self._pending else now - self.last_active

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        self._release_all()
