"""DeleteRecords (21): advance partitions' log start offsets."""

from __future__ import annotations

from typing import Any

from strom.broker.dispatcher import RequestContext
from strom.broker.partition import TopicPartition
from strom.broker.replica_manager import error_code_of
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import build
from strom.storage import StorageError


async def handle_delete_records(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    topics = []
    for topic in request.topics:
        partitions = []
        for p in topic.partitions:
            error, low_watermark = ErrorCode.none, -1
            partition = ctx.broker.replica_manager.partition(TopicPartition(topic.name, p.partition_index))
            if partition is None:
                error = ErrorCode.unknown_topic_or_partition
            else:
                try:
                    low_watermark = partition.delete_records_on_leader(p.offset)
                except StorageError as exc:
                    error = error_code_of(exc)
            partitions.append(
                build(
                    r.DeleteRecordsPartitionResult,
                    partition_index=p.partition_index,
                    low_watermark=low_watermark,
                    error_code=error,
                )
            )
        topics.append(build(r.DeleteRecordsTopicResult, name=topic.name, partitions=tuple(partitions)))
    return build(r.DeleteRecordsResponse, topics=tuple(topics))
