"""The asyncio admin client: topics, configs, groups and their offsets, partition offsets, the cluster.

Requests go where Kafka's Java admin client sends them: topic changes to the
controller, group operations to each group's coordinator, offset lookups and record
deletion to each partition's leader, everything else to any broker. Every request is
built at the version negotiated with the broker it goes to. A call retries what failed
retriably (lost connections, NOT_CONTROLLER, NOT_COORDINATOR, leader changes) with
backoff until ``default.api.timeout.ms`` (or the call's ``timeout``) runs out, then
raises KafkaTimeoutError naming the last error. A call over several items attempts them
all, then raises the first item's non-retriable error (KafkaException with the broker's
error code), naming the item.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping, Sequence
from functools import partial
from types import TracebackType
from typing import Any, TypeVar

from strom.client.admin import requests
from strom.client.admin.types import (
    AbortTransactionSpec,
    AlterConfigOp,
    AlterConfigOpType,
    ClusterDescription,
    ConfigEntry,
    ConfigResource,
    ConfigResourceType,
    ConfigSource,
    ElectionType,
    GroupDescription,
    GroupListing,
    HangingTransaction,
    ListOffsetsResult,
    LogDirDescription,
    MemberDescription,
    NewPartitions,
    NewTopic,
    OffsetReset,
    OffsetResetError,
    OffsetSpec,
    PartitionInfo,
    PartitionReassignment,
    PlannedOffset,
    ProducerState,
    ReplicaInfo,
    TopicDescription,
    TopicPartitionReplica,
    TransactionDescription,
    TransactionListing,
)
from strom.client.cluster import TopicPartition
from strom.client.config import ADMIN, resolve
from strom.client.consumer.structs import OffsetAndMetadata
from strom.client.errors import KafkaException, KafkaTimeoutError
from strom.client.network_client import GROUP_KEY, TRANSACTION_KEY, NetworkClient
from strom.network.connection import (
    BrokerConnection,
    KafkaConnectionError,
    RequestTimeoutError,
    UnsupportedVersionError,
)
from strom.network.pool import Node
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import to_ms

K = TypeVar("K", bound=Hashable)

_ISOLATION_LEVELS = {"read_uncommitted": 0, "read_committed": 1}
_COORDINATOR_MOVED = frozenset({ErrorCode.not_coordinator, ErrorCode.coordinator_not_available})
# Topics or partitions asked about per request by find_hanging_transactions, so that none is giant.
_SEARCH_BATCH = 500
# The outcome of a resource whose broker lacks IncrementalAlterConfigs.
_LEGACY = object()


def _error(code: int, subject: str, message: str | None = None) -> KafkaException:
    return KafkaException.from_code(code, subject, message)


def _known(value: int) -> int | None:
    """A size a response gives as -1 when unknown."""
    return None if value < 0 else int(value)


def _retriable(exc: KafkaException) -> bool:
    # UNKNOWN_TOPIC_OR_PARTITION is retriable in Kafka's taxonomy, yet an admin call
    # about a topic that does not exist should say so at once, as the Java admin does.
    return exc.retriable and exc.error_code != ErrorCode.unknown_topic_or_partition


def _network_error(exc: Exception) -> KafkaException:
    """A lost connection or request timeout as a retriable outcome for every item it carried."""
    timed_out = isinstance(exc, RequestTimeoutError)
    return KafkaException(str(exc), ErrorCode.request_timed_out if timed_out else ErrorCode.network_exception)


class AsyncAdminClient:
    """Kafka's Admin API on the caller's event loop. ``config`` takes the Java admin client's keys."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = resolve(ADMIN, config, "adminclient")
        self._client = NetworkClient(self.config)
        self._api_timeout = self.config["default.api.timeout.ms"] / 1000
        self._retries: int = self.config["retries"]
        self._coordinators: dict[str, int] = {}
        self._transaction_coordinators: dict[str, int] = {}

    async def __aenter__(self) -> AsyncAdminClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._client.close()

    # -- the retry loop --------------------------------------------------------------------

    async def _call(
        self,
        what: str,
        keys: Iterable[K],
        attempt: Callable[[list[K]], Awaitable[dict[K, Any]]],
        timeout: float | None,
    ) -> dict[K, Any]:
        """Run ``attempt`` on the keys still pending until each has a result or a final error.

        ``attempt`` maps each key it got an answer for to its result or a KafkaException;
        keys it leaves out or answers with a retriable error are attempted again.
        """
        limit = self._api_timeout if timeout is None else timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        ordered = list(dict.fromkeys(keys))
        pending = ordered
        results: dict[K, Any] = {}
        failures: dict[K, KafkaException] = {}
        last_error: Exception | None = None
        tries = 0
        while pending:
            outcomes: dict[K, Any] = {}
            try:
                async with asyncio.timeout_at(deadline):
                    try:
                        outcomes = await attempt(pending)
                    except (KafkaConnectionError, RequestTimeoutError) as exc:
                        last_error = _network_error(exc)
                    except UnsupportedVersionError as exc:
                        raise KafkaException(str(exc), ErrorCode.unsupported_version) from exc
                    except KafkaException as exc:
                        if not _retriable(exc):
                            raise
                        last_error = exc
            except TimeoutError:
                raise self._timed_out(what, limit, last_error) from None
            retry: list[K] = []
            for key in pending:
                if key not in outcomes:
                    retry.append(key)
                    continue
                outcome = outcomes[key]
                if isinstance(outcome, KafkaException):
                    if _retriable(outcome):
                        last_error = outcome
                        retry.append(key)
                    else:
                        failures[key] = outcome
                else:
                    results[key] = outcome
            pending = retry
            if pending:
                if tries >= self._retries:
                    raise last_error or KafkaException(f"{what}: no answer for {pending[0]}")
                delay = min(self._client.retry_backoff * 2**tries, self._client.retry_backoff_max)
                tries += 1
                if loop.time() + delay >= deadline:
                    raise self._timed_out(what, limit, last_error)
                await asyncio.sleep(delay)
        for key in ordered:
            if key in failures:
                raise failures[key]
        return results

    @staticmethod
    def _timed_out(what: str, limit: float, last_error: Exception | None) -> KafkaTimeoutError:
        reason = f": {last_error}" if last_error is not None else ""
        return KafkaTimeoutError(f"{what} did not complete within {limit * 1000:.0f} ms{reason}")

    async def _fan_out(
        self,
        by_node: Mapping[int, list[K]],
        send: Callable[[int, list[K]], Awaitable[dict[K, Any]]],
    ) -> dict[K, Any]:
        """``send`` to every node at once; a node that cannot be reached fails its keys retriably."""
        nodes = list(by_node)
        answers = await asyncio.gather(*(send(n, by_node[n]) for n in nodes), return_exceptions=True)
        outcomes: dict[K, Any] = {}
        for node_id, answer in zip(nodes, answers, strict=True):
            if isinstance(answer, KafkaConnectionError | RequestTimeoutError):
                self._forget_node(node_id)
                outcomes.update(dict.fromkeys(by_node[node_id], _network_error(answer)))
            elif isinstance(answer, BaseException):
                raise answer
            else:
                outcomes.update(answer)
        return outcomes

    def _forget_node(self, node_id: int) -> None:
        for coordinators in (self._coordinators, self._transaction_coordinators):
            for key in [k for k, n in coordinators.items() if n == node_id]:
                del coordinators[key]

    # -- routing ---------------------------------------------------------------------------

    async def _controller(self) -> int:
        """The controller named by Metadata, or any broker when none is named (KRaft brokers forward)."""
        cluster = await self._client.refresh_metadata([])
        if cluster.controller_id in cluster.brokers:
            return cluster.controller_id
        return self._client.least_loaded_node()

    async def _coordinator(self, key: str, key_type: int = GROUP_KEY) -> int:
        """The coordinator of a group (or, with key_type 1, of a transactional id)."""
        coordinators = self._coordinators if key_type == GROUP_KEY else self._transaction_coordinators
        node_id = coordinators.get(key)
        if node_id is None:
            node = await self._client.find_coordinator(key, key_type)
            node_id = coordinators[key] = node.node_id
        return node_id

    async def _by_coordinator(
        self, keys: Iterable[str], key_type: int = GROUP_KEY
    ) -> tuple[dict[int, list[str]], dict[str, KafkaException]]:
        by_node: dict[int, list[str]] = defaultdict(list)
        errors: dict[str, KafkaException] = {}
        for key in keys:
            try:
                by_node[await self._coordinator(key, key_type)].append(key)
            except KafkaException as exc:
                errors[key] = exc
        return by_node, errors

    async def _send_to_coordinator(self, group_id: str, build: Callable[[BrokerConnection], Any]) -> Any:
        node_id = await self._coordinator(group_id)
        try:
            return await self._client.send(node_id, build)
        except (KafkaConnectionError, RequestTimeoutError):
            self._forget_node(node_id)  # it may be gone or no longer coordinate the group: look again
            raise

    def _group_error(self, group_id: str, code: int, message: str | None = None) -> KafkaException:
        if code in _COORDINATOR_MOVED:
            self._coordinators.pop(group_id, None)
        return _error(code, f"group '{group_id}'", message)

    async def _by_leader(
        self, partitions: Iterable[TopicPartition]
    ) -> tuple[dict[int, list[TopicPartition]], dict[TopicPartition, KafkaException]]:
        wanted = list(partitions)
        cluster = await self._client.refresh_metadata({tp.topic for tp in wanted})
        by_node: dict[int, list[TopicPartition]] = defaultdict(list)
        errors: dict[TopicPartition, KafkaException] = {}
        for tp in wanted:
            topic = cluster.topics.get(tp.topic)
            if topic is not None and topic.error != ErrorCode.none:
                errors[tp] = _error(topic.error, f"topic '{tp.topic}'")
            elif topic is None or tp.partition not in topic.partitions:
                errors[tp] = _error(ErrorCode.unknown_topic_or_partition, f"partition {tp}")
            else:
                leader = topic.partitions[tp.partition].leader
                if leader in cluster.brokers:
                    by_node[leader].append(tp)
                else:
                    errors[tp] = _error(ErrorCode.leader_not_available, f"partition {tp}")
        return by_node, errors

    # -- topics ----------------------------------------------------------------------------

    async def create_topics(
        self, new_topics: Sequence[NewTopic], *, validate_only: bool = False, timeout: float | None = None
    ) -> None:
        topics = {t.name: t for t in new_topics}

        async def attempt(names: list[str]) -> dict[str, Any]:
            pending = [topics[n] for n in names]
            response = await self._client.send(
                await self._controller(),
                lambda c: requests.create_topics(c, pending, validate_only, self._client.request_timeout),
            )
            return {t.name: self._topic_outcome(t) for t in response.topics}

        await self._call("CreateTopics", topics, attempt, timeout)

    @staticmethod
    def _topic_outcome(result: Any) -> KafkaException | None:
        if result.error_code == ErrorCode.none:
            return None
        return _error(result.error_code, f"topic '{result.name}'", getattr(result, "error_message", None))

    async def delete_topics(self, names: Sequence[str], *, timeout: float | None = None) -> None:
        async def attempt(pending: list[str]) -> dict[str, Any]:
            response = await self._client.send(
                await self._controller(),
                lambda c: requests.delete_topics(c, pending, self._client.request_timeout),
            )
            return {r.name: self._topic_outcome(r) for r in response.responses}

        await self._call("DeleteTopics", names, attempt, timeout)

    async def list_topics(self, *, include_internal: bool = False, timeout: float | None = None) -> list[str]:
        async def attempt(_keys: list[str]) -> dict[str, Any]:
            cluster = await self._client.refresh_metadata(None)
            names = [name for name, t in cluster.topics.items() if include_internal or not t.is_internal]
            return {"topics": sorted(names)}

        result = await self._call("Metadata", ["topics"], attempt, timeout)
        topics: list[str] = result["topics"]
        return topics

    async def describe_topics(
        self, names: Sequence[str], *, timeout: float | None = None
    ) -> dict[str, TopicDescription]:
        async def attempt(pending: list[str]) -> dict[str, Any]:
            cluster = await self._client.refresh_metadata(pending)
            outcomes: dict[str, Any] = {}
            for name in pending:
                topic = cluster.topics.get(name)
                if topic is None:
                    outcomes[name] = _error(ErrorCode.unknown_topic_or_partition, f"topic '{name}'")
                elif topic.error != ErrorCode.none:
                    outcomes[name] = _error(topic.error, f"topic '{name}'")
                else:
                    outcomes[name] = TopicDescription(
                        name=name,
                        topic_id=topic.topic_id,
                        is_internal=topic.is_internal,
                        partitions=[
                            PartitionInfo(p.partition, p.leader, p.replicas, p.isr, p.offline_replicas)
                            for p in cluster.partitions_for(name)
                        ],
                    )
            return outcomes

        described = await self._call("Metadata", names, attempt, timeout)
        return {name: described[name] for name in names}

    async def create_partitions(
        self,
        new_partitions: Mapping[str, int | NewPartitions],
        *,
        validate_only: bool = False,
        timeout: float | None = None,
    ) -> None:
        """Grow topics to a total partition count each."""
        wanted = {
            name: spec if isinstance(spec, NewPartitions) else NewPartitions(spec)
            for name, spec in new_partitions.items()
        }

        async def attempt(names: list[str]) -> dict[str, Any]:
            pending = {n: wanted[n] for n in names}
            response = await self._client.send(
                await self._controller(),
                lambda c: requests.create_partitions(c, pending, validate_only, self._client.request_timeout),
            )
            return {r.name: self._topic_outcome(r) for r in response.results}

        await self._call("CreatePartitions", wanted, attempt, timeout)

    # -- configs ---------------------------------------------------------------------------

    async def _config_node(self, resource: ConfigResource) -> int:
        """A broker's configs come from that broker; a topic's from any broker."""
        if resource.type == ConfigResourceType.BROKER and resource.name.isdigit():
            cluster = await self._client.refresh_metadata([])
            if int(resource.name) in cluster.brokers:
                return int(resource.name)
        return self._client.least_loaded_node()

    async def _by_config_node(self, resources: Iterable[ConfigResource]) -> dict[int, list[ConfigResource]]:
        by_node: dict[int, list[ConfigResource]] = defaultdict(list)
        for resource in resources:
            by_node[await self._config_node(resource)].append(resource)
        return by_node

    async def describe_configs(
        self, resources: Sequence[ConfigResource], *, timeout: float | None = None
    ) -> dict[ConfigResource, dict[str, ConfigEntry]]:
        async def send(node_id: int, pending: list[ConfigResource]) -> dict[ConfigResource, Any]:
            response = await self._client.send(node_id, lambda c: requests.describe_configs(c, pending))
            outcomes: dict[ConfigResource, Any] = {}
            for result in response.results:
                resource = ConfigResource(result.resource_type, result.resource_name)
                if result.error_code != ErrorCode.none:
                    outcomes[resource] = _error(result.error_code, str(resource), result.error_message)
                else:
                    outcomes[resource] = {c.name: requests.config_entry(c) for c in result.configs}
            return outcomes

        async def attempt(pending: list[ConfigResource]) -> dict[ConfigResource, Any]:
            return await self._fan_out(await self._by_config_node(pending), send)

        described = await self._call("DescribeConfigs", resources, attempt, timeout)
        return {r: described[r] for r in resources}

    async def incremental_alter_configs(
        self,
        changes: Mapping[ConfigResource, Sequence[AlterConfigOp]],
        *,
        validate_only: bool = False,
        timeout: float | None = None,
    ) -> None:
        """Apply set/delete/append/subtract operations. A broker without IncrementalAlterConfigs
        gets AlterConfigs with its current overrides changed accordingly."""

        async def send(node_id: int, pending: list[ConfigResource]) -> dict[ConfigResource, Any]:
            subset = {r: changes[r] for r in pending}
            try:
                response = await self._client.send(
                    node_id, lambda c: requests.incremental_alter_configs(c, subset, validate_only)
                )
            except UnsupportedVersionError:
                return dict.fromkeys(pending, _LEGACY)
            return self._alter_outcomes(response)

        async def attempt(pending: list[ConfigResource]) -> dict[ConfigResource, Any]:
            return await self._fan_out(await self._by_config_node(pending), send)

        done = await self._call("IncrementalAlterConfigs", changes, attempt, timeout)
        legacy = {r: changes[r] for r, outcome in done.items() if outcome is _LEGACY}
        if legacy:
            await self._alter_configs_from_current(legacy, validate_only, timeout)

    @staticmethod
    def _alter_outcomes(response: Any) -> dict[ConfigResource, Any]:
        outcomes: dict[ConfigResource, Any] = {}
        for result in response.responses:
            resource = ConfigResource(result.resource_type, result.resource_name)
            outcomes[resource] = (
                None
                if result.error_code == ErrorCode.none
                else _error(result.error_code, str(resource), result.error_message)
            )
        return outcomes

    async def _alter_configs_from_current(
        self,
        changes: Mapping[ConfigResource, Sequence[AlterConfigOp]],
        validate_only: bool,
        timeout: float | None,
    ) -> None:
        described = await self.describe_configs(list(changes), timeout=timeout)
        dynamic = {ConfigSource.DYNAMIC_TOPIC_CONFIG, ConfigSource.DYNAMIC_BROKER_CONFIG}
        replacements: dict[ConfigResource, dict[str, str]] = {}
        for resource, ops in changes.items():
            entries = described[resource]
            current = {n: e.value for n, e in entries.items() if e.source in dynamic and e.value is not None}
            for op in ops:
                if op.op == AlterConfigOpType.SET and op.value is not None:
                    current[op.name] = op.value
                elif op.op == AlterConfigOpType.DELETE:
                    current.pop(op.name, None)
                elif op.op in (AlterConfigOpType.APPEND, AlterConfigOpType.SUBTRACT):
                    entry = entries.get(op.name)
                    base = current.get(op.name, entry.value if entry and entry.value else "")
                    items = [v for v in base.split(",") if v]
                    delta = [v.strip() for v in (op.value or "").split(",") if v.strip()]
                    if op.op == AlterConfigOpType.APPEND:
                        items += [v for v in delta if v not in items]
                    else:
                        items = [v for v in items if v not in delta]
                    current[op.name] = ",".join(items)
            replacements[resource] = current
        await self.alter_configs(replacements, validate_only=validate_only, timeout=timeout)

    async def alter_configs(
        self,
        configs: Mapping[ConfigResource, Mapping[str, str]],
        *,
        validate_only: bool = False,
        timeout: float | None = None,
    ) -> None:
        """Replace each resource's whole set of overrides (Kafka's legacy AlterConfigs)."""

        async def send(node_id: int, pending: list[ConfigResource]) -> dict[ConfigResource, Any]:
            subset = {r: configs[r] for r in pending}
            response = await self._client.send(
                node_id, lambda c: requests.alter_configs(c, subset, validate_only)
            )
            return self._alter_outcomes(response)

        async def attempt(pending: list[ConfigResource]) -> dict[ConfigResource, Any]:
            return await self._fan_out(await self._by_config_node(pending), send)

        await self._call("AlterConfigs", configs, attempt, timeout)

    # -- groups ----------------------------------------------------------------------------

    async def list_consumer_groups(
        self, states: Iterable[str] | None = None, *, timeout: float | None = None
    ) -> list[GroupListing]:
        """Every broker's groups; ``states`` (Kafka's names: Stable, Empty, ...) filters them."""
        wanted = sorted(set(states or ()))

        async def brokers(_keys: list[str]) -> dict[str, Any]:
            cluster = await self._client.refresh_metadata([])
            return {"brokers": sorted(cluster.brokers)}

        async def send(node_id: int, _keys: list[int]) -> dict[int, Any]:
            response = await self._client.send(node_id, lambda c: requests.list_groups(c, wanted))
            if response.error_code != ErrorCode.none:
                return {node_id: _error(response.error_code, f"ListGroups on broker {node_id}")}
            listings = [
                GroupListing(g.group_id, getattr(g, "group_state", None), g.protocol_type)
                for g in response.groups
            ]
            if wanted:  # brokers before ListGroups v4 do not filter
                listings = [g for g in listings if g.state is None or g.state in wanted]
            return {node_id: listings}

        async def attempt(pending: list[int]) -> dict[int, Any]:
            return await self._fan_out({n: [n] for n in pending}, send)

        known = await self._call("Metadata", ["brokers"], brokers, timeout)
        found = await self._call("ListGroups", known["brokers"], attempt, timeout)
        groups = {g.group_id: g for listings in found.values() for g in listings}
        return [groups[g] for g in sorted(groups)]

    async def describe_consumer_groups(
        self, group_ids: Sequence[str], *, timeout: float | None = None
    ) -> dict[str, GroupDescription]:
        async def send(node_id: int, pending: list[str]) -> dict[str, Any]:
            response = await self._client.send(node_id, lambda c: requests.describe_groups(c, pending))
            coordinator = self._client.node(node_id) or Node(node_id, "", -1)
            outcomes: dict[str, Any] = {}
            for g in response.groups:
                if g.error_code != ErrorCode.none:
                    message = getattr(g, "error_message", None)
                    outcomes[g.group_id] = self._group_error(g.group_id, g.error_code, message)
                    continue
                outcomes[g.group_id] = GroupDescription(
                    group_id=g.group_id,
                    state=g.group_state,
                    protocol_type=g.protocol_type,
                    protocol=g.protocol_data,
                    coordinator=coordinator,
                    members=[
                        MemberDescription(
                            member_id=m.member_id,
                            group_instance_id=getattr(m, "group_instance_id", None),
                            client_id=m.client_id,
                            host=m.client_host,
                            assignment=requests.member_assignment(g.protocol_type, m.member_assignment),
                        )
                        for m in g.members
                    ],
                )
            return outcomes

        async def attempt(pending: list[str]) -> dict[str, Any]:
            by_node, errors = await self._by_coordinator(pending)
            return {**errors, **await self._fan_out(by_node, send)}

        described = await self._call("DescribeGroups", group_ids, attempt, timeout)
        return {g: described[g] for g in group_ids}

    async def delete_consumer_groups(self, group_ids: Sequence[str], *, timeout: float | None = None) -> None:
        async def send(node_id: int, pending: list[str]) -> dict[str, Any]:
            response = await self._client.send(node_id, lambda c: requests.delete_groups(c, pending))
            return {
                r.group_id: None
                if r.error_code == ErrorCode.none
                else self._group_error(r.group_id, r.error_code)
                for r in response.results
            }

        async def attempt(pending: list[str]) -> dict[str, Any]:
            by_node, errors = await self._by_coordinator(pending)
            return {**errors, **await self._fan_out(by_node, send)}

        await self._call("DeleteGroups", group_ids, attempt, timeout)

    async def list_consumer_group_offsets(
        self,
        group_id: str,
        partitions: Iterable[TopicPartition] | None = None,
        *,
        timeout: float | None = None,
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """The group's committed offsets (every one, or those of ``partitions``); a partition
        without a committed offset is left out."""
        wanted = None if partitions is None else list(partitions)

        async def attempt(_keys: list[str]) -> dict[str, Any]:
            response = await self._send_to_coordinator(
                group_id, lambda c: requests.offset_fetch(c, group_id, wanted)
            )
            answer = response.groups[0] if hasattr(response, "groups") else response
            error = getattr(answer, "error_code", ErrorCode.none)
            if error != ErrorCode.none:
                return {group_id: self._group_error(group_id, error)}
            offsets: dict[TopicPartition, OffsetAndMetadata] = {}
            for topic in answer.topics:
                for p in topic.partitions:
                    tp = TopicPartition(topic.name, p.partition_index)
                    if p.error_code != ErrorCode.none:
                        return {group_id: self._group_error(group_id, p.error_code, f"partition {tp}")}
                    if p.committed_offset >= 0:
                        epoch = getattr(p, "committed_leader_epoch", -1)
                        offsets[tp] = OffsetAndMetadata(
                            p.committed_offset, p.metadata or "", epoch if epoch >= 0 else None
                        )
            return {group_id: offsets}

        fetched = await self._call("OffsetFetch", [group_id], attempt, timeout)
        result: dict[TopicPartition, OffsetAndMetadata] = fetched[group_id]
        return result

    def _partition_outcomes(self, group_id: str, topics: Any) -> dict[TopicPartition, Any]:
        return {
            TopicPartition(t.name, p.partition_index): None
            if p.error_code == ErrorCode.none
            else self._group_error(group_id, p.error_code, f"partition {t.name}-{p.partition_index}")
            for t in topics
            for p in t.partitions
        }

    async def alter_consumer_group_offsets(
        self,
        group_id: str,
        offsets: Mapping[TopicPartition, OffsetAndMetadata | int],
        *,
        timeout: float | None = None,
    ) -> None:
        """Commit offsets for a group from outside it (no generation, no member id): the
        coordinator accepts that only while the group has no active members."""
        wanted = {
            tp: o if isinstance(o, OffsetAndMetadata) else OffsetAndMetadata(o) for tp, o in offsets.items()
        }

        async def attempt(pending: list[TopicPartition]) -> dict[TopicPartition, Any]:
            subset = {tp: wanted[tp] for tp in pending}
            response = await self._send_to_coordinator(
                group_id, lambda c: requests.offset_commit(c, group_id, subset)
            )
            return self._partition_outcomes(group_id, response.topics)

        await self._call("OffsetCommit", wanted, attempt, timeout)

    async def delete_consumer_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition], *, timeout: float | None = None
    ) -> None:
        async def attempt(pending: list[TopicPartition]) -> dict[TopicPartition, Any]:
            response = await self._send_to_coordinator(
                group_id, lambda c: requests.offset_delete(c, group_id, pending)
            )
            if response.error_code != ErrorCode.none:
                return dict.fromkeys(pending, self._group_error(group_id, response.error_code))
            return self._partition_outcomes(group_id, response.topics)

        await self._call("OffsetDelete", partitions, attempt, timeout)

    async def plan_offset_reset(
        self,
        group_id: str,
        reset: OffsetReset,
        partitions: Iterable[TopicPartition] | None = None,
        *,
        timeout: float | None = None,
    ) -> list[PlannedOffset]:
        """The group's new offsets, computed as ``kafka-consumer-groups --reset-offsets`` computes
        them, sorted by topic and partition; nothing is committed. ``partitions`` defaults to every
        one the group has an offset for (to those of ``reset`` for OffsetReset.to_offsets). Given
        offsets and shifts are moved into [log start, log end]; raises OffsetResetError when there
        is nothing to reset or no committed offset to shift."""
        group_offsets = await self.list_consumer_group_offsets(group_id, timeout=timeout)
        committed = {tp: o.offset for tp, o in group_offsets.items()}
        if reset.target == "offsets":
            wanted_partitions = list(reset.offsets)
        else:
            wanted_partitions = list(committed) if partitions is None else list(dict.fromkeys(partitions))
        if not wanted_partitions:
            raise OffsetResetError(f"group '{group_id}' has no committed offsets to reset")

        async def offsets(spec: OffsetSpec) -> dict[TopicPartition, int]:
            found = await self.list_offsets(dict.fromkeys(wanted_partitions, spec), timeout=timeout)
            return {tp: result.offset for tp, result in found.items()}

        earliest = await offsets(OffsetSpec.earliest())
        latest = await offsets(OffsetSpec.latest())
        # Kafka's tool moves only the offsets it is given into the log; found ones it takes as they are.
        clamp = reset.target in ("offset", "shift", "offsets")
        wanted: Mapping[TopicPartition, int]
        if reset.target == "earliest":
            wanted = earliest
        elif reset.target == "latest":
            wanted = latest
        elif reset.target == "current":
            wanted = {tp: committed.get(tp, latest[tp]) for tp in wanted_partitions}
        elif reset.target == "offset":
            wanted = dict.fromkeys(wanted_partitions, reset.value)
        elif reset.target == "shift":
            missing = [tp for tp in wanted_partitions if tp not in committed]
            if missing:
                raise OffsetResetError(
                    f"cannot shift the offset of {missing[0]}: the group has no committed offset for it"
                )
            wanted = {tp: committed[tp] + reset.value for tp in wanted_partitions}
        elif reset.target == "timestamp":
            at_time = await offsets(OffsetSpec.for_timestamp(reset.value))
            # No record that recent: the log end, as Kafka's tool does.
            wanted = {tp: offset if offset >= 0 else latest[tp] for tp, offset in at_time.items()}
        elif reset.target == "offsets":
            wanted = reset.offsets
        else:
            raise ValueError(f"unknown offset reset target {reset.target!r}")
        planned = [
            PlannedOffset(
                tp,
                committed.get(tp),
                min(max(wanted[tp], earliest[tp]), latest[tp]) if clamp else wanted[tp],
                earliest[tp],
                latest[tp],
            )
            for tp in wanted_partitions
        ]
        return sorted(planned, key=lambda p: (p.partition.topic, p.partition.partition))

    # -- partition offsets and records -----------------------------------------------------

    async def list_offsets(
        self,
        specs: Mapping[TopicPartition, OffsetSpec],
        *,
        isolation_level: str = "read_uncommitted",
        timeout: float | None = None,
    ) -> dict[TopicPartition, ListOffsetsResult]:
        if isolation_level not in _ISOLATION_LEVELS:
            raise ValueError(
                f"isolation_level is read_uncommitted or read_committed, not {isolation_level!r}"
            )
        isolation = _ISOLATION_LEVELS[isolation_level]

        async def send(node_id: int, pending: list[TopicPartition]) -> dict[TopicPartition, Any]:
            subset = {tp: specs[tp] for tp in pending}
            response = await self._client.send(
                node_id, lambda c: requests.list_offsets(c, subset, isolation, self._client.request_timeout)
            )
            outcomes: dict[TopicPartition, Any] = {}
            for t in response.topics:
                for p in t.partitions:
                    tp = TopicPartition(t.name, p.partition_index)
                    if p.error_code != ErrorCode.none:
                        outcomes[tp] = _error(p.error_code, f"partition {tp}")
                    else:
                        epoch = getattr(p, "leader_epoch", -1)
                        outcomes[tp] = ListOffsetsResult(p.offset, p.timestamp, epoch if epoch >= 0 else None)
            return outcomes

        async def attempt(pending: list[TopicPartition]) -> dict[TopicPartition, Any]:
            by_node, errors = await self._by_leader(pending)
            return {**errors, **await self._fan_out(by_node, send)}

        found = await self._call("ListOffsets", specs, attempt, timeout)
        return {tp: found[tp] for tp in specs}

    async def delete_records(
        self, before_offsets: Mapping[TopicPartition, int], *, timeout: float | None = None
    ) -> dict[TopicPartition, int]:
        """Delete the records before each offset (-1: the high watermark); returns the new low watermarks."""

        async def send(node_id: int, pending: list[TopicPartition]) -> dict[TopicPartition, Any]:
            subset = {tp: before_offsets[tp] for tp in pending}
            response = await self._client.send(
                node_id, lambda c: requests.delete_records(c, subset, self._client.request_timeout)
            )
            return {
                TopicPartition(t.name, p.partition_index): p.low_watermark
                if p.error_code == ErrorCode.none
                else _error(p.error_code, f"partition {t.name}-{p.partition_index}")
                for t in response.topics
                for p in t.partitions
            }

        async def attempt(pending: list[TopicPartition]) -> dict[TopicPartition, Any]:
            by_node, errors = await self._by_leader(pending)
            return {**errors, **await self._fan_out(by_node, send)}

        low = await self._call("DeleteRecords", before_offsets, attempt, timeout)
        return {tp: low[tp] for tp in before_offsets}

    # -- transactions ----------------------------------------------------------------------

    async def describe_transactions(
        self, transactional_ids: Sequence[str], *, timeout: float | None = None
    ) -> dict[str, TransactionDescription]:
        """Each transactional id's state from its coordinator (TRANSACTIONAL_ID_NOT_FOUND for an unknown id)."""

        async def send(node_id: int, pending: list[str]) -> dict[str, Any]:
            response = await self._client.send(node_id, lambda c: requests.describe_transactions(c, pending))
            outcomes: dict[str, Any] = {}
            for t in response.transaction_states:
                if t.error_code != ErrorCode.none:
                    if t.error_code in _COORDINATOR_MOVED:
                        self._transaction_coordinators.pop(t.transactional_id, None)
                    outcomes[t.transactional_id] = _error(t.error_code, f"transactional id '{t.transactional_id}'")
                    continue
                # Kafka writes -1 while no transaction is open, which the decoder reads as None.
                started = t.transaction_start_time
                start = None if started is None else round(started.timestamp() * 1000)
                outcomes[t.transactional_id] = TransactionDescription(
                    coordinator_id=node_id,
                    state=t.transaction_state,
                    producer_id=int(t.producer_id),
                    producer_epoch=int(t.producer_epoch),
                    transaction_timeout_ms=to_ms(t.transaction_timeout),
                    transaction_start_time_ms=start,
                    topic_partitions=frozenset(
                        TopicPartition(topic.topic, p) for topic in t.topics for p in topic.partitions
                    ),
                )
            return outcomes

        async def attempt(pending: list[str]) -> dict[str, Any]:
            by_node, errors = await self._by_coordinator(pending, TRANSACTION_KEY)
            return {**errors, **await self._fan_out(by_node, send)}

        described = await self._call("DescribeTransactions", transactional_ids, attempt, timeout)
        return {t: described[t] for t in transactional_ids}

    async def list_transactions(
        self,
        states: Iterable[str] | None = None,
        producer_ids: Iterable[int] | None = None,
        duration_ms: int | None = None,
        *,
        timeout: float | None = None,
    ) -> list[TransactionListing]:
        """Every coordinator's transactional ids, filtered by state (Kafka's names: Ongoing, ...),
        producer id, and (``duration_ms``) transactions open for longer than that."""
        wanted_states = sorted(set(states or ()))
        wanted_ids = sorted(set(producer_ids or ()))
        duration = -1 if duration_ms is None else duration_ms

        async def brokers(_keys: list[str]) -> dict[str, Any]:
            cluster = await self._client.refresh_metadata([])
            return {"brokers": sorted(cluster.brokers)}

        async def send(node_id: int, _keys: list[int]) -> dict[int, Any]:
            response = await self._client.send(
                node_id, lambda c: requests.list_transactions(c, wanted_states, wanted_ids, duration)
            )
            if response.error_code != ErrorCode.none:
                return {node_id: _error(response.error_code, f"ListTransactions on broker {node_id}")}
            return {
                node_id: [
                    TransactionListing(t.transactional_id, int(t.producer_id), t.transaction_state, node_id)
                    for t in response.transaction_states
                ]
            }

        async def attempt(pending: list[int]) -> dict[int, Any]:
            return await self._fan_out({n: [n] for n in pending}, send)

        known = await self._call("Metadata", ["brokers"], brokers, timeout)
        found = await self._call("ListTransactions", known["brokers"], attempt, timeout)
        listings = [listing for node in sorted(found) for listing in found[node]]
        return sorted(listings, key=lambda listing: listing.transactional_id)

    async def describe_producers(
        self,
        partitions: Iterable[TopicPartition],
        *,
        broker_id: int | None = None,
        timeout: float | None = None,
    ) -> dict[TopicPartition, list[ProducerState]]:
        """The active producers of each partition, from its leader (or from the replica on ``broker_id``)."""
        wanted = list(partitions)

        async def send(node_id: int, pending: list[TopicPartition]) -> dict[TopicPartition, Any]:
            response = await self._client.send(node_id, lambda c: requests.describe_producers(c, pending))
            outcomes: dict[TopicPartition, Any] = {}
            for t in response.topics:
                for p in t.partitions:
                    tp = TopicPartition(t.name, p.partition_index)
                    if p.error_code != ErrorCode.none:
                        outcomes[tp] = _error(p.error_code, f"partition {tp}", p.error_message)
                        continue
                    outcomes[tp] = [
                        ProducerState(
                            producer_id=int(s.producer_id),
                            producer_epoch=int(s.producer_epoch),
                            last_sequence=int(s.last_sequence),
                            last_timestamp=int(s.last_timestamp),
                            coordinator_epoch=int(s.coordinator_epoch) if s.coordinator_epoch >= 0 else None,
                            current_transaction_start_offset=(
                                int(s.current_txn_start_offset) if s.current_txn_start_offset >= 0 else None
                            ),
                        )
                        for s in p.active_producers
                    ]
            return outcomes

        async def attempt(pending: list[TopicPartition]) -> dict[TopicPartition, Any]:
            if broker_id is not None:
                if self._client.node(broker_id) is None:
                    await self._client.refresh_metadata([])  # the broker's address
                return await self._fan_out({broker_id: pending}, send)
            by_node, errors = await self._by_leader(pending)
            return {**errors, **await self._fan_out(by_node, send)}

        found = await self._call("DescribeProducers", wanted, attempt, timeout)
        return {tp: found[tp] for tp in wanted}

    async def abort_transaction(self, spec: AbortTransactionSpec, *, timeout: float | None = None) -> None:
        """Abort a hanging transaction on one partition: its leader writes the ABORT marker
        (WriteTxnMarkers, as the coordinator does), which moves the last stable offset past it."""
        tp = spec.topic_partition

        async def send(node_id: int, _pending: list[TopicPartition]) -> dict[TopicPartition, Any]:
            response = await self._client.send(node_id, lambda c: requests.write_abort_marker(c, spec))
            outcomes: dict[TopicPartition, Any] = {}
            for marker in response.markers:
                for t in marker.topics:
                    for p in t.partitions:
                        code = p.error_code
                        key = TopicPartition(t.name, p.partition_index)
                        outcomes[key] = None if code == ErrorCode.none else _error(code, f"partition {key}")
            return outcomes

        async def attempt(pending: list[TopicPartition]) -> dict[TopicPartition, Any]:
            by_node, errors = await self._by_leader(pending)
            return {**errors, **await self._fan_out(by_node, send)}

        await self._call("WriteTxnMarkers", [tp], attempt, timeout)

    async def find_hanging_transactions(
        self,
        topics: Sequence[str] | None = None,
        *,
        partitions: Sequence[TopicPartition] | None = None,
        broker_id: int | None = None,
        max_transaction_timeout_ms: int = 15 * 60_000,
        timeout: float | None = None,
    ) -> list[HangingTransaction]:
        """The hanging transactions, found as ``kafka-transactions find-hanging`` finds them, in
        the order of the partitions searched: those of ``topics`` (every topic when None), or
        exactly ``partitions``; with ``broker_id``, only its replicas, as it holds them.

        A transaction hangs on a partition when the partition's producer state holds it open for
        longer than the longest transaction timeout while its coordinator does not list that
        partition in an ongoing or completing transaction: its markers will never come, and
        ``read_committed`` consumers stay stuck at its start offset."""
        if partitions is not None and topics is not None:
            raise ValueError("search topics or partitions, not both")
        if partitions is None:
            names = list(topics) if topics is not None else await self.list_topics(timeout=timeout)
            partitions = []
            for start in range(0, len(names), _SEARCH_BATCH):
                batch = names[start : start + _SEARCH_BATCH]
                for description in (await self.describe_topics(batch, timeout=timeout)).values():
                    partitions += [
                        TopicPartition(description.name, p.partition)
                        for p in description.partitions
                        if broker_id is None or broker_id in p.replicas
                    ]
        now = time.time_ns() // 1_000_000
        open_transactions: list[tuple[TopicPartition, ProducerState]] = []
        for start in range(0, len(partitions), _SEARCH_BATCH):
            batch_partitions = partitions[start : start + _SEARCH_BATCH]
            described = await self.describe_producers(batch_partitions, broker_id=broker_id, timeout=timeout)
            open_transactions += [
                (tp, s)
                for tp, states in described.items()
                for s in states
                if s.current_transaction_start_offset is not None
                and now - s.last_timestamp > max_transaction_timeout_ms
            ]
        if not open_transactions:
            return []
        producer_ids = {s.producer_id for _, s in open_transactions}
        transactional_ids = {
            t.producer_id: t.transactional_id
            for t in await self.list_transactions(producer_ids=producer_ids, timeout=timeout)
            if t.producer_id in producer_ids
        }
        descriptions: dict[str, TransactionDescription] = {}
        for transactional_id in sorted(set(transactional_ids.values())):
            try:
                found = await self.describe_transactions([transactional_id], timeout=timeout)
            except KafkaException as exc:
                if exc.error_code != ErrorCode.transactional_id_not_found:
                    raise
            else:
                descriptions[transactional_id] = found[transactional_id]
        hanging = []
        for tp, state in open_transactions:
            known = transactional_ids.get(state.producer_id)
            transaction = descriptions.get(known) if known is not None else None
            # The coordinator lists the partitions of an ongoing transaction, and of one awaiting its
            # markers while it completes: any other open transaction is left hanging.
            if transaction is None or tp not in transaction.topic_partitions:
                hanging.append(HangingTransaction(tp, state, now - state.last_timestamp))
        return hanging

    # -- cluster ---------------------------------------------------------------------------

    async def describe_cluster(self, *, timeout: float | None = None) -> ClusterDescription:
        """DescribeCluster, or Metadata from a broker that does not speak it."""

        async def attempt(_keys: list[str]) -> dict[str, Any]:
            try:
                response = await self._client.send(
                    self._client.least_loaded_node(), requests.describe_cluster
                )
            except UnsupportedVersionError:
                cluster = await self._client.refresh_metadata([])
                nodes = [cluster.brokers[n] for n in sorted(cluster.brokers)]
                controller = cluster.brokers.get(cluster.controller_id)
                return {"cluster": ClusterDescription(cluster.cluster_id, controller, nodes)}
            if response.error_code != ErrorCode.none:
                return {"cluster": _error(response.error_code, "DescribeCluster", response.error_message)}
            nodes = sorted(
                (Node(int(b.broker_id), b.host, int(b.port), b.rack) for b in response.brokers),
                key=lambda n: n.node_id,
            )
            controller = next((n for n in nodes if n.node_id == response.controller_id), None)
            return {"cluster": ClusterDescription(response.cluster_id, controller, nodes)}

        described = await self._call("DescribeCluster", ["cluster"], attempt, timeout)
        cluster: ClusterDescription = described["cluster"]
        return cluster

    # -- cluster operations ----------------------------------------------------------------

    async def elect_leaders(
        self,
        election_type: ElectionType,
        partitions: Sequence[TopicPartition] | None = None,
        *,
        timeout: float | None = None,
    ) -> dict[TopicPartition, KafkaException | None]:
        """ElectLeaders through the controller: each partition's outcome (None: elected). With
        ``partitions`` None every partition is elected, and only those that needed it are named."""
        limit = self._api_timeout if timeout is None else timeout

        async def attempt(_keys: list[str]) -> dict[str, Any]:
            response = await self._client.send(
                await self._controller(),
                lambda c: requests.elect_leaders(c, int(election_type), partitions, limit),
                timeout=limit + self._client.request_timeout,
            )
            if response.error_code != ErrorCode.none:
                return {"elect": _error(response.error_code, "ElectLeaders")}
            outcomes: dict[TopicPartition, KafkaException | None] = {}
            for t in response.replica_election_results:
                for p in t.partition_result:
                    tp = TopicPartition(t.topic, p.partition_id)
                    outcomes[tp] = (
                        None
                        if p.error_code == ErrorCode.none
                        else _error(p.error_code, f"partition {tp}", p.error_message)
                    )
            return {"elect": outcomes}

        found = await self._call("ElectLeaders", ["elect"], attempt, timeout)
        result: dict[TopicPartition, KafkaException | None] = found["elect"]
        return result

    async def alter_partition_reassignments(
        self, reassignments: Mapping[TopicPartition, Sequence[int] | None], *, timeout: float | None = None
    ) -> None:
        """Start (target replicas) or cancel (None) the reassignment of each partition."""
        limit = self._api_timeout if timeout is None else timeout

        async def attempt(pending: list[TopicPartition]) -> dict[TopicPartition, Any]:
            subset = {tp: reassignments[tp] for tp in pending}
            response = await self._client.send(
                await self._controller(),
                lambda c: requests.alter_partition_reassignments(c, subset, limit),
                timeout=limit + self._client.request_timeout,
            )
            if response.error_code != ErrorCode.none:
                failed = _error(response.error_code, "AlterPartitionReassignments", response.error_message)
                return dict.fromkeys(pending, failed)
            return {
                TopicPartition(t.name, p.partition_index): None
                if p.error_code == ErrorCode.none
                else _error(p.error_code, f"partition {t.name}-{p.partition_index}", p.error_message)
                for t in response.responses
                for p in t.partitions
            }

        await self._call("AlterPartitionReassignments", reassignments, attempt, timeout)

    async def list_partition_reassignments(
        self, partitions: Sequence[TopicPartition] | None = None, *, timeout: float | None = None
    ) -> dict[TopicPartition, PartitionReassignment]:
        """The reassignments in progress (of ``partitions``, or of every partition)."""
        limit = self._api_timeout if timeout is None else timeout

        async def attempt(_keys: list[str]) -> dict[str, Any]:
            response = await self._client.send(
                await self._controller(),
                lambda c: requests.list_partition_reassignments(c, partitions, limit),
            )
            if response.error_code != ErrorCode.none:
                return {
                    "list": _error(response.error_code, "ListPartitionReassignments", response.error_message)
                }
            return {
                "list": {
                    TopicPartition(t.name, p.partition_index): PartitionReassignment(
                        tuple(p.replicas), tuple(p.adding_replicas), tuple(p.removing_replicas)
                    )
                    for t in response.topics
                    for p in t.partitions
                }
            }

        found = await self._call("ListPartitionReassignments", ["list"], attempt, timeout)
        result: dict[TopicPartition, PartitionReassignment] = found["list"]
        return result

    async def describe_topic_partitions(
        self, topics: Sequence[str] = (), *, partition_limit: int = 2000, timeout: float | None = None
    ) -> dict[str, TopicDescription]:
        """DescribeTopicPartitions (KIP-966), page after page: ``topics`` (every topic when empty)."""

        async def attempt(_keys: list[str]) -> dict[str, Any]:
            node = self._client.least_loaded_node()
            described: dict[str, Any] = {}
            cursor: tuple[str, int] | None = None
            while True:
                response = await self._client.send(
                    node,
                    partial(
                        requests.describe_topic_partitions,
                        topics=topics,
                        partition_limit=partition_limit,
                        cursor=cursor,
                    ),
                )
                for t in response.topics:
                    if t.error_code != ErrorCode.none:
                        described[t.name] = _error(t.error_code, f"topic '{t.name}'")
                        continue
                    previous = described.get(t.name)
                    partitions = previous.partitions if isinstance(previous, TopicDescription) else []
                    partitions += [
                        PartitionInfo(
                            p.partition_index,
                            p.leader_id,
                            tuple(p.replica_nodes),
                            tuple(p.isr_nodes),
                            tuple(p.offline_replicas),
                        )
                        for p in t.partitions
                    ]
                    described[t.name] = TopicDescription(t.name, t.topic_id, t.is_internal, partitions)
                if response.next_cursor is None:
                    return {"describe": described}
                cursor = (response.next_cursor.topic_name, response.next_cursor.partition_index)

        found = await self._call("DescribeTopicPartitions", ["describe"], attempt, timeout)
        described: dict[str, Any] = found["describe"]
        for name in topics:
            if isinstance(described.get(name), KafkaException):
                raise described[name]
        return described

    async def describe_log_dirs(
        self, broker_ids: Sequence[int], *, timeout: float | None = None
    ) -> dict[int, dict[str, LogDirDescription]]:
        """Each broker's log dirs and the replicas in them, with their sizes."""

        async def send(node_id: int, _pending: list[int]) -> dict[int, Any]:
            response = await self._client.send(node_id, requests.describe_log_dirs)
            # error_code (v3+), total_bytes and usable_bytes (v4+) are absent from older responses.
            error_code = getattr(response, "error_code", ErrorCode.none)
            if error_code != ErrorCode.none:
                return {node_id: _error(error_code, f"log dirs of broker {node_id}")}
            dirs: dict[str, LogDirDescription] = {}
            for result in response.results:
                if result.error_code != ErrorCode.none:
                    continue  # an offline log dir: it holds no replica the broker can serve
                dirs[result.log_dir] = LogDirDescription(
                    replicas={
                        TopicPartition(t.name, int(p.partition_index)): ReplicaInfo(
                            int(p.partition_size), int(p.offset_lag), bool(p.is_future_key)
                        )
                        for t in result.topics
                        for p in t.partitions
                    },
                    total_bytes=_known(getattr(result, "total_bytes", -1)),
                    usable_bytes=_known(getattr(result, "usable_bytes", -1)),
                )
            return {node_id: dirs}

        async def attempt(pending: list[int]) -> dict[int, Any]:
            if any(self._client.node(b) is None for b in pending):
                await self._client.refresh_metadata([])  # the brokers' addresses
            return await self._fan_out({b: [b] for b in pending}, send)

        found = await self._call("DescribeLogDirs", broker_ids, attempt, timeout)
        return {b: found[b] for b in broker_ids}

    async def alter_replica_log_dirs(
        self, moves: Mapping[TopicPartitionReplica, str], *, timeout: float | None = None
    ) -> None:
        """Move each replica's log to the named log dir of its broker (the move goes on in the
        background: DescribeLogDirs shows it as a future replica until it completes)."""

        async def send(
            node_id: int, pending: list[TopicPartitionReplica]
        ) -> dict[TopicPartitionReplica, Any]:
            subset = {TopicPartition(r.topic, r.partition): moves[r] for r in pending}
            response = await self._client.send(node_id, lambda c: requests.alter_replica_log_dirs(c, subset))
            return {
                TopicPartitionReplica(t.topic_name, p.partition_index, node_id): None
                if p.error_code == ErrorCode.none
                else _error(
                    p.error_code, f"replica of {t.topic_name}-{p.partition_index} on broker {node_id}"
                )
                for t in response.results
                for p in t.partitions
            }

        async def attempt(pending: list[TopicPartitionReplica]) -> dict[TopicPartitionReplica, Any]:
            by_node: dict[int, list[TopicPartitionReplica]] = defaultdict(list)
            for replica in pending:
                by_node[replica.broker_id].append(replica)
            return await self._fan_out(by_node, send)

        await self._call("AlterReplicaLogDirs", moves, attempt, timeout)
