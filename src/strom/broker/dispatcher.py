"""Routes a request frame to its API handler and encodes the handler's answer.

What Kafka does with requests it cannot serve, Strom does too: an ApiVersions
request of an unknown version gets a v0-layout UNSUPPORTED_VERSION answer (so the
client can retry with a version it finds in the list); anything else that cannot
be decoded -- unknown API key, unsupported version, malformed body -- closes the
connection. Every body is walked by ``strom.protocol.guard`` before kio decodes it
(``decode_body``), so no length read from the wire can make the decoder allocate more
than the frame holds, and a handler never sees a null where the schema allows none. Walking
and decoding cost follows a body's array elements, not its bytes: a 2 MB request of a million
one-byte names costs the walk a second, which the event loop must not wait for, while a 1 MB
produce request is a few steps. So a frame of more than ``WORKER_DECODE_BYTES`` is walked on
the loop only up to ``INLINE_DECODE_ELEMENTS`` elements, and walked and decoded on a worker
thread if it holds more (the hop to a thread costs a produce request more than its decoding).

Each request is counted in its API's ``RequestStats`` (strom.broker.metrics.stats): its version and
size here, the error codes of its response as it is encoded, its times by the connection once the
response is written. A Fetch response's record bytes count as its topics' bytes out.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from strom.broker.metrics.stats import BrokerTopicStats, RequestStats, count_errors, count_fetch, request_name
from strom.broker.network import CloseConnection, KafkaConnection, Response
from strom.protocol.apis import REJECTED_VERSIONS, SUPPORTED_VERSIONS, ApiKey, request_entity, response_module
from strom.protocol.errors import ErrorCode
from strom.protocol.framing import (
    ProtocolError,
    RequestHeader,
    TooManyElements,
    decode_body,
    encode_response_parts,
    parse_request_header,
    peek_api,
)

if TYPE_CHECKING:
    from strom.broker.broker import Broker

log = logging.getLogger(__name__)

# Frames larger than this are walked and decoded on a worker thread if their arrays hold more
# than INLINE_DECODE_ELEMENTS elements (a produce of 256 KiB of records is one step of the walk,
# but 256 KiB of names are a hundred thousand).
WORKER_DECODE_BYTES = 256 * 1024
# About a millisecond of walking and decoding on the event loop.
INLINE_DECODE_ELEMENTS = 1000


@dataclass(slots=True)
class RequestContext:
    header: RequestHeader
    broker: Broker
    connection: KafkaConnection

    @property
    def version(self) -> int:
        return self.header.api_version

    @property
    def response(self) -> ModuleType:
        """kio's response module for this request's API version."""
        return response_module(self.header.api_key, self.header.api_version)


@dataclass(slots=True)
class DelayedResponse:
    """A handler's answer that waits in purgatory (Kafka's DelayedOperation): ``completion``
    gives the response once the wait is over. The handler's work that must keep request order
    (an append) is done before it returns this, so the connection takes its next request while
    ``completion`` waits (see strom.broker.network)."""

    completion: Coroutine[Any, Any, Any]


Handler = Callable[[RequestContext, Any], Awaitable[Any | None]]


def _unsupported_api_versions_response(correlation_id: int) -> bytes:
    # v0 layout: error_code, then an (empty here) array of api versions: clients only need the
    # error and the ranges; Kafka includes ApiVersions' own range so the client can downgrade.
    lo, hi = SUPPORTED_VERSIONS[ApiKey.API_VERSIONS].min, SUPPORTED_VERSIONS[ApiKey.API_VERSIONS].max
    body = struct.pack(
        ">ihihhh", correlation_id, ErrorCode.unsupported_version, 1, ApiKey.API_VERSIONS, lo, hi
    )
    return struct.pack(">i", len(body)) + body


def _decode_request(
    api_key: int, version: int, frame: memoryview, max_elements: int | None = None
) -> tuple[RequestHeader, Any]:
    header, body_offset = parse_request_header(frame)
    return header, decode_body(request_entity(api_key, version), frame, body_offset, max_elements)


class RequestDispatcher:
    def __init__(self, broker: Broker, handlers: dict[ApiKey, Handler]) -> None:
        self._broker = broker
        self._handlers = handlers
        # Per API key, its request metrics (read by strom.broker.metrics at scrape time); a Fetch
        # is recorded as FetchConsumer or FetchFollower, as Kafka does, and Fetch is their sum.
        self._request_stats: dict[int, RequestStats] = {
            int(key): RequestStats(request_name(key)) for key in SUPPORTED_VERSIONS if key != ApiKey.FETCH
        }
        fetch = request_name(ApiKey.FETCH)
        self._fetch_consumer = RequestStats(fetch + "Consumer")
        self._fetch_follower = RequestStats(fetch + "Follower")

    def request_stats(self) -> list[RequestStats]:
        """Every request family's metrics, Fetch summed from its two parts now."""
        parts = (self._fetch_consumer, self._fetch_follower)
        return [*self._request_stats.values(), RequestStats.sum_of(request_name(ApiKey.FETCH), parts), *parts]

    async def handle(self, connection: KafkaConnection, frame: memoryview) -> Response:
        try:
            api_key, version, correlation_id = peek_api(frame)
        except ProtocolError as exc:
            raise CloseConnection(str(exc)) from exc
        try:
            key = ApiKey(api_key)
        except ValueError:
            raise CloseConnection(f"unknown api key {api_key}") from None
        supported = SUPPORTED_VERSIONS.get(key)
        if supported is None:
            raise CloseConnection(f"unsupported api {key.name}")
        if version not in supported:
            if key == ApiKey.API_VERSIONS:
                return [_unsupported_api_versions_response(correlation_id)]
            raise CloseConnection(f"unsupported version {version} of {key.name}")
        rejected = REJECTED_VERSIONS.get(key)
        if rejected is not None and version in rejected:
            raise CloseConnection(f"{key.name} v{version} is no longer supported (KIP-896)")
        try:
            if len(frame) <= WORKER_DECODE_BYTES:
                header, request = _decode_request(api_key, version, frame)
            else:
                try:
                    header, request = _decode_request(api_key, version, frame, INLINE_DECODE_ELEMENTS)
                except TooManyElements:
                    header, request = await asyncio.get_running_loop().run_in_executor(
                        None, _decode_request, api_key, version, frame
                    )
        except ProtocolError as exc:
            raise CloseConnection(f"malformed {key.name} v{version} request: {exc}") from exc
        if key == ApiKey.FETCH:
            stats = self._fetch_follower if _replica_id(version, request) >= 0 else self._fetch_consumer
        else:
            stats = self._request_stats[api_key]
        connection.request_stats = stats
        stats.received(version, len(frame) + 4)
        handler = self._handlers[key]
        response = await handler(RequestContext(header, self._broker, connection), request)
        if response is None:
            return None
        if isinstance(response, DelayedResponse):
            return asyncio.get_running_loop().create_task(
                self._encode_when_complete(header, request, stats, response.completion)
            )
        return self._encode(header, request, stats, response)

    def _encode(self, header: RequestHeader, request: Any, stats: RequestStats, response: Any) -> list[bytes]:
        if header.api_key == ApiKey.FETCH:
            self._count_fetch(header.api_version, request, stats, response)
        else:
            count_errors(response, stats.errors)
        return encode_response_parts(header, response)

    def _count_fetch(self, version: int, request: Any, stats: RequestStats, response: Any) -> None:
        by_id = version >= 13
        sizes: dict[Any, int] = {}
        count_fetch(response, by_id, stats.errors, sizes)
        if not sizes:
            return
        topic_stats: BrokerTopicStats = self._broker.replica_manager.topic_stats
        if stats is self._fetch_follower:  # Kafka's ReplicationBytesOutPerSec
            topic_stats.replication_bytes_out += sum(sizes.values())
            return
        image = self._broker.control_plane.image
        for key, size in sizes.items():
            if by_id:
                topic = image.topic_by_id(key)
                if topic is None:
                    continue
                key = topic.name
            topic_stats.of(key).bytes_out += size

    async def _encode_when_complete(
        self, header: RequestHeader, request: Any, stats: RequestStats, completion: Coroutine[Any, Any, Any]
    ) -> list[bytes] | None:
        response = await completion
        return None if response is None else self._encode(header, request, stats, response)


def _replica_id(version: int, request: Any) -> int:
    """A Fetch's replica id: a follower's broker id, or negative for a consumer."""
    replica_id: int = request.replica_state.replica_id if version >= 15 else getattr(request, "replica_id", -1)
    return replica_id
