"""One client connection to a Kafka-protocol broker: framing, correlation, ApiVersions.

Requests are pipelined: each gets the next correlation id and a future, and responses
(which a broker sends in request order) resolve them as their frames arrive. Right
after connecting, ApiVersions learns the version range the broker speaks for every API,
and ``version`` picks the highest one both ends know. A connection that fails fails
every request in flight; reconnecting is the pool's job (``strom.network.pool``).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass
from typing import Any, cast

from strom.protocol.apis import ApiKey, VersionRange, request_module
from strom.protocol.errors import ErrorCode
from strom.protocol.framing import (
    FrameDecoder,
    ProtocolError,
    decode_response,
    encode_request,
    response_correlation_id,
)

log = logging.getLogger(__name__)

CLIENT_SOFTWARE_NAME = "strom"
# Largest response frame accepted (a fetch response is bounded by the request's fetch.max.bytes,
# far below this). Buffers grow only as bytes arrive, so a peer that merely announces a large
# frame costs nothing.
MAX_RESPONSE_SIZE = 1 << 30
_MIN_RESPONSE_SIZE = 4  # the correlation id
# How many acks=0 correlation ids to remember in case a broker answers them after all.
MAX_UNANSWERED = 4096


class KafkaConnectionError(ConnectionError):
    """The connection failed or closed; requests in flight may or may not have been processed."""


class RequestTimeoutError(TimeoutError):
    """No response within the request timeout; the connection is closed, as Kafka's clients do."""


class UnsupportedVersionError(Exception):
    """The broker speaks no version of an API that this client does."""


@dataclass(frozen=True, slots=True)
class _InFlight:
    api_key: int
    api_version: int
    future: asyncio.Future[Any]


class BrokerConnection(asyncio.Protocol):
    """A connection to one broker. Create with ``BrokerConnection.open``."""

    def __init__(self, host: str, port: int, client_id: str | None) -> None:
        self.host = host
        self.port = port
        self.client_id = client_id
        self.api_versions: dict[int, VersionRange] = {}
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._correlation_id = 0
        self._in_flight: dict[int, _InFlight] = {}
        # Requests sent expecting no answer (acks=0): some brokers answer them anyway.
        self._unanswered: set[int] = set()
        self._decoder = FrameDecoder(MAX_RESPONSE_SIZE, _MIN_RESPONSE_SIZE)
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._closed: asyncio.Future[None] = self._loop.create_future()
        self._error: Exception | None = None

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        *,
        client_id: str | None,
        timeout: float,
        software_version: str = "",
        local_host: str | None = None,
    ) -> BrokerConnection:
        """Connect and negotiate API versions; raises KafkaConnectionError on failure.

        ``local_host``: the address to connect from (a broker's replica fetcher binds its own
        listener's address, so each broker on its own loopback address talks from it)."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                _transport, connection = await loop.create_connection(
                    lambda: cls(host, port, client_id),
                    host,
                    port,
                    local_addr=(local_host, 0) if local_host else None,
                )
                await connection._negotiate_versions(software_version, timeout)
        except (OSError, TimeoutError, ProtocolError) as exc:
            raise KafkaConnectionError(f"cannot connect to {host}:{port}: {exc}") from exc
        return connection

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def is_open(self) -> bool:
        return self._transport is not None and not self._closed.done()

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)

    def close(self) -> None:
        self._fail(KafkaConnectionError(f"connection to {self.address} closed"))

    # -- versions --------------------------------------------------------------------------

    async def _negotiate_versions(self, software_version: str, timeout: float) -> None:
        # v3 first (flexible, names the client); a broker that knows only older versions
        # answers UNSUPPORTED_VERSION with its own range, as KIP-511 specifies.
        for version in (3, 0):
            module = request_module(ApiKey.API_VERSIONS, version)
            if version >= 3:
                request = module.ApiVersionsRequest(
                    client_software_name=CLIENT_SOFTWARE_NAME, client_software_version=software_version or "0"
                )
            else:
                request = module.ApiVersionsRequest()
            response = await self.send(request, timeout=timeout)
            self.api_versions = {
                int(key.api_key): VersionRange(int(key.min_version), int(key.max_version))
                for key in response.api_keys
            }
            if response.error_code == ErrorCode.none:
                return
            if response.error_code != ErrorCode.unsupported_version:
                raise ProtocolError(f"ApiVersions failed: {response.error_code.name}")
        raise ProtocolError("the broker speaks no ApiVersions version this client knows")

    def version(self, api_key: int, client_max: int, client_min: int = 0) -> int:
        """The highest version of ``api_key`` that this client (``client_min``..``client_max``) and the broker share."""
        broker = self.api_versions.get(api_key)
        if broker is None:
            raise UnsupportedVersionError(f"broker {self.address} does not support api {ApiKey(api_key).name}")
        version = min(client_max, broker.max)
        if version < max(client_min, broker.min):
            raise UnsupportedVersionError(
                f"broker {self.address} speaks {ApiKey(api_key).name} v{broker.min}-{broker.max}, "
                f"this client v{client_min}-{client_max}"
            )
        return version

    # -- requests --------------------------------------------------------------------------

    async def send(self, request: Any, *, timeout: float | None = None) -> Any:
        """Send a kio request entity and wait for its response entity."""
        return await self.send_nowait(request, timeout=timeout)

    def send_nowait(self, request: Any, *, timeout: float | None = None) -> asyncio.Future[Any]:
        """Write a request now; the returned future resolves with its response.

        Writing happens before this returns, so requests sent one after another reach
        the broker in that order (what idempotent producers with several requests in
        flight rely on).
        """
        future: asyncio.Future[Any] = self._loop.create_future()
        if self._error is not None or self._transport is None:
            future.set_exception(self._error or KafkaConnectionError(f"{self.address} not connected"))
            return future
        self._correlation_id = correlation_id = (self._correlation_id + 1) & 0x7FFFFFFF
        frame = encode_request(request, correlation_id, self.client_id)
        self._in_flight[correlation_id] = _InFlight(request.__api_key__, request.__version__, future)
        self._transport.write(frame)
        if timeout is not None:
            handle = self._loop.call_later(timeout, self._time_out, correlation_id, timeout)
            future.add_done_callback(lambda _f: handle.cancel())
        return future

    def send_without_response(self, request: Any) -> None:
        """Write a request the broker does not answer (Produce with acks=0)."""
        if self._error is not None or self._transport is None:
            raise self._error or KafkaConnectionError(f"{self.address} not connected")
        self._correlation_id = correlation_id = (self._correlation_id + 1) & 0x7FFFFFFF
        if len(self._unanswered) >= MAX_UNANSWERED:
            self._unanswered.clear()
        self._unanswered.add(correlation_id)
        self._transport.write(encode_request(request, correlation_id, self.client_id))

    async def drain(self) -> None:
        """Wait while the socket's write buffer is above its high-water mark."""
        await self._can_write.wait()
        if self._error is not None:
            raise self._error

    def _time_out(self, correlation_id: int, timeout: float) -> None:
        entry = self._in_flight.get(correlation_id)
        if entry is not None and not entry.future.done():
            name = ApiKey(entry.api_key).name if entry.api_key in ApiKey._value2member_map_ else entry.api_key
            self._fail(RequestTimeoutError(f"{name} to {self.address} timed out after {timeout:.1f}s"))

    def _fail(self, error: Exception) -> None:
        if self._error is None:
            self._error = error
        in_flight, self._in_flight = self._in_flight, {}
        for entry in in_flight.values():
            if not entry.future.done():
                entry.future.set_exception(error)
                # Nobody may be waiting (e.g. a pipelined request whose caller was cancelled).
                entry.future.exception()
        if self._transport is not None:
            self._transport.abort()
        if not self._closed.done():
            self._closed.set_result(None)
        self._can_write.set()

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f": {exc}" if exc else ""
        self._fail(KafkaConnectionError(f"connection to {self.address} lost{reason}"))

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    def data_received(self, data: bytes) -> None:
        if self._error is not None:
            return
        try:
            frames = self._decoder.feed(data)
        except ProtocolError as exc:
            self._fail(ProtocolError(f"{self.address} sent a bad frame: {exc}"))
            return
        for frame in frames:
            self._complete(frame)
            if self._error is not None:
                return

    def eof_received(self) -> bool:
        return False

    def _complete(self, frame: memoryview) -> None:
        try:
            correlation_id = response_correlation_id(frame)
            entry = self._in_flight.pop(correlation_id, None)
            if entry is None and correlation_id in self._unanswered:
                self._unanswered.discard(correlation_id)
                return
            if entry is None:
                raise ProtocolError(f"{self.address} answered unknown correlation id {correlation_id}")
            response = decode_response(frame, entry.api_key, entry.api_version)
        except ProtocolError as exc:
            self._fail(exc)
            return
        if not entry.future.done():
            entry.future.set_result(response)
