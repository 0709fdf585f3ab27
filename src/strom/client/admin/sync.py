"""The synchronous admin client: AsyncAdminClient's calls on a background event-loop thread."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

from strom.client.admin.client import AsyncAdminClient
from strom.client.admin.types import (
    AbortTransactionSpec,
    AlterConfigOp,
    ClusterDescription,
    ConfigEntry,
    ConfigResource,
    ElectionType,
    GroupDescription,
    GroupListing,
    HangingTransaction,
    ListOffsetsResult,
    NewPartitions,
    NewTopic,
    OffsetReset,
    OffsetSpec,
    PartitionReassignment,
    PlannedOffset,
    ProducerState,
    TopicDescription,
    TopicPartitionReplica,
    TransactionDescription,
    TransactionListing,
)
from strom.client.cluster import TopicPartition
from strom.client.consumer.structs import OffsetAndMetadata
from strom.client.errors import KafkaException
from strom.client.loop_thread import EventLoopThread


class AdminClient:
    """Kafka's Admin API, blocking. Every call takes an optional ``timeout`` in seconds
    (default ``default.api.timeout.ms``); failures raise KafkaException with the broker's code."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._admin = AsyncAdminClient(config)
        self.config = self._admin.config
        self._io = EventLoopThread(f"strom-admin-{self.config['client.id']}")
        self._closed = False

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._io.run(self._admin.close())
        finally:
            self._io.stop()

    # -- topics

    def create_topics(
        self, new_topics: Sequence[NewTopic], *, validate_only: bool = False, timeout: float | None = None
    ) -> None:
        self._io.run(self._admin.create_topics(new_topics, validate_only=validate_only, timeout=timeout))

    def delete_topics(self, names: Sequence[str], *, timeout: float | None = None) -> None:
        self._io.run(self._admin.delete_topics(names, timeout=timeout))

    def list_topics(self, *, include_internal: bool = False, timeout: float | None = None) -> list[str]:
        return self._io.run(self._admin.list_topics(include_internal=include_internal, timeout=timeout))

    def describe_topics(
        self, names: Sequence[str], *, timeout: float | None = None
    ) -> dict[str, TopicDescription]:
        return self._io.run(self._admin.describe_topics(names, timeout=timeout))

    def create_partitions(
        self,
        new_partitions: Mapping[str, int | NewPartitions],
        *,
        validate_only: bool = False,
        timeout: float | None = None,
    ) -> None:
        self._io.run(
            self._admin.create_partitions(new_partitions, validate_only=validate_only, timeout=timeout)
        )

    # -- configs

    def describe_configs(
        self, resources: Sequence[ConfigResource], *, timeout: float | None = None
    ) -> dict[ConfigResource, dict[str, ConfigEntry]]:
        return self._io.run(self._admin.describe_configs(resources, timeout=timeout))

    def incremental_alter_configs(
        self,
        changes: Mapping[ConfigResource, Sequence[AlterConfigOp]],
        *,
        validate_only: bool = False,
        timeout: float | None = None,
    ) -> None:
        self._io.run(
            self._admin.incremental_alter_configs(changes, validate_only=validate_only, timeout=timeout)
        )

    def alter_configs(
        self,
        configs: Mapping[ConfigResource, Mapping[str, str]],
        *,
        validate_only: bool = False,
        timeout: float | None = None,
    ) -> None:
        self._io.run(self._admin.alter_configs(configs, validate_only=validate_only, timeout=timeout))

    # -- groups

    def list_consumer_groups(
        self, states: Iterable[str] | None = None, *, timeout: float | None = None
    ) -> list[GroupListing]:
        return self._io.run(self._admin.list_consumer_groups(states, timeout=timeout))

    def describe_consumer_groups(
        self, group_ids: Sequence[str], *, timeout: float | None = None
    ) -> dict[str, GroupDescription]:
        return self._io.run(self._admin.describe_consumer_groups(group_ids, timeout=timeout))

    def delete_consumer_groups(self, group_ids: Sequence[str], *, timeout: float | None = None) -> None:
        self._io.run(self._admin.delete_consumer_groups(group_ids, timeout=timeout))

    def list_consumer_group_offsets(
        self,
        group_id: str,
        partitions: Iterable[TopicPartition] | None = None,
        *,
        timeout: float | None = None,
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        return self._io.run(self._admin.list_consumer_group_offsets(group_id, partitions, timeout=timeout))

    def alter_consumer_group_offsets(
        self,
        group_id: str,
        offsets: Mapping[TopicPartition, OffsetAndMetadata | int],
        *,
        timeout: float | None = None,
    ) -> None:
        self._io.run(self._admin.alter_consumer_group_offsets(group_id, offsets, timeout=timeout))

    def delete_consumer_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition], *, timeout: float | None = None
    ) -> None:
        self._io.run(self._admin.delete_consumer_group_offsets(group_id, partitions, timeout=timeout))

    def plan_offset_reset(
        self,
        group_id: str,
        reset: OffsetReset,
        partitions: Iterable[TopicPartition] | None = None,
        *,
        timeout: float | None = None,
    ) -> list[PlannedOffset]:
        return self._io.run(self._admin.plan_offset_reset(group_id, reset, partitions, timeout=timeout))

    # -- partition offsets, records, cluster

    def list_offsets(
        self,
        specs: Mapping[TopicPartition, OffsetSpec],
        *,
        isolation_level: str = "read_uncommitted",
        timeout: float | None = None,
    ) -> dict[TopicPartition, ListOffsetsResult]:
        return self._io.run(self._admin.list_offsets(specs, isolation_level=isolation_level, timeout=timeout))

    def delete_records(
        self, before_offsets: Mapping[TopicPartition, int], *, timeout: float | None = None
    ) -> dict[TopicPartition, int]:
        return self._io.run(self._admin.delete_records(before_offsets, timeout=timeout))

    # -- transactions

    def describe_transactions(
        self, transactional_ids: Sequence[str], *, timeout: float | None = None
    ) -> dict[str, TransactionDescription]:
        return self._io.run(self._admin.describe_transactions(transactional_ids, timeout=timeout))

    def list_transactions(
        self,
        states: Iterable[str] | None = None,
        producer_ids: Iterable[int] | None = None,
        duration_ms: int | None = None,
        *,
        timeout: float | None = None,
    ) -> list[TransactionListing]:
        return self._io.run(self._admin.list_transactions(states, producer_ids, duration_ms, timeout=timeout))

    def describe_producers(
        self, partitions: Iterable[TopicPartition], *, broker_id: int | None = None, timeout: float | None = None
    ) -> dict[TopicPartition, list[ProducerState]]:
        return self._io.run(self._admin.describe_producers(partitions, broker_id=broker_id, timeout=timeout))

    def abort_transaction(self, spec: AbortTransactionSpec, *, timeout: float | None = None) -> None:
        self._io.run(self._admin.abort_transaction(spec, timeout=timeout))

    def find_hanging_transactions(
        self,
        topics: Sequence[str] | None = None,
        *,
        partitions: Sequence[TopicPartition] | None = None,
        broker_id: int | None = None,
        max_transaction_timeout_ms: int = 15 * 60_000,
        timeout: float | None = None,
    ) -> list[HangingTransaction]:
        return self._io.run(
            self._admin.find_hanging_transactions(
                topics,
                partitions=partitions,
                broker_id=broker_id,
                max_transaction_timeout_ms=max_transaction_timeout_ms,
                timeout=timeout,
            )
        )

    # -- cluster

    def describe_cluster(self, *, timeout: float | None = None) -> ClusterDescription:
        return self._io.run(self._admin.describe_cluster(timeout=timeout))

    def elect_leaders(
        self,
        election_type: ElectionType,
        partitions: Sequence[TopicPartition] | None = None,
        *,
        timeout: float | None = None,
    ) -> dict[TopicPartition, KafkaException | None]:
        return self._io.run(self._admin.elect_leaders(election_type, partitions, timeout=timeout))

    def alter_partition_reassignments(
        self, reassignments: Mapping[TopicPartition, Sequence[int] | None], *, timeout: float | None = None
    ) -> None:
        self._io.run(self._admin.alter_partition_reassignments(reassignments, timeout=timeout))

    def list_partition_reassignments(
        self, partitions: Sequence[TopicPartition] | None = None, *, timeout: float | None = None
    ) -> dict[TopicPartition, PartitionReassignment]:
        return self._io.run(self._admin.list_partition_reassignments(partitions, timeout=timeout))

    def describe_topic_partitions(
        self, topics: Sequence[str] = (), *, partition_limit: int = 2000, timeout: float | None = None
    ) -> dict[str, TopicDescription]:
        return self._io.run(
            self._admin.describe_topic_partitions(topics, partition_limit=partition_limit, timeout=timeout)
        )

    def alter_replica_log_dirs(
        self, moves: Mapping[TopicPartitionReplica, str], *, timeout: float | None = None
    ) -> None:
        self._io.run(self._admin.alter_replica_log_dirs(moves, timeout=timeout))
