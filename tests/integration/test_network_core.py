"""The network core (strom.network) against a real broker, and against scripted peers for the failures
a real broker does not produce on demand: silence, garbage, an old ApiVersions, a vanished host."""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Awaitable, Callable

import pytest
from kio.schema.errors import ErrorCode

from brokerproc import BrokerProcess, free_port
from strom.network.connection import (
    BrokerConnection,
    KafkaConnectionError,
    RequestTimeoutError,
    UnsupportedVersionError,
)
from strom.network.pool import ConnectionPool, Node, parse_bootstrap
from strom.protocol.apis import SUPPORTED_VERSIONS, ApiKey, request_module
from strom.protocol.framing import encode_response, parse_request_header

HOST = "127.0.0.1"


def metadata_request(version: int = 12) -> object:
    module = request_module(ApiKey.METADATA, version)
    return module.MetadataRequest(
        topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )


async def open_to(port: int, timeout: float = 5.0) -> BrokerConnection:
    return await BrokerConnection.open(HOST, port, client_id="network-core-test", timeout=timeout)


def test_negotiates_the_broker_table_and_pipelines_requests(broker: BrokerProcess) -> None:
    async def run() -> None:
        connection = await open_to(broker.port)
        try:
            assert connection.api_versions[ApiKey.FETCH].max == SUPPORTED_VERSIONS[ApiKey.FETCH].max
            assert connection.version(ApiKey.FETCH, 12) == 12
            assert connection.version(ApiKey.METADATA, 99) == SUPPORTED_VERSIONS[ApiKey.METADATA].max
            with pytest.raises(UnsupportedVersionError):
                connection.version(ApiKey.FETCH, 2)  # the broker starts at v4
            # 500 requests written back to back: each response resolves its own future, in order.
            futures = [connection.send_nowait(metadata_request(), timeout=10) for _ in range(500)]
            assert connection.in_flight > 0
            responses = await asyncio.gather(*futures)
            assert {r.cluster_id for r in responses} == {responses[0].cluster_id}
            assert all(r.brokers[0].port == broker.port for r in responses)
            assert connection.in_flight == 0
        finally:
            connection.close()

    asyncio.run(run())


def test_flexible_and_old_versions_decode_alike(broker: BrokerProcess) -> None:
    async def run() -> None:
        connection = await open_to(broker.port)
        try:
            old = await connection.send(
                request_module(ApiKey.METADATA, 1).MetadataRequest(topics=None), timeout=5
            )
            new = await connection.send(metadata_request(12), timeout=5)
            assert [(b.node_id, b.host, b.port) for b in old.brokers] == [
                (b.node_id, b.host, b.port) for b in new.brokers
            ]
        finally:
            connection.close()

    asyncio.run(run())


Respond = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def serve(respond: Respond) -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(respond, HOST, 0)
    return server, server.sockets[0].getsockname()[1]


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, int, int, int]:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    frame = await reader.readexactly(size)
    header, _ = parse_request_header(memoryview(frame))
    return frame, header.api_key, header.api_version, header.correlation_id


def api_versions_response(
    correlation_id: int, version: int, error: ErrorCode, keys: dict[int, tuple[int, int]]
) -> bytes:
    from strom.protocol.apis import response_module
    from strom.protocol.framing import RequestHeader
    from strom.protocol.messages import build

    module = response_module(ApiKey.API_VERSIONS, version)
    body = build(
        module.ApiVersionsResponse,
        error_code=error,
        api_keys=tuple(
            module.ApiVersion(api_key=k, min_version=lo, max_version=hi) for k, (lo, hi) in keys.items()
        ),
    )
    return encode_response(
        RequestHeader(ApiKey.API_VERSIONS, version, correlation_id, None, version >= 3), body
    )


def test_falls_back_to_api_versions_v0_for_an_old_broker() -> None:
    seen: list[int] = []

    async def old_broker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                _frame, api_key, version, correlation_id = await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            assert api_key == ApiKey.API_VERSIONS
            seen.append(version)
            # An old broker answers versions it does not know with a v0 body and UNSUPPORTED_VERSION.
            error = ErrorCode.unsupported_version if version > 2 else ErrorCode.none
            writer.write(
                api_versions_response(
                    correlation_id, 0, error, {ApiKey.API_VERSIONS: (0, 2), ApiKey.METADATA: (0, 8)}
                )
            )
            await writer.drain()

    async def run() -> None:
        server, port = await serve(old_broker)
        async with server:
            connection = await open_to(port)
            assert seen == [3, 0]
            assert connection.version(ApiKey.METADATA, 12) == 8
            with pytest.raises(UnsupportedVersionError):
                connection.version(ApiKey.FETCH, 12)
            connection.close()

    asyncio.run(run())


def test_a_silent_broker_times_out_the_request_and_the_connection() -> None:
    async def silent_after_versions(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _frame, _api, version, correlation_id = await read_request(reader)
        writer.write(
            api_versions_response(
                correlation_id,
                version,
                ErrorCode.none,
                {ApiKey.API_VERSIONS: (0, 3), ApiKey.METADATA: (0, 12)},
            )
        )
        await writer.drain()
        await reader.read()  # never answers again

    async def run() -> None:
        server, port = await serve(silent_after_versions)
        async with server:
            connection = await open_to(port)
            started = time.monotonic()
            first = connection.send_nowait(metadata_request(), timeout=0.3)
            second = connection.send_nowait(metadata_request(), timeout=30)
            with pytest.raises(RequestTimeoutError):
                await first
            # Kafka's clients close a connection whose request timed out: everything in flight fails with it.
            with pytest.raises(RequestTimeoutError):
                await second
            assert 0.25 < time.monotonic() - started < 5
            assert not connection.is_open
            with pytest.raises(RequestTimeoutError):
                await connection.send(metadata_request())

    asyncio.run(run())


def test_garbage_from_the_broker_fails_the_connection() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _frame, _api, version, correlation_id = await read_request(reader)
        writer.write(
            api_versions_response(
                correlation_id,
                version,
                ErrorCode.none,
                {ApiKey.API_VERSIONS: (0, 3), ApiKey.METADATA: (0, 12)},
            )
        )
        await read_request(reader)
        writer.write(struct.pack(">ii", 8, 424242) + b"\0" * 4)  # a correlation id nobody sent
        await writer.drain()
        await reader.read()

    async def run() -> None:
        server, port = await serve(garbage)
        async with server:
            connection = await open_to(port)
            with pytest.raises(Exception, match="unknown correlation id 424242"):
                await connection.send(metadata_request(), timeout=5)
            assert not connection.is_open

    asyncio.run(run())


def test_connection_refused_is_a_connection_error_and_the_pool_backs_off() -> None:
    port = free_port()

    async def run() -> None:
        with pytest.raises(KafkaConnectionError, match=f"{HOST}:{port}"):
            await open_to(port)
        pool = ConnectionPool(
            client_id="t", connect_timeout=1, reconnect_backoff=0.2, reconnect_backoff_max=1.0
        )
        pool.set_node(Node(1, HOST, port))
        with pytest.raises(KafkaConnectionError):
            await pool.get(1)
        assert not pool.is_ready(1)
        assert 0.1 < pool.backoff_remaining(1) <= 0.25
        started = time.monotonic()
        with pytest.raises(KafkaConnectionError):
            await pool.get(1)  # waits out the backoff before the second attempt
        assert time.monotonic() - started >= 0.1
        # The second failure doubles the backoff (within its ±20% jitter).
        assert 0.3 < pool.backoff_remaining(1) <= 0.5
        await pool.close()

    asyncio.run(run())


def test_the_pool_reconnects_after_the_broker_restarts(running_broker: BrokerProcess) -> None:
    async def run() -> None:
        pool = ConnectionPool(
            client_id="t", connect_timeout=2, reconnect_backoff=0.05, reconnect_backoff_max=0.2
        )
        pool.set_node(Node(0, HOST, running_broker.port))
        first = await pool.get(0)
        assert await pool.get(0) is first
        await asyncio.to_thread(running_broker.stop)
        await asyncio.wait_for(first.wait_closed(), 10)
        with pytest.raises(KafkaConnectionError):
            await first.send(metadata_request())
        await asyncio.to_thread(running_broker.start)
        second = await pool.get(0)
        assert second is not first and second.is_open
        response = await second.send(metadata_request(), timeout=5)
        assert response.brokers[0].port == running_broker.port
        await pool.close()

    asyncio.run(run())


def test_parse_bootstrap() -> None:
    nodes = parse_bootstrap("a:1, b:2,[::1]:3")
    assert [(n.node_id, n.host, n.port) for n in nodes] == [(-1, "a", 1), (-2, "b", 2), (-3, "::1", 3)]
    for bad in ("", "host", "host:port"):
        with pytest.raises(ValueError):
            parse_bootstrap(bad)


def test_an_answer_to_a_request_sent_without_response_is_ignored() -> None:
    """Kafka never answers Produce with acks=0, but some brokers do; the connection must survive it."""

    async def answers_everything(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        keys = {ApiKey.API_VERSIONS: (0, 3), ApiKey.METADATA: (0, 12)}
        while True:
            try:
                _frame, _api, version, correlation_id = await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(api_versions_response(correlation_id, version, ErrorCode.none, keys))
            await writer.drain()

    async def run() -> None:
        server, port = await serve(answers_everything)
        async with server:
            connection = await open_to(port)
            connection.send_without_response(
                request_module(ApiKey.API_VERSIONS, 3).ApiVersionsRequest(
                    client_software_name="t", client_software_version="1"
                )
            )
            answer = await connection.send(
                request_module(ApiKey.API_VERSIONS, 3).ApiVersionsRequest(
                    client_software_name="t", client_software_version="1"
                ),
                timeout=5,
            )
            assert answer.error_code == ErrorCode.none
            assert connection.is_open
            connection.close()

    asyncio.run(run())
