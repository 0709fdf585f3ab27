"""Dynamic broker configs: AlterConfigs/IncrementalAlterConfigs on a BROKER resource, as Kafka does.

Two entities hold dynamic configs: one broker (resource name = its id) and the cluster default
(resource name ""; ``<default>`` in ZooKeeper). A change is validated as Kafka's
ConfigAdminManager does -- only keys Kafka reconfigures at runtime and Strom applies live (those
marked ``dynamic`` in config.py), values valid for their type, the resulting configuration
consistent -- then stored through a ``DynamicBrokerConfigStore`` and applied in place: every
holder of the broker's KafkaConfig sees it, every topic without an override takes a new topic
default, and the connection limits and the cleaner's settings change at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from strom.broker.config import BROKER_CONFIGS, ConfigError, KafkaConfig
from strom.broker.replica_fetcher import ReplicationConfig
from strom.broker.zk.client import AsyncZooKeeper
from strom.broker.zk.znodes import (
    CONFIG_CHANGE_PREFIX,
    CONFIG_CHANGES,
    DEFAULT_BROKER_ENTITY,
    EntityConfigZNode,
    broker_config_path,
    encode_config_change,
)
from strom.storage.checkpoint import write_atomically

if TYPE_CHECKING:
    from strom.broker.control_plane.plane import ControlPlane
    from strom.broker.network import NetworkLimits
    from strom.broker.replica_manager import ReplicaManager
    from strom.storage import LogManager

log = logging.getLogger(__name__)

BROKER_CONFIGS_FILE = "__strom_broker_configs.json"

# Called on the event loop when an entity's configs were changed by someone else (another broker).
ChangeListener = Callable[[str, dict[str, str]], None]


class DynamicConfigRefused(Exception):
    """The change is refused; Kafka answers INVALID_REQUEST with this message (KAFKA-13609)."""


class DynamicBrokerConfigStore(Protocol):
    """Where dynamic broker configs live. ``entity`` is a broker id as a string, or
    DEFAULT_BROKER_ENTITY (``<default>``) for the cluster default."""

    async def load(self, broker_id: int, on_change: ChangeListener) -> dict[str, dict[str, str]]:
        """The configs of this broker and of the cluster default, by entity; afterwards
        ``on_change(entity, configs)`` for every change of either made elsewhere."""
        ...

    async def store(self, entity: str, configs: Mapping[str, str]) -> None:
        """Replace the entity's configs (durably; raises on failure, having changed nothing)."""
        ...

    async def close(self) -> None: ...


class LocalDynamicConfigStore:
    """A single node's store: one JSON file in the control plane's log dir, replaced atomically.
    Nobody else writes it, so no change ever comes from elsewhere."""

    def __init__(self, log_dir: Path) -> None:
        self._path = log_dir / BROKER_CONFIGS_FILE
        self._entities: dict[str, dict[str, str]] = {}

    async def load(self, broker_id: int, on_change: ChangeListener) -> dict[str, dict[str, str]]:
        try:
            data = json.loads(self._path.read_text("utf-8"))
        except FileNotFoundError:
            data = {}
        self._entities = {
            str(k): {str(n): str(v) for n, v in c.items()} for k, c in data.get("brokers", {}).items()
        }
        return {e: dict(c) for e, c in self._entities.items() if e in (str(broker_id), DEFAULT_BROKER_ENTITY)}

    async def store(self, entity: str, configs: Mapping[str, str]) -> None:
        entities = {**self._entities, entity: dict(configs)}
        text = json.dumps(
            {"version": 1, "brokers": {e: c for e, c in entities.items() if c}}, indent=1, sort_keys=True
        )
        self._path.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.get_running_loop().run_in_executor(None, write_atomically, self._path, text.encode())
        self._entities = entities

    async def close(self) -> None:
        return None


class ZkDynamicConfigStore:
    """A cluster's store, Kafka's layout: ``/config/brokers/<id>`` and ``/config/brokers/<default>``
    (EntityConfigZNode), each write followed by a ``/config/changes/config_change_`` notification
    as Kafka's AdminZkClient writes it; brokers watch the two znodes that concern them."""

    def __init__(self, zk: Callable[[], AsyncZooKeeper]) -> None:
        # The session is opened when the broker starts, after this store is made.
        self._session = zk
        self._watches: list[object] = []

    async def load(self, broker_id: int, on_change: ChangeListener) -> dict[str, dict[str, str]]:
        current: dict[str, dict[str, str]] = {}
        for entity in (str(broker_id), DEFAULT_BROKER_ENTITY):

            def changed(data: bytes | None, _stat: object, entity: str = entity) -> None:
                configs = EntityConfigZNode.decode(data).config
                if entity in current and current[entity] != configs:
                    current[entity] = configs
                    on_change(entity, dict(configs))
                current[entity] = configs

            self._watches.append(await self._session().watch_data(broker_config_path(entity), changed))
        return {e: dict(c) for e, c in current.items() if c}

    async def store(self, entity: str, configs: Mapping[str, str]) -> None:
        path = broker_config_path(entity)
        data = EntityConfigZNode(dict(configs)).encode()
        if await self._session().exists(path) is None:
            await self._session().create(path, data, makepath=True)
        else:
            await self._session().set(path, data)
        await self._session().create(
            f"{CONFIG_CHANGES}/{CONFIG_CHANGE_PREFIX}",
            encode_config_change("brokers", entity),
            sequence=True,
            makepath=True,
        )

    async def close(self) -> None:
        for watch in self._watches:
            watch.cancel()  # type: ignore[attr-defined]
        self._watches.clear()


def _scala_set(names: list[str]) -> str:
    return f"Set({', '.join(names)})"


def check_dynamic_keys(configs: Mapping[str, str]) -> None:
    """Kafka's DynamicBrokerConfig.validateConfigs: only keys changeable at runtime."""
    unknown = sorted(n for n in configs if n not in BROKER_CONFIGS)
    if unknown:
        raise DynamicConfigRefused(f"Unknown broker configs: {_scala_set(unknown)}")
    static = sorted(n for n in configs if not BROKER_CONFIGS[n].dynamic)
    if static:
        raise DynamicConfigRefused(f"Cannot update these configs dynamically: {_scala_set(static)}")


# Kafka's DynamicThreadPool (and the network threads' acceptor): a dynamic thread count moves at
# most by half down or double up per change, so no single change multiplies a broker's threads.
THREAD_POOL_KEYS = (
    "num.io.threads",
    "num.network.threads",
    "num.replica.fetchers",
    "num.recovery.threads.per.data.dir",
    "background.threads",
)


def check_thread_counts(old: KafkaConfig, new: KafkaConfig) -> None:
    """Kafka's validation of a dynamic thread count change (DynamicThreadPool, LogCleaner)."""
    for name in THREAD_POOL_KEYS:
        before, after = int(old.get(name) or 0), int(new.get(name) or 0)
        if after == before:
            continue
        failed = f"Dynamic thread count update validation failed for {name}={after}"
        if after <= 0:
            raise DynamicConfigRefused(f"{failed}, value should be at least 1")
        if after < before // 2:
            raise DynamicConfigRefused(f"{failed}, value should be at least half the current value {before}")
        if after > before * 2:
            raise DynamicConfigRefused(
                f"{failed}, value should not be greater than double the current value {before}"
            )
    before, after = int(old.get("log.cleaner.threads") or 0), int(new.get("log.cleaner.threads") or 0)
    if after < 1:
        raise DynamicConfigRefused("Log cleaner threads should be at least 1")
    if after < before // 2:
        raise DynamicConfigRefused(
            f"Log cleaner threads cannot be reduced to less than half the current value {before}"
        )
    if after > before * 2:
        raise DynamicConfigRefused(
            f"Log cleaner threads cannot be increased to more than double the current value {before}"
        )


class Reconfigurable(Protocol):
    """What dynamic broker configs change (BrokerServer): its config and the parts that read it."""

    @property
    def node_id(self) -> int: ...
    @property
    def config(self) -> KafkaConfig: ...
    @property
    def control_plane(self) -> ControlPlane: ...
    @property
    def replica_manager(self) -> ReplicaManager: ...
    @property
    def log_manager(self) -> LogManager: ...
    @property
    def network(self) -> NetworkLimits: ...


class DynamicBrokerConfig:
    """The broker's dynamic configs: loads them at startup, alters and applies them."""

    def __init__(self, broker: Reconfigurable, store: DynamicBrokerConfigStore) -> None:
        self._broker = broker
        self.store = store
        self._lock = asyncio.Lock()

    @property
    def _entity(self) -> str:
        return str(self._broker.node_id)

    async def load(self) -> None:
        """Before the logs load: their configs then include the dynamic topic defaults."""
        stored = await self.store.load(self._broker.node_id, self._on_store_change)
        config = self._broker.config
        try:
            candidate = config.with_dynamic(
                stored.get(DEFAULT_BROKER_ENTITY, {}), stored.get(self._entity, {})
            )
        except ConfigError as exc:
            log.error("stored dynamic broker configs are invalid; ignoring them", extra={"error": str(exc)})
            return
        self._apply(candidate)

    def entity_of(self, resource_name: str) -> str:
        """The entity a BROKER resource names: "" the cluster default, else this broker's id."""
        if resource_name == "":
            return DEFAULT_BROKER_ENTITY
        if resource_name != self._entity:
            raise DynamicConfigRefused(
                f"Unexpected broker id, expected {self._entity}, but received {resource_name}"
            )
        return self._entity

    def current(self, entity: str) -> dict[str, str]:
        return self._broker.config.dynamic_configs(cluster_default=entity == DEFAULT_BROKER_ENTITY)

    async def alter(self, entity: str, configs: Mapping[str, str], validate_only: bool) -> None:
        """Replace the entity's dynamic configs; DynamicConfigRefused if Kafka would refuse them."""
        async with self._lock:
            check_dynamic_keys(configs)
            candidate = self._candidate(entity, dict(configs))
            check_thread_counts(self._broker.config, candidate)
            if validate_only:
                return
            await self.store.store(entity, configs)
            self._apply(candidate)
        log.info("dynamic broker configs changed", extra={"entity": entity, "configs": dict(configs)})

    def _candidate(self, entity: str, configs: dict[str, str]) -> KafkaConfig:
        config = self._broker.config
        default = configs if entity == DEFAULT_BROKER_ENTITY else config.dynamic_configs(cluster_default=True)
        own = configs if entity != DEFAULT_BROKER_ENTITY else config.dynamic_configs(cluster_default=False)
        try:
            return config.with_dynamic(default, own)
        except ConfigError as exc:
            raise DynamicConfigRefused(str(exc)) from None

    def _on_store_change(self, entity: str, configs: dict[str, str]) -> None:
        try:
            self._apply(self._candidate(entity, configs))
        except DynamicConfigRefused as exc:
            log.error(
                "dynamic broker configs from elsewhere are invalid; ignoring them", extra={"error": str(exc)}
            )

    def _apply(self, candidate: KafkaConfig) -> None:
        broker = self._broker
        broker.config.adopt(candidate)
        config = broker.config
        for topic in broker.control_plane.image.topics():
            broker.replica_manager.update_config(topic)
        quotas = broker.network.quotas
        quotas.max_connections = config.max_connections
        quotas.max_per_ip = config.max_connections_per_ip
        quotas.per_ip_overrides = config.max_connections_per_ip_overrides
        if broker.log_manager.cleaner is not None:
            broker.log_manager.cleaner.config = config.cleaner_config
        fetchers = broker.replica_manager.fetchers
        if fetchers is not None:
            # num.replica.fetchers: partitions followed from now on spread over the new count
            # (Kafka also moves those already followed; here they move at their next leader change).
            fetchers.config = ReplicationConfig.from_kafka_config(config)
