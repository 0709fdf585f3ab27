"""The admin client's requests, each built at the version negotiated with the broker it goes to,
and the parts of responses that need more than reading a field (configs, group members)."""

from __future__ import annotations

import datetime
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from strom.client.admin.types import (
    MAX_TIMESTAMP,
    AbortTransactionSpec,
    AlterConfigOp,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
)
from strom.client.cluster import TopicPartition
from strom.client.consumer.protocol import ConsumerProtocolError, decode_assignment
from strom.client.consumer.structs import OffsetAndMetadata
from strom.network.connection import BrokerConnection
from strom.protocol.apis import ApiKey, request_module
from strom.protocol.messages import build

CONSUMER_PROTOCOL_TYPE = "consumer"
NO_GENERATION = -1  # an admin commit is not made by a group member
NO_LEADER_EPOCH = -1
BROKERS_ENDPOINT_TYPE = 1


def _ms(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=int(seconds * 1000))


def _by_topic(partitions: Iterable[TopicPartition]) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = defaultdict(list)
    for tp in partitions:
        grouped[tp.topic].append(tp.partition)
    return grouped


# -- topics ----------------------------------------------------------------------------------


def create_topics(
    connection: BrokerConnection, topics: Sequence[NewTopic], validate_only: bool, timeout: float
) -> Any:
    m = request_module(ApiKey.CREATE_TOPICS, connection.version(ApiKey.CREATE_TOPICS, 7, 2))
    return m.CreateTopicsRequest(
        topics=tuple(
            m.CreatableTopic(
                name=topic.name,
                num_partitions=topic.num_partitions,
                replication_factor=topic.replication_factor,
                assignments=tuple(
                    m.CreatableReplicaAssignment(partition_index=p, broker_ids=tuple(ids))
                    for p, ids in (topic.replica_assignment or {}).items()
                ),
                configs=tuple(m.CreatableTopicConfig(name=k, value=v) for k, v in topic.configs.items()),
            )
            for topic in topics
        ),
        timeout=_ms(timeout),
        validate_only=validate_only,
    )


def delete_topics(connection: BrokerConnection, names: Sequence[str], timeout: float) -> Any:
    version = connection.version(ApiKey.DELETE_TOPICS, 6, 1)
    m = request_module(ApiKey.DELETE_TOPICS, version)
    if version >= 6:
        return m.DeleteTopicsRequest(
            topics=tuple(m.DeleteTopicState(name=n, topic_id=None) for n in names), timeout=_ms(timeout)
        )
    return m.DeleteTopicsRequest(topic_names=tuple(names), timeout=_ms(timeout))


def create_partitions(
    connection: BrokerConnection, wanted: Mapping[str, NewPartitions], validate_only: bool, timeout: float
) -> Any:
    m = request_module(ApiKey.CREATE_PARTITIONS, connection.version(ApiKey.CREATE_PARTITIONS, 3))
    return m.CreatePartitionsRequest(
        topics=tuple(
            m.CreatePartitionsTopic(
                name=name,
                count=spec.total_count,
                assignments=None
                if spec.assignments is None
                else tuple(m.CreatePartitionsAssignment(broker_ids=tuple(ids)) for ids in spec.assignments),
            )
            for name, spec in wanted.items()
        ),
        timeout=_ms(timeout),
        validate_only=validate_only,
    )


# -- configs ---------------------------------------------------------------------------------


def describe_configs(connection: BrokerConnection, resources: Sequence[ConfigResource]) -> Any:
    m = request_module(ApiKey.DESCRIBE_CONFIGS, connection.version(ApiKey.DESCRIBE_CONFIGS, 4, 1))
    return build(
        m.DescribeConfigsRequest,
        resources=tuple(
            m.DescribeConfigsResource(
                resource_type=int(r.type), resource_name=r.name, configuration_keys=None
            )
            for r in resources
        ),
        include_synonyms=False,
        include_documentation=False,
    )


def config_entry(config: Any) -> ConfigEntry:
    try:
        source = ConfigSource(config.config_source)
    except ValueError:
        source = ConfigSource.UNKNOWN
    return ConfigEntry(
        name=config.name,
        value=config.value,
        source=source,
        is_default=source == ConfigSource.DEFAULT_CONFIG,
        read_only=bool(config.read_only),
        sensitive=bool(config.is_sensitive),
    )


def incremental_alter_configs(
    connection: BrokerConnection,
    changes: Mapping[ConfigResource, Sequence[AlterConfigOp]],
    validate_only: bool,
) -> Any:
    version = connection.version(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1)
    m = request_module(ApiKey.INCREMENTAL_ALTER_CONFIGS, version)
    return m.IncrementalAlterConfigsRequest(
        resources=tuple(
            m.AlterConfigsResource(
                resource_type=int(resource.type),
                resource_name=resource.name,
                configs=tuple(
                    m.AlterableConfig(name=op.name, config_operation=int(op.op), value=op.value) for op in ops
                ),
            )
            for resource, ops in changes.items()
        ),
        validate_only=validate_only,
    )


def alter_configs(
    connection: BrokerConnection, configs: Mapping[ConfigResource, Mapping[str, str]], validate_only: bool
) -> Any:
    m = request_module(ApiKey.ALTER_CONFIGS, connection.version(ApiKey.ALTER_CONFIGS, 2))
    return m.AlterConfigsRequest(
        resources=tuple(
            m.AlterConfigsResource(
                resource_type=int(resource.type),
                resource_name=resource.name,
                configs=tuple(m.AlterableConfig(name=k, value=v) for k, v in values.items()),
            )
            for resource, values in configs.items()
        ),
        validate_only=validate_only,
    )


# -- groups ----------------------------------------------------------------------------------


def list_groups(connection: BrokerConnection, states: Sequence[str]) -> Any:
    m = request_module(ApiKey.LIST_GROUPS, connection.version(ApiKey.LIST_GROUPS, 5))
    return build(m.ListGroupsRequest, states_filter=tuple(states), types_filter=())


def describe_groups(connection: BrokerConnection, group_ids: Sequence[str]) -> Any:
    m = request_module(ApiKey.DESCRIBE_GROUPS, connection.version(ApiKey.DESCRIBE_GROUPS, 6))
    return build(m.DescribeGroupsRequest, groups=tuple(group_ids), include_authorized_operations=False)


def delete_groups(connection: BrokerConnection, group_ids: Sequence[str]) -> Any:
    m = request_module(ApiKey.DELETE_GROUPS, connection.version(ApiKey.DELETE_GROUPS, 2))
    return m.DeleteGroupsRequest(groups_names=tuple(group_ids))


def member_assignment(protocol_type: str, data: bytes) -> frozenset[TopicPartition]:
    if protocol_type != CONSUMER_PROTOCOL_TYPE:
        return frozenset()
    try:
        return frozenset(decode_assignment(data).partitions)
    except (ConsumerProtocolError, UnicodeDecodeError):
        # One member's unreadable assignment must not hide the rest of the group.
        return frozenset()


def offset_fetch(
    connection: BrokerConnection, group_id: str, partitions: Sequence[TopicPartition] | None
) -> Any:
    # v1 cannot ask for every partition: null topics means "all" from v2 on.
    version = connection.version(ApiKey.OFFSET_FETCH, 9, 1 if partitions is not None else 2)
    m = request_module(ApiKey.OFFSET_FETCH, version)
    grouped = _by_topic(partitions or ())
    if version >= 8:
        topics = None
        if partitions is not None:
            topics = tuple(
                m.OffsetFetchRequestTopics(name=t, partition_indexes=tuple(ps)) for t, ps in grouped.items()
            )
        group = m.OffsetFetchRequestGroup(group_id=group_id, member_id=None, member_epoch=-1, topics=topics)
        return m.OffsetFetchRequest(groups=(group,), require_stable=False)
    topics = None
    if partitions is not None:
        topics = tuple(
            m.OffsetFetchRequestTopic(name=t, partition_indexes=tuple(ps)) for t, ps in grouped.items()
        )
    return build(m.OffsetFetchRequest, group_id=group_id, topics=topics, require_stable=False)


def offset_commit(
    connection: BrokerConnection, group_id: str, offsets: Mapping[TopicPartition, OffsetAndMetadata]
) -> Any:
    m = request_module(ApiKey.OFFSET_COMMIT, connection.version(ApiKey.OFFSET_COMMIT, 9, 2))
    return build(
        m.OffsetCommitRequest,
        group_id=group_id,
        generation_id_or_member_epoch=NO_GENERATION,
        member_id="",
        group_instance_id=None,
        retention_time=datetime.timedelta(milliseconds=-1),  # v2-v4: the broker's retention
        topics=tuple(
            m.OffsetCommitRequestTopic(
                name=topic,
                partitions=tuple(
                    build(
                        m.OffsetCommitRequestPartition,
                        partition_index=p,
                        committed_offset=offsets[TopicPartition(topic, p)].offset,
                        committed_leader_epoch=_epoch(offsets[TopicPartition(topic, p)]),
                        committed_metadata=offsets[TopicPartition(topic, p)].metadata,
                    )
                    for p in ps
                ),
            )
            for topic, ps in _by_topic(offsets).items()
        ),
    )


def _epoch(offset: OffsetAndMetadata) -> int:
    return NO_LEADER_EPOCH if offset.leader_epoch is None else offset.leader_epoch


def offset_delete(connection: BrokerConnection, group_id: str, partitions: Sequence[TopicPartition]) -> Any:
    m = request_module(ApiKey.OFFSET_DELETE, connection.version(ApiKey.OFFSET_DELETE, 0))
    return m.OffsetDeleteRequest(
        group_id=group_id,
        topics=tuple(
            m.OffsetDeleteRequestTopic(
                name=t, partitions=tuple(m.OffsetDeleteRequestPartition(partition_index=p) for p in ps)
            )
            for t, ps in _by_topic(partitions).items()
        ),
    )


# -- partition offsets, records, cluster -----------------------------------------------------


def list_offsets(
    connection: BrokerConnection, specs: Mapping[TopicPartition, OffsetSpec], isolation: int, timeout: float
) -> Any:
    # MAX_TIMESTAMP needs v7, an isolation level v2.
    needs = 7 if any(s.timestamp == MAX_TIMESTAMP for s in specs.values()) else 1 + isolation
    m = request_module(ApiKey.LIST_OFFSETS, connection.version(ApiKey.LIST_OFFSETS, 10, needs))
    return build(
        m.ListOffsetsRequest,
        replica_id=-1,
        isolation_level=isolation,
        topics=tuple(
            m.ListOffsetsTopic(
                name=t,
                partitions=tuple(
                    build(
                        m.ListOffsetsPartition,
                        partition_index=p,
                        current_leader_epoch=NO_LEADER_EPOCH,
                        timestamp=specs[TopicPartition(t, p)].timestamp,
                    )
                    for p in ps
                ),
            )
            for t, ps in _by_topic(specs).items()
        ),
        timeout=_ms(timeout),
    )


def delete_records(
    connection: BrokerConnection, offsets: Mapping[TopicPartition, int], timeout: float
) -> Any:
    m = request_module(ApiKey.DELETE_RECORDS, connection.version(ApiKey.DELETE_RECORDS, 2))
    return m.DeleteRecordsRequest(
        topics=tuple(
            m.DeleteRecordsTopic(
                name=t,
                partitions=tuple(
                    m.DeleteRecordsPartition(partition_index=p, offset=offsets[TopicPartition(t, p)])
                    for p in ps
                ),
            )
            for t, ps in _by_topic(offsets).items()
        ),
        timeout=_ms(timeout),
    )


def describe_cluster(connection: BrokerConnection) -> Any:
    m = request_module(ApiKey.DESCRIBE_CLUSTER, connection.version(ApiKey.DESCRIBE_CLUSTER, 2))
    return build(
        m.DescribeClusterRequest,
        include_cluster_authorized_operations=False,
        endpoint_type=BROKERS_ENDPOINT_TYPE,
        include_fenced_brokers=False,
    )


# -- cluster operations (leaders, reassignments, log dirs) ------------------------------------


def elect_leaders(
    connection: BrokerConnection,
    election_type: int,
    partitions: Sequence[TopicPartition] | None,
    timeout: float,
) -> Any:
    m = request_module(ApiKey.ELECT_LEADERS, connection.version(ApiKey.ELECT_LEADERS, 2, 0))
    return build(
        m.ElectLeadersRequest,
        election_type=election_type,
        topic_partitions=None
        if partitions is None
        else tuple(
            m.TopicPartitions(topic=topic, partitions=tuple(ps))
            for topic, ps in _by_topic(partitions).items()
        ),
        timeout=_ms(timeout),
    )


def alter_partition_reassignments(
    connection: BrokerConnection, reassignments: Mapping[TopicPartition, Sequence[int] | None], timeout: float
) -> Any:
    m = request_module(
        ApiKey.ALTER_PARTITION_REASSIGNMENTS, connection.version(ApiKey.ALTER_PARTITION_REASSIGNMENTS, 1, 0)
    )
    by_topic: dict[str, list[Any]] = defaultdict(list)
    for tp, replicas in reassignments.items():
        by_topic[tp.topic].append(
            m.ReassignablePartition(
                partition_index=tp.partition, replicas=None if replicas is None else tuple(replicas)
            )
        )
    return build(
        m.AlterPartitionReassignmentsRequest,
        timeout=_ms(timeout),
        topics=tuple(m.ReassignableTopic(name=t, partitions=tuple(ps)) for t, ps in by_topic.items()),
    )


def list_partition_reassignments(
    connection: BrokerConnection, partitions: Sequence[TopicPartition] | None, timeout: float
) -> Any:
    m = request_module(ApiKey.LIST_PARTITION_REASSIGNMENTS, 0)
    return m.ListPartitionReassignmentsRequest(
        timeout=_ms(timeout),
        topics=None
        if partitions is None
        else tuple(
            m.ListPartitionReassignmentsTopics(name=t, partition_indexes=tuple(ps))
            for t, ps in _by_topic(partitions).items()
        ),
    )


def describe_topic_partitions(
    connection: BrokerConnection, topics: Sequence[str], partition_limit: int, cursor: tuple[str, int] | None
) -> Any:
    m = request_module(ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0)
    return m.DescribeTopicPartitionsRequest(
        topics=tuple(m.TopicRequest(name=t) for t in topics),
        response_partition_limit=partition_limit,
        cursor=None if cursor is None else m.Cursor(topic_name=cursor[0], partition_index=cursor[1]),
    )


def describe_log_dirs(connection: BrokerConnection) -> Any:
    m = request_module(ApiKey.DESCRIBE_LOG_DIRS, connection.version(ApiKey.DESCRIBE_LOG_DIRS, 4, 1))
    return m.DescribeLogDirsRequest(topics=None)  # every replica of every log dir


def alter_replica_log_dirs(connection: BrokerConnection, moves: Mapping[TopicPartition, str]) -> Any:
    m = request_module(ApiKey.ALTER_REPLICA_LOG_DIRS, connection.version(ApiKey.ALTER_REPLICA_LOG_DIRS, 2, 1))
    by_dir: dict[str, list[TopicPartition]] = defaultdict(list)
    for tp, path in moves.items():
        by_dir[path].append(tp)
    return m.AlterReplicaLogDirsRequest(
        dirs=tuple(
            m.AlterReplicaLogDir(
                path=path,
                topics=tuple(
                    m.AlterReplicaLogDirTopic(name=t, partitions=tuple(ps))
                    for t, ps in _by_topic(tps).items()
                ),
            )
            for path, tps in by_dir.items()
        )
    )


# -- transactions ------------------------------------------------------------------------------


def describe_transactions(connection: BrokerConnection, transactional_ids: Sequence[str]) -> Any:
    m = request_module(ApiKey.DESCRIBE_TRANSACTIONS, connection.version(ApiKey.DESCRIBE_TRANSACTIONS, 0))
    return m.DescribeTransactionsRequest(transactional_ids=tuple(transactional_ids))


def list_transactions(
    connection: BrokerConnection, states: Sequence[str], producer_ids: Sequence[int], duration_ms: int
) -> Any:
    # The duration filter came with v1 (KIP-994); a broker without it could not honour it.
    version = connection.version(ApiKey.LIST_TRANSACTIONS, 1, 1 if duration_ms >= 0 else 0)
    m = request_module(ApiKey.LIST_TRANSACTIONS, version)
    return build(
        m.ListTransactionsRequest,
        state_filters=tuple(states),
        producer_id_filters=tuple(producer_ids),
        duration_filter=duration_ms,
    )


def describe_producers(connection: BrokerConnection, partitions: Iterable[TopicPartition]) -> Any:
    m = request_module(ApiKey.DESCRIBE_PRODUCERS, connection.version(ApiKey.DESCRIBE_PRODUCERS, 0))
    return m.DescribeProducersRequest(
        topics=tuple(
            m.TopicRequest(name=topic, partition_indexes=tuple(indexes))
            for topic, indexes in _by_topic(partitions).items()
        )
    )


def write_abort_marker(connection: BrokerConnection, spec: AbortTransactionSpec) -> Any:
    """WriteTxnMarkers with one ABORT marker, as the transaction's coordinator would send it."""
    m = request_module(ApiKey.WRITE_TXN_MARKERS, connection.version(ApiKey.WRITE_TXN_MARKERS, 1, 1))
    tp = spec.topic_partition
    return m.WriteTxnMarkersRequest(
        markers=(
            m.WritableTxnMarker(
                producer_id=spec.producer_id,
                producer_epoch=spec.producer_epoch,
                transaction_result=False,
                topics=(m.WritableTxnMarkerTopic(name=tp.topic, partition_indexes=(tp.partition,)),),
                coordinator_epoch=spec.coordinator_epoch,
            ),
        )
    )
