"""DeleteRecords (21): advance partitions' log start offsets."""

from __future__ import annotations

import asyncio
from typing import Any

from strom.broker.dispatcher import RequestContext
from strom.broker.handlers.partition_view import unhosted_partition_error
from strom.broker.partition import TopicPartition
from strom.broker.replica_manager import error_code_of
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import build
from strom.storage import StorageError


async def handle_delete_records(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    # (topic, [partition index, low watermark, error]) in request order.
    outcomes: list[tuple[str, list[list[Any]]]] = []
    moved: list[TopicPartition] = []
    for topic in request.topics:
        partitions = []
        for p in topic.partitions:
            error, low_watermark = ErrorCode.none, -1
            tp = TopicPartition(topic.name, p.partition_index)
            partition = ctx.broker.replica_manager.partition(tp)
            if partition is None:
                error = unhosted_partition_error(ctx.broker.replica_manager, ctx.broker.control_plane.image, tp)
            else:
                try:
                    low_watermark = partition.delete_records_on_leader(p.offset)
                    moved.append(tp)
                except StorageError as exc:
                    error = error_code_of(exc)
            partitions.append([p.partition_index, low_watermark, error])
        outcomes.append((topic.name, partitions))
    if moved:
        # Fetch sessions answer the new log start offsets.
        ctx.broker.replica_manager.report_log_start_offsets(moved)
        # The new log start offsets are on disk before the answer says so (fsync off the loop).
        log_manager = ctx.broker.log_manager
        try:
            await asyncio.get_running_loop().run_in_executor(None, log_manager.persist_log_start_offsets)
        except (OSError, StorageError):
            for _, partitions in outcomes:
                for entry in partitions:
                    if entry[2] == ErrorCode.none:
                        entry[1], entry[2] = -1, ErrorCode.kafka_storage_error
    topics = [
        build(
            r.DeleteRecordsTopicResult,
            name=name,
            partitions=tuple(
                build(
                    r.DeleteRecordsPartitionResult,
                    partition_index=index,
                    low_watermark=low_watermark,
                    error_code=error,
                )
                for index, low_watermark, error in partitions
            ),
        )
        for name, partitions in outcomes
    ]
    return build(r.DeleteRecordsResponse, topics=tuple(topics))
