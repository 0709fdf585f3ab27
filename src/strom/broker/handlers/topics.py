"""CreateTopics (19), DeleteTopics (20) and CreatePartitions (37): the embedded controller's topic operations.

Like Kafka's controller, one request may not create more than 10,000 partitions
(ReplicationControlManager.MAX_PARTITIONS_PER_BATCH for CreateTopics, the
MAX_RECORDS_PER_USER_OP bound for CreatePartitions): such a request is refused whole,
every topic answered POLICY_VIOLATION, before anything is allocated.
"""

from __future__ import annotations

import datetime
import uuid
from collections import Counter
from typing import Any

from strom.broker.control_plane.assignment import InvalidReplicationFactorError
from strom.broker.control_plane.local import InvalidTopicError, TopicExistsError, validate_topic_name
from strom.broker.control_plane.plane import MetadataWaitTimeout
from strom.broker.dispatcher import RequestContext
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import ZERO_UUID, build
from strom.storage import KafkaStorageError
from strom.storage.log_config import InvalidConfigError, LogConfig, describe_topic_config

MAX_PARTITIONS_PER_REQUEST = 10_000


class TopicRequestError(Exception):
    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error


def _timeout_ms(request: Any) -> int:
    """The request's timeout (how long a cluster's admin operation waits for its effect)."""
    timeout = request.timeout
    return int(timeout.total_seconds() * 1000) if isinstance(timeout, datetime.timedelta) else int(timeout)


def _registered_brokers(ctx: RequestContext) -> set[int]:
    return set(ctx.broker.control_plane.live_broker_ids)


def _check_assignments(
    ctx: RequestContext, assignments: list[tuple[int, ...]], replication_factor: int
) -> None:
    """Kafka's checks of a manual assignment: every replica list non-empty, without repeats, of
    registered brokers, all of one length (``replication_factor``, or the first list's)."""
    registered = _registered_brokers(ctx)
    for broker_ids in assignments:
        if not broker_ids:
            raise TopicRequestError(
                ErrorCode.invalid_replica_assignment,
                "The manual partition assignment includes an empty replica list.",
            )
        for broker_id in broker_ids:
            if broker_ids.count(broker_id) > 1:
                raise TopicRequestError(
                    ErrorCode.invalid_replica_assignment,
                    f"The manual partition assignment includes the broker {broker_id} more than once.",
                )
            if broker_id not in registered:
                raise TopicRequestError(
                    ErrorCode.invalid_replica_assignment,
                    f"The manual partition assignment includes broker {broker_id}, but no such broker "
                    f"is registered (the registered brokers are {sorted(registered)}).",
                )
        expected = replication_factor if replication_factor > 0 else len(assignments[0])
        if len(broker_ids) != expected:
            raise TopicRequestError(
                ErrorCode.invalid_replica_assignment,
                f"The manual partition assignment includes a partition with {len(broker_ids)} replica(s), "
                f"but this is not consistent with previous partitions, which have {expected} replica(s).",
            )


def _check_partition_indexes(indexes: list[int]) -> None:
    """A CreateTopics assignment names partitions 0..n-1, each once (Kafka's controller)."""
    seen: set[int] = set()
    for index in indexes:
        if index in seen:
            raise TopicRequestError(
                ErrorCode.invalid_replica_assignment,
                f"Found multiple manual partition assignments for partition {index}",
            )
        seen.add(index)
    if seen != set(range(len(indexes))):
        raise TopicRequestError(
            ErrorCode.invalid_replica_assignment,
            "partitions should be a consecutive 0-based integer sequence",
        )


def _check_replication_factor(ctx: RequestContext, replication_factor: int) -> None:
    plane = ctx.broker.control_plane
    if plane.replicated:
        if replication_factor > len(plane.live_broker_ids):
            # Kafka's AdminUtils message (ZooKeeper mode).
            raise TopicRequestError(
                ErrorCode.invalid_replication_factor,
                f"Replication factor: {replication_factor} larger than available brokers: "
                f"{len(plane.live_broker_ids)}.",
            )
    elif replication_factor > 1:
        # One registered broker: a replica set can have at most one member.
        raise TopicRequestError(
            ErrorCode.invalid_replication_factor,
            f"Unable to replicate the partition {replication_factor} time(s): The target replication factor "
            f"of {replication_factor} cannot be reached because only 1 broker(s) are registered.",
        )
    if replication_factor == 0 or replication_factor < -1:
        raise TopicRequestError(
            ErrorCode.invalid_replication_factor, "Replication factor must be larger than 0."
        )


def _partitions_requested(topics: Any, default_partitions: int) -> int:
    """An upper bound of the partitions a CreateTopics request asks for, as Kafka's controller counts them."""
    total = 0
    for topic in topics:
        if topic.assignments:
            total += len(topic.assignments)
        elif topic.num_partitions == -1:
            total += default_partitions
        elif topic.num_partitions > 0:
            total += topic.num_partitions
    return total


async def handle_create_topics(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    broker = ctx.broker
    counts = Counter(t.name for t in request.topics)
    too_many: TopicRequestError | None = None
    if _partitions_requested(request.topics, broker.config.num_partitions) > MAX_PARTITIONS_PER_REQUEST:
        too_many = TopicRequestError(
            ErrorCode.policy_violation, "Excessively large number of partitions per request."
        )
    results = []
    for topic in request.topics:
        configs = {c.name: c.value for c in topic.configs if c.value is not None}
        num_partitions = topic.num_partitions
        replication_factor = topic.replication_factor
        try:
            if too_many is not None:
                raise too_many
            if counts[topic.name] > 1:
                raise TopicRequestError(ErrorCode.invalid_request, "Duplicate topic name in the request.")
            try:
                validate_topic_name(topic.name)
            except InvalidTopicError as exc:
                raise TopicRequestError(ErrorCode.invalid_topic_exception, str(exc)) from exc
            if topic.name in broker.control_plane.image:
                raise TopicRequestError(
                    ErrorCode.topic_already_exists, f"Topic '{topic.name}' already exists."
                )
            assignments = [tuple(a.broker_ids) for a in topic.assignments]
            if assignments:
                if num_partitions != -1 or replication_factor != -1:
                    raise TopicRequestError(
                        ErrorCode.invalid_request,
                        "Both numPartitions or replicationFactor and replicasAssignments were set. "
                        "Both cannot be used at the same time.",
                    )
                _check_partition_indexes([a.partition_index for a in topic.assignments])
                _check_assignments(ctx, assignments, -1)
                num_partitions, replication_factor = len(assignments), len(assignments[0])
            if num_partitions == -1:
                num_partitions = broker.config.num_partitions
            if replication_factor == -1:
                replication_factor = broker.config.default_replication_factor
            if num_partitions <= 0:
                raise TopicRequestError(
                    ErrorCode.invalid_partitions, "Number of partitions must be larger than 0."
                )
            _check_replication_factor(ctx, replication_factor)
            try:
                LogConfig.from_props(configs, broker.config.log_config_defaults())
            except InvalidConfigError as exc:
                raise TopicRequestError(ErrorCode.invalid_config, str(exc)) from exc
            topic_id = ZERO_UUID
            if not request.validate_only:
                try:
                    topic_id = await broker.control_plane.create_topic(
                        topic.name,
                        num_partitions,
                        configs,
                        replication_factor=replication_factor,
                        assignment={a.partition_index: list(a.broker_ids) for a in topic.assignments} or None,
                        timeout_ms=_timeout_ms(request),
                    )
                except TopicExistsError as exc:  # created meanwhile by another request
                    raise TopicRequestError(ErrorCode.topic_already_exists, str(exc)) from exc
                except KafkaStorageError as exc:
                    raise TopicRequestError(ErrorCode.kafka_storage_error, str(exc)) from exc
                except InvalidReplicationFactorError as exc:  # brokers left meanwhile
                    raise TopicRequestError(ErrorCode.invalid_replication_factor, str(exc)) from exc
                except MetadataWaitTimeout as exc:
                    # Created, but its leaders were not elected within the request's timeout (Kafka too
                    # answers REQUEST_TIMED_OUT; the topic exists).
                    raise TopicRequestError(ErrorCode.request_timed_out, str(exc)) from exc
        except TopicRequestError as exc:
            results.append(
                build(
                    r.CreatableTopicResult,
                    name=topic.name,
                    topic_id=ZERO_UUID,
                    error_code=exc.error,
                    error_message=str(exc),
                    num_partitions=-1,
                    replication_factor=-1,
                    configs=None,
                )
            )
            continue
        described = None
        if hasattr(r, "CreatableTopicConfigs"):  # v5+ echo the effective configs
            described = tuple(
                build(
                    r.CreatableTopicConfigs,
                    name=e.name,
                    value=e.value,
                    read_only=e.read_only,
                    config_source=e.source,
                    is_sensitive=e.is_sensitive,
                )
                for e in describe_topic_config(configs, broker.config.log_config_defaults())
            )
        results.append(
            build(
                r.CreatableTopicResult,
                name=topic.name,
                topic_id=topic_id,
                error_code=ErrorCode.none,
                error_message=None,
                num_partitions=num_partitions,
                replication_factor=replication_factor,
                configs=described,
            )
        )
    return build(r.CreateTopicsResponse, topics=tuple(results))


async def handle_delete_topics(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    broker = ctx.broker
    image = broker.control_plane.image
    wanted: list[tuple[str | None, uuid.UUID | None]]
    if hasattr(request, "topics"):
        wanted = [(t.name, t.topic_id if t.topic_id != ZERO_UUID else None) for t in request.topics]
    else:
        wanted = [(name, None) for name in request.topic_names]
    results = []
    for name, topic_id in wanted:
        topic = image.topic_by_id(topic_id) if topic_id is not None else image.topic(name or "")
        error, message = ErrorCode.none, None
        if topic is None:
            error = (
                ErrorCode.unknown_topic_id if topic_id is not None else ErrorCode.unknown_topic_or_partition
            )
        elif not broker.config.delete_topic_enable:
            error, message = ErrorCode.topic_deletion_disabled, "Topic deletion is disabled."
        elif topic.internal:
            # Deleting __consumer_offsets would drop every group's committed offsets.
            error, message = (
                ErrorCode.invalid_request,
                f"Topic {topic.name} is an internal topic and cannot be deleted.",
            )
        else:
            try:
                if (
                    await broker.control_plane.delete_topic(topic.name, _timeout_ms(request)) is None
                ):  # deleted meanwhile
                    error = ErrorCode.unknown_topic_or_partition
            except KafkaStorageError as exc:
                error, message = ErrorCode.kafka_storage_error, str(exc)
            except MetadataWaitTimeout as exc:  # marked for deletion; the controller finishes it
                error, message = ErrorCode.request_timed_out, str(exc)
        results.append(
            build(
                r.DeletableTopicResult,
                name=topic.name if topic else name,
                topic_id=topic.topic_id if topic else (topic_id or ZERO_UUID),
                error_code=error,
                error_message=message,
            )
        )
    return build(r.DeleteTopicsResponse, responses=tuple(results))


async def handle_create_partitions(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    broker = ctx.broker
    counts = Counter(t.name for t in request.topics)
    image = broker.control_plane.image
    added = 0
    for topic in request.topics:
        current = image.topic(topic.name)
        if current is not None and counts[topic.name] == 1:
            added += max(0, topic.count - len(current.partitions))
    too_many: TopicRequestError | None = None
    if added > MAX_PARTITIONS_PER_REQUEST:
        too_many = TopicRequestError(
            ErrorCode.policy_violation, "Unable to perform excessively large batch operation."
        )
    results = []
    for topic in request.topics:
        error, message = ErrorCode.none, None
        try:
            if too_many is not None:
                raise too_many
            if counts[topic.name] > 1:
                raise TopicRequestError(ErrorCode.invalid_request, "Duplicate topic name in the request.")
            current = broker.control_plane.image.topic(topic.name)
            if current is None:
                raise TopicRequestError(
                    ErrorCode.unknown_topic_or_partition, f"The topic '{topic.name}' does not exist."
                )
            existing = len(current.partitions)
            if topic.count < existing:
                raise TopicRequestError(
                    ErrorCode.invalid_partitions,
                    f"Topic currently has {existing} partitions, which is higher than the requested {topic.count}.",
                )
            if topic.count == existing:
                raise TopicRequestError(
                    ErrorCode.invalid_partitions, f"Topic already has {existing} partitions."
                )
            if topic.assignments is not None:
                if len(topic.assignments) != topic.count - existing:
                    raise TopicRequestError(
                        ErrorCode.invalid_replica_assignment,
                        f"Increasing the number of partitions by {topic.count - existing} but "
                        f"{len(topic.assignments)} assignments provided.",
                    )
                _check_assignments(
                    ctx, [tuple(a.broker_ids) for a in topic.assignments], len(current.partitions[0].replicas)
                )
            elif broker.control_plane.replicated:
                _check_replication_factor(ctx, len(current.partitions[0].replicas))
            if not request.validate_only:
                try:
                    await broker.control_plane.create_partitions(
                        topic.name,
                        topic.count,
                        [list(a.broker_ids) for a in topic.assignments]
                        if topic.assignments is not None
                        else None,
                        _timeout_ms(request),
                    )
                except MetadataWaitTimeout as exc:
                    raise TopicRequestError(ErrorCode.request_timed_out, str(exc)) from exc
                except InvalidReplicationFactorError as exc:
                    raise TopicRequestError(ErrorCode.invalid_replication_factor, str(exc)) from exc
                except KeyError as exc:  # deleted meanwhile
                    raise TopicRequestError(
                        ErrorCode.unknown_topic_or_partition, f"The topic '{topic.name}' does not exist."
                    ) from exc
                except KafkaStorageError as exc:
                    raise TopicRequestError(ErrorCode.kafka_storage_error, str(exc)) from exc
        except TopicRequestError as exc:
            error, message = exc.error, str(exc)
        results.append(
            build(r.CreatePartitionsTopicResult, name=topic.name, error_code=error, error_message=message)
        )
    return build(r.CreatePartitionsResponse, results=tuple(results))
