"""Connections by broker node id, opened on demand and re-opened with exponential backoff.

Bootstrap addresses get the negative ids -1, -2, ... until metadata names the real
brokers, as in Kafka's Java client. A failed attempt delays the next one to that node by
``reconnect.backoff.ms``, doubling up to ``reconnect.backoff.max.ms`` with ±20% jitter;
a successful connection resets it.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

from strom.network.connection import BrokerConnection, KafkaConnectionError


@dataclass(frozen=True, slots=True)
class Node:
    node_id: int
    host: str
    port: int
    rack: str | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def parse_bootstrap(servers: str | list[str]) -> list[Node]:
    """``host:port,host:port`` (or a list of them) as bootstrap nodes with ids -1, -2, ..."""
    entries = servers.split(",") if isinstance(servers, str) else servers
    nodes: list[Node] = []
    for entry in (e.strip() for e in entries):
        if not entry:
            continue
        host, sep, port = entry.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"invalid bootstrap server {entry!r}: expected host:port")
        nodes.append(Node(-1 - len(nodes), host.strip("[]"), int(port)))
    if not nodes:
        raise ValueError("bootstrap.servers is empty")
    return nodes


@dataclass(slots=True)
class _NodeState:
    node: Node
    connection: BrokerConnection | None = None
    connecting: asyncio.Task[BrokerConnection] | None = None
    failures: int = 0
    next_attempt: float = 0.0


class ConnectionPool:
    def __init__(
        self,
        *,
        client_id: str | None,
        connect_timeout: float,
        reconnect_backoff: float,
        reconnect_backoff_max: float,
        software_version: str = "",
    ) -> None:
        self.client_id = client_id
        self._connect_timeout = connect_timeout
        self._backoff = reconnect_backoff
        self._backoff_max = reconnect_backoff_max
        self._software_version = software_version
        self._nodes: dict[int, _NodeState] = {}
        self._closed = False

    def set_node(self, node: Node) -> None:
        """Add a node or update its address (a changed address drops the old connection)."""
        state = self._nodes.get(node.node_id)
        if state is None:
            self._nodes[node.node_id] = _NodeState(node)
        elif state.node != node:
            if state.connection is not None and state.node.address != node.address:
                state.connection.close()
                state.connection = None
            state.node = node

    def node(self, node_id: int) -> Node | None:
        state = self._nodes.get(node_id)
        return state.node if state else None

    def connected(self, node_id: int) -> BrokerConnection | None:
        state = self._nodes.get(node_id)
        if state is None or state.connection is None or not state.connection.is_open:
            return None
        return state.connection

    def is_ready(self, node_id: int) -> bool:
        """Connected, or allowed to try connecting now (not backing off)."""
        state = self._nodes.get(node_id)
        if state is None:
            return False
        return self.connected(node_id) is not None or time.monotonic() >= state.next_attempt

    def backoff_remaining(self, node_id: int) -> float:
        state = self._nodes.get(node_id)
        return max(0.0, state.next_attempt - time.monotonic()) if state else 0.0

    def in_flight(self, node_id: int) -> int:
        connection = self.connected(node_id)
        return connection.in_flight if connection else 0

    async def get(self, node_id: int) -> BrokerConnection:
        """An open connection to the node, connecting first (after any backoff) if needed."""
        if self._closed:
            raise KafkaConnectionError("client is closed")
        state = self._nodes.get(node_id)
        if state is None:
            raise KafkaConnectionError(f"unknown broker id {node_id}")
        if state.connection is not None and state.connection.is_open:
            return state.connection
        if state.connecting is None:
            state.connecting = asyncio.ensure_future(self._connect(state))
        return await asyncio.shield(state.connecting)

    async def _connect(self, state: _NodeState) -> BrokerConnection:
        try:
            delay = state.next_attempt - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            node = state.node
            try:
                connection = await BrokerConnection.open(
                    node.host,
                    node.port,
                    client_id=self.client_id,
                    timeout=self._connect_timeout,
                    software_version=self._software_version,
                )
            except KafkaConnectionError:
                state.failures += 1
                backoff = min(self._backoff * 2 ** (state.failures - 1), self._backoff_max)
                state.next_attempt = time.monotonic() + backoff * random.uniform(0.8, 1.2)
                raise
            if self._closed:
                connection.close()
                raise KafkaConnectionError("client is closed")
            state.failures = 0
            state.connection = connection
            return connection
        finally:
            state.connecting = None

    def disconnect(self, node_id: int) -> None:
        state = self._nodes.get(node_id)
        if state is not None and state.connection is not None:
            state.connection.close()
            state.connection = None

    async def close(self) -> None:
        self._closed = True
        for state in self._nodes.values():
            if state.connecting is not None:
                state.connecting.cancel()
            if state.connection is not None:
                state.connection.close()
                state.connection = None
