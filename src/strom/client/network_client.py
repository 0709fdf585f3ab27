"""The client side of the network core: connections by node plus cluster metadata.

Producers, consumers and the admin client send through one NetworkClient each. A
request is described by a builder that receives the connection, so it is built at the
version negotiated with that very broker (``conn.version(api, client_max)``).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Iterable
from typing import Any

from strom import __version__
from strom.client.cluster import Cluster
from strom.client.errors import KafkaException, KafkaTimeoutError
from strom.network.connection import BrokerConnection, KafkaConnectionError, RequestTimeoutError
from strom.network.pool import ConnectionPool, Node, parse_bootstrap
from strom.protocol.apis import ApiKey, request_module
from strom.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

RequestBuilder = Callable[[BrokerConnection], Any]

# Metadata v12 is the newest that names topics in requests; later versions change nothing the client reads.
METADATA_MAX_VERSION = 12
FIND_COORDINATOR_MAX_VERSION = 6
GROUP_KEY, TRANSACTION_KEY = 0, 1


class NetworkClient:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.client_id: str = config["client.id"]
        self.request_timeout = config["request.timeout.ms"] / 1000
        self.retry_backoff = config["retry.backoff.ms"] / 1000
        self.retry_backoff_max = max(config["retry.backoff.max.ms"], config["retry.backoff.ms"]) / 1000
        self.pool = ConnectionPool(
            client_id=self.client_id,
            connect_timeout=config["socket.connection.setup.timeout.ms"] / 1000,
            reconnect_backoff=config["reconnect.backoff.ms"] / 1000,
            reconnect_backoff_max=config["reconnect.backoff.max.ms"] / 1000,
            software_version=__version__,
        )
        try:
            self.bootstrap_nodes = parse_bootstrap(config["bootstrap.servers"])
        except ValueError as exc:
            raise KafkaException(str(exc)) from exc
        for node in self.bootstrap_nodes:
            self.pool.set_node(node)
        self.cluster = Cluster()
        self._metadata_lock = asyncio.Lock()
        self._metadata_version = 0  # bumped on every successful refresh
        # Loop time (monotonic, from boot): "never" must be -inf, not 0.0, or a machine booted
        # minutes ago would count as having refreshed at boot.
        self.last_metadata_refresh = -math.inf

    # -- sending ---------------------------------------------------------------------------

    async def send(self, node_id: int, build: RequestBuilder, *, timeout: float | None = None) -> Any:
        """Send one request to a node and return its response.

        Connection failures and timeouts raise KafkaConnectionError / RequestTimeoutError;
        error codes inside the response are the caller's to read.
        """
        connection = await self.pool.get(node_id)
        return await connection.send(build(connection), timeout=timeout or self.request_timeout)

    async def send_any(self, build: RequestBuilder, *, timeout: float | None = None) -> Any:
        """Send to the least loaded reachable broker, trying the others if it cannot be reached."""
        last_error: Exception | None = None
        for node_id in self.candidate_nodes():
            try:
                return await self.send(node_id, build, timeout=timeout)
            except (KafkaConnectionError, RequestTimeoutError) as exc:
                last_error = exc
        raise KafkaConnectionError(f"no broker reachable: {last_error}")

    def candidate_nodes(self) -> list[int]:
        """Known brokers (bootstrap addresses until metadata names them), least loaded and ready first."""
        node_ids = list(self.cluster.brokers) or [n.node_id for n in self.bootstrap_nodes]

        def load(node_id: int) -> tuple[int, int, float]:
            connected = self.pool.connected(node_id) is not None
            return (0 if connected else 1, self.pool.in_flight(node_id), self.pool.backoff_remaining(node_id))

        return sorted(node_ids, key=load)

    def least_loaded_node(self) -> int:
        return self.candidate_nodes()[0]

    def node(self, node_id: int) -> Node | None:
        return self.cluster.brokers.get(node_id) or self.pool.node(node_id)

    # -- metadata --------------------------------------------------------------------------

    async def refresh_metadata(
        self, topics: Iterable[str] | None = None, *, allow_auto_create: bool = False
    ) -> Cluster:
        """Fetch metadata for ``topics`` (None: every topic) and merge it into ``cluster``.

        Concurrent callers share a refresh that started after they asked.
        """
        wanted = None if topics is None else sorted(set(topics))
        seen = self._metadata_version
        async with self._metadata_lock:
            if self._metadata_version != seen and wanted is not None and all(
                t in self.cluster.topics for t in wanted
            ):
                return self.cluster

            def build(connection: BrokerConnection) -> Any:
                version = connection.version(ApiKey.METADATA, METADATA_MAX_VERSION, 1)
                module = request_module(ApiKey.METADATA, version)
                requested = None
                if wanted is not None:
                    requested = tuple(
                        module.MetadataRequestTopic(**({"topic_id": None} if version >= 10 else {}), name=name)
                        for name in wanted
                    )
                fields: dict[str, Any] = {"topics": requested}
                if version >= 4:
                    fields["allow_auto_topic_creation"] = allow_auto_create
                if version >= 8:
                    fields["include_topic_authorized_operations"] = False
                if 8 <= version <= 10:
                    fields["include_cluster_authorized_operations"] = False
                return module.MetadataRequest(**fields)

            response = await self.send_any(build)
            self.cluster.update(response, wanted)
            for broker in self.cluster.brokers.values():
                self.pool.set_node(broker)
            self._metadata_version += 1
            self.last_metadata_refresh = asyncio.get_running_loop().time()
            return self.cluster

    async def find_coordinator(self, key: str, key_type: int = GROUP_KEY) -> Node:
        """The broker coordinating a group (or, with key_type 1, a transactional id).

        Raises KafkaException with the broker's error code (e.g. COORDINATOR_NOT_AVAILABLE,
        retriable) when there is none yet.
        """

        def build(connection: BrokerConnection) -> Any:
            version = connection.version(ApiKey.FIND_COORDINATOR, FIND_COORDINATOR_MAX_VERSION)
            module = request_module(ApiKey.FIND_COORDINATOR, version)
            if version >= 4:
                return module.FindCoordinatorRequest(key_type=key_type, coordinator_keys=(key,))
            if version >= 1:
                return module.FindCoordinatorRequest(key=key, key_type=key_type)
            return module.FindCoordinatorRequest(key=key)

        response = await self.send_any(build)
        answer = response.coordinators[0] if hasattr(response, "coordinators") else response
        if answer.error_code != ErrorCode.none:
            raise KafkaException.from_code(
                answer.error_code, f"FindCoordinator({key})", getattr(answer, "error_message", None)
            )
        node = Node(int(answer.node_id), answer.host, int(answer.port))
        self.pool.set_node(node)
        return node

    async def backoff(self, attempt: int) -> None:
        """Sleep ``retry.backoff.ms`` doubled per attempt, capped by ``retry.backoff.max.ms``."""
        await asyncio.sleep(min(self.retry_backoff * 2**attempt, self.retry_backoff_max))

    async def with_deadline(self, timeout: float, what: str, operation: Callable[[], Any]) -> Any:
        """Run ``operation()`` (a coroutine factory) within ``timeout`` seconds or raise KafkaTimeoutError."""
        try:
            async with asyncio.timeout(timeout):
                return await operation()
        except TimeoutError as exc:
            raise KafkaTimeoutError(f"{what} did not complete within {timeout * 1000:.0f} ms") from exc

    async def close(self) -> None:
        await self.pool.close()
