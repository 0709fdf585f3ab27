"""Fetch (1): whole batches below the high watermark, long-polling up to max_wait.

A response holds at most the broker's fetch.max.bytes (KIP-541) or the request's
max_bytes, whichever is smaller -- except that the first partition with data always
gets one whole batch, as in Kafka, so a batch larger than the limits is not stuck.

Incremental fetch sessions (KIP-227, ``strom.broker.fetch_session``) from v7: a full fetch
with session epoch 0 opens a session and its response carries the session id; incremental
fetches name the session and its next epoch, list only the partitions whose request changed
and forget the ones dropped; the broker reads the partitions of the session that changed since
(its ready set) and those listed, and answers only those with records, a changed high watermark, last stable offset or log start offset, an error
or a diverging epoch. Epoch -1 is a sessionless full fetch, answered with session id 0 and
every requested partition, as before KIP-227 (librdkafka and aiokafka fetch so). An unknown
session is FETCH_SESSION_ID_NOT_FOUND, a wrong epoch INVALID_FETCH_SESSION_EPOCH, and a
session used across the v13 topic-id boundary FETCH_SESSION_TOPIC_ID_ERROR.

A fetch naming a replica (``replica_id``, from v15 ``replica_state``) reads up to the log end and
moves the follower's position, the HW and the ISR, so it is served as one only if the replica
manager accepts it as that broker's fetcher (a live broker, its KIP-903 broker epoch, its host).
Otherwise every partition it lists is answered NOT_LEADER_OR_FOLLOWER, as Kafka answers a
follower fetch it does not record, and no fetch session is touched.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any

from strom.broker.control_plane.metadata import MetadataImage, TopicState
from strom.broker.dispatcher import RequestContext
from strom.broker.fetch_session import (
    FINAL_EPOCH,
    INVALID_SESSION_ID,
    FetchContext,
    PartitionKey,
    RequestedPartition,
    TopicKey,
)
from strom.broker.handlers.partition_view import unhosted_partition_error
from strom.broker.partition import TopicPartition
from strom.broker.replica_manager import FetchRequestPartition, FetchResult, ReplicaManager
from strom.broker.slices import SLICE_SIZE, ArrayBuilder, sliced
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import build, has_field, to_ms

READ_COMMITTED = 1
# Errors that tell a client to look for the leader elsewhere: answered with KIP-951 hints.
LEADER_ERRORS = frozenset({ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch})


def replica_id_of(version: int, request: Any) -> int:
    """The fetching follower's broker id, or -1 for a consumer (replica_state from v15)."""
    if version >= 15:
        return int(request.replica_state.replica_id)
    return int(getattr(request, "replica_id", -1))


def replica_epoch_of(version: int, request: Any) -> int:
    """The fetching follower's broker epoch (KIP-903, v15+), -1 when it sends none."""
    return int(request.replica_state.replica_epoch) if version >= 15 else -1


def peer_host(peer: str) -> str:
    """The address of a connection's peer, given as ``address:port``."""
    return peer.rsplit(":", 1)[0]


async def requested_partitions(
    version: int, request: Any
) -> tuple[list[RequestedPartition], list[PartitionKey]]:
    """The partitions a fetch lists and those it forgets, keyed by topic id from v13, else name.

    A partition listed twice is one partition, with the later request, as in Kafka (whose
    request keeps its partitions in a map): a fetch cannot make the broker read a log more than
    once by naming its partition 400,000 times.
    """
    by_id = version >= 13
    requested: dict[PartitionKey, RequestedPartition] = {}

    def add(topic_key: TopicKey, p: Any) -> None:
        key = (topic_key, p.partition)
        requested[key] = RequestedPartition(
            key,
            p.fetch_offset,
            max(0, p.partition_max_bytes),
            log_start_offset=getattr(p, "log_start_offset", -1),
            current_leader_epoch=getattr(p, "current_leader_epoch", -1),
            last_fetched_epoch=getattr(p, "last_fetched_epoch", -1),
        )

    topics = request.topics
    if len(topics) <= SLICE_SIZE and sum(len(t.partitions) for t in topics) <= SLICE_SIZE:
        # One slice (every consumer's fetch): no turn of the event loop to give.
        for fetch_topic in topics:
            for p in fetch_topic.partitions:
                add(fetch_topic.topic_id if by_id else fetch_topic.topic, p)
    else:
        async for fetch_topic in sliced(topics):
            topic_key = fetch_topic.topic_id if by_id else fetch_topic.topic
            async for p in sliced(fetch_topic.partitions):
                add(topic_key, p)
    forgotten: list[PartitionKey] = [
        (topic.topic_id if by_id else topic.topic, partition)
        for topic in getattr(request, "forgotten_topics_data", None) or ()
        for partition in topic.partitions
    ]
    return list(requested.values()), forgotten


async def handle_fetch(ctx: RequestContext, request: Any) -> Any:
    broker = ctx.broker
    image = broker.control_plane.image
    r = ctx.response
    by_id = ctx.version >= 13
    replica_id = replica_id_of(ctx.version, request)
    requested, forgotten = await requested_partitions(ctx.version, request)
    if replica_id >= 0 and not await broker.replica_manager.accepts_replica_fetch(
        replica_id, replica_epoch_of(ctx.version, request), peer_host(ctx.connection.peer)
    ):
        return await refused_replica_fetch(r, requested, by_id)
    # Before v7 there are no sessions: every fetch is a sessionless full fetch.
    context = broker.fetch_sessions.new_context(
        getattr(request, "session_id", INVALID_SESSION_ID),
        getattr(request, "session_epoch", FINAL_EPOCH),
        requested,
        forgotten,
        uses_topic_ids=by_id,
        privileged=replica_id >= 0,
        owner=ctx.connection,
        replica_id=replica_id,
    )
    if context.error != ErrorCode.none:
        return build(r.FetchResponse, error_code=context.error, session_id=INVALID_SESSION_ID, responses=())
    try:
        results, tps = await read_partitions(
            image,
            broker.replica_manager,
            context,
            by_id=by_id,
            replica_id=replica_id,
            max_wait_ms=to_ms(request.max_wait),
            min_bytes=request.min_bytes,
            max_bytes=max(0, min(getattr(request, "max_bytes", 0x7FFFFFFF), broker.config.fetch_max_bytes)),
            read_committed=replica_id < 0 and getattr(request, "isolation_level", 0) == READ_COMMITTED,
        )
        error, session_id, answered = context.respond(results, tps)
    finally:
        context.abandon()  # unless answered: what the fetch took stays ready for the next one
    if error != ErrorCode.none:
        return build(r.FetchResponse, error_code=error, session_id=session_id, responses=())
    hints = leader_hints(
        broker.replica_manager,
        [tps[key] for key in answered if results[key].error in LEADER_ERRORS],
    )

    def partition_data(key: PartitionKey) -> Any:
        tp = tps[key]
        result = results[key]
        return build(
            r.PartitionData,
            partition_index=tp.partition,
            error_code=result.error,
            high_watermark=result.high_watermark,
            last_stable_offset=result.last_stable_offset,
            log_start_offset=result.log_start_offset,
            aborted_transactions=None
            if result.aborted_transactions is None
            else tuple(
                build(r.AbortedTransaction, producer_id=producer_id, first_offset=first_offset)
                for producer_id, first_offset in result.aborted_transactions
            ),
            preferred_read_replica=-1,
            records=result.records,
            **_partition_hints(r, tp, result, hints),
        )

    responses: Sequence[Any]
    if len(answered) <= SLICE_SIZE:
        # One slice (every consumer's fetch): built at once, no turn of the event loop to give.
        grouped: dict[TopicKey, list[Any]] = {}
        for key in answered:
            grouped.setdefault(key[0], []).append(partition_data(key))
        responses = tuple(
            build(
                r.FetchableTopicResponse,
                partitions=tuple(partitions),
                **({"topic_id": topic_key} if by_id else {"topic": topic_key}),
            )
            for topic_key, partitions in grouped.items()
        )
    else:
        by_topic: dict[TopicKey, ArrayBuilder] = {}
        async for key in sliced(answered):
            builder = by_topic.get(key[0])
            if builder is None:
                builder = by_topic[key[0]] = ArrayBuilder(r.PartitionData)
            await builder.add(partition_data(key))
        responses = await topic_responses(r, by_topic, by_id)
    return build(
        r.FetchResponse,
        error_code=ErrorCode.none,
        session_id=session_id,
        responses=responses,
        node_endpoints=node_endpoints(r, broker.replica_manager, hints),
    )


async def read_partitions(
    image: MetadataImage,
    replica_manager: ReplicaManager,
    context: FetchContext,
    *,
    by_id: bool,
    replica_id: int,
    max_wait_ms: int,
    min_bytes: int,
    max_bytes: int,
    read_committed: bool = False,
) -> tuple[dict[PartitionKey, FetchResult], dict[PartitionKey, TopicPartition]]:
    """Read the fetch's partitions (a session's: only those ready, see ``strom.broker.fetch_session``)
    and, while fewer than ``min_bytes`` are available, wait up to ``max_wait_ms`` (a delayed fetch)
    for a change to one of them -- a session's fetch for a change to any partition of the session --
    and read what changed. Returns each partition's result and what its key was resolved to."""
    results: dict[PartitionKey, FetchResult] = {}
    tps: dict[PartitionKey, TopicPartition] = {}
    topics: dict[TopicKey, tuple[str, TopicState | None]] = {}
    unknown = ErrorCode.unknown_topic_id if by_id else ErrorCode.unknown_topic_or_partition
    session = context.session
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_wait_ms / 1000
    visit = context.partitions
    total = 0
    first = True

    def resolve(p: RequestedPartition) -> FetchRequestPartition | None:
        """The read of partition ``p``, or None when it is answered with an error (in ``results``)."""
        key = p.key
        topic_key, index = key
        resolved = topics.get(topic_key)
        if resolved is None:
            if isinstance(topic_key, uuid.UUID):
                topic = image.topic_by_id(topic_key)
                resolved = (topic.name if topic is not None else str(topic_key), topic)
            else:
                resolved = (str(topic_key), image.topic(str(topic_key)))
            topics[topic_key] = resolved
        name, topic = resolved
        tp = tps[key] = TopicPartition(name, index)
        context.watch(key, tp)
        partition = replica_manager.partition(tp) if topic is not None else None
        if partition is None:
            results[key] = FetchResult(
                unknown if topic is None else unhosted_partition_error(replica_manager, image, tp)
            )
            return None
        epoch_error = partition.leader_epoch_error(p.current_leader_epoch)
        if epoch_error is None and not partition.is_leader:
            # No fetch from followers (KIP-392 is not implemented): only the leader serves.
            epoch_error = ErrorCode.not_leader_or_follower
        if epoch_error is not None:
            results[key] = FetchResult(epoch_error)
            return None
        previous = results.get(key)
        if previous is not None:
            nonlocal total
            total -= len(previous.records)  # read again: its records count once
        return FetchRequestPartition(
            tp,
            p.fetch_offset,
            p.max_bytes,
            last_fetched_epoch=p.last_fetched_epoch,
            log_start_offset=p.log_start_offset,
        )

    while True:
        reads: list[FetchRequestPartition] = []
        read_keys: list[PartitionKey] = []
        # Kafka bounds the partitions of one fetch only by its size: 400,000 of them are resolved
        # a slice at a time, other clients served in between (a fetch of one slice, as every
        # consumer's is, has no turn of the event loop to give).
        if len(visit) <= SLICE_SIZE:
            for p in visit:
                if (fetch := resolve(p)) is not None:
                    reads.append(fetch)
                    read_keys.append(p.key)
        else:
            async for p in sliced(visit):
                if (fetch := resolve(p)) is not None:
                    reads.append(fetch)
                    read_keys.append(p.key)
        errors = len(reads) < len(visit)  # some answered with an error
        if first and session is not None and replica_id >= 0:
            session.last_fetch_time_ms = replica_manager.time_ms()
        # A follower's position is recorded at every read, not only the first: a session's
        # partition first read after the wait (marked by a new epoch or an ISR change) is read
        # once in this fetch and then quiet, so recorded now or never (its follower would fall
        # out of the ISR, and never rejoin, though it fetched).
        read, _ = replica_manager.read_from_local_log(
            reads, max(0, max_bytes - total), replica_id, True, min_one_batch=total == 0, read_committed=read_committed
        )
        first = False
        for key, fetch in zip(read_keys, reads, strict=True):
            result = results[key] = read[fetch.tp]
            total += len(result.records)
            if result.error != ErrorCode.none or result.diverging_epoch is not None:
                errors = True
        remaining = deadline - loop.time()
        # Errors are answered at once, as Kafka completes such a fetch immediately.
        if errors or total >= min_bytes or remaining <= 0:
            return results, tps
        if session is not None:
            await session.wait_for_change(remaining)
            visit = context.take_ready()
        elif reads:
            await replica_manager.await_change([fetch.tp for fetch in reads], remaining)
        else:
            return results, tps


async def topic_responses(r: Any, by_topic: dict[TopicKey, ArrayBuilder], by_id: bool) -> Sequence[Any]:
    """The response's topics, each with the partitions gathered for it, a slice at a time."""
    responses = ArrayBuilder(r.FetchableTopicResponse)
    async for topic_key, partitions in sliced(by_topic.items()):
        await responses.add(
            build(
                r.FetchableTopicResponse,
                partitions=partitions.value(),
                **({"topic_id": topic_key} if by_id else {"topic": topic_key}),
            )
        )
    return responses.value()


async def refused_replica_fetch(r: Any, requested: list[RequestedPartition], by_id: bool) -> Any:
    """Every requested partition NOT_LEADER_OR_FOLLOWER, without records or a session (a slice
    at a time, as any fetch: a refused one may name 400,000 partitions too)."""
    by_topic: dict[TopicKey, ArrayBuilder] = {}
    async for p in sliced(requested):
        topic_key, index = p.key
        partitions = by_topic.get(topic_key)
        if partitions is None:
            partitions = by_topic[topic_key] = ArrayBuilder(r.PartitionData)
        await partitions.add(
            build(
                r.PartitionData,
                partition_index=index,
                error_code=ErrorCode.not_leader_or_follower,
                high_watermark=-1,
                last_stable_offset=-1,
                log_start_offset=-1,
                aborted_transactions=None,
                preferred_read_replica=-1,
                records=b"",
            )
        )
    return build(
        r.FetchResponse,
        error_code=ErrorCode.none,
        session_id=INVALID_SESSION_ID,
        responses=await topic_responses(r, by_topic, by_id),
    )


def leader_hints(replica_manager: Any, tps: list[TopicPartition]) -> dict[TopicPartition, tuple[int, int]]:
    """KIP-951: the leader (id, epoch) this broker knows for partitions it cannot serve."""
    return {tp: hint for tp in tps if (hint := replica_manager.leader_hint(tp)) is not None}


def node_endpoints(
    r: Any, replica_manager: Any, hints: dict[TopicPartition, tuple[int, int]]
) -> tuple[Any, ...]:
    """KIP-951's node_endpoints: where each hinted leader listens (only in versions that have it)."""
    if not hints or not hasattr(r, "NodeEndpoint"):
        return ()
    endpoints = []
    for leader_id in sorted({leader for leader, _ in hints.values()}):
        endpoint = replica_manager.broker_endpoint(leader_id)
        if endpoint is not None:
            endpoints.append(
                build(r.NodeEndpoint, node_id=leader_id, host=endpoint[0], port=endpoint[1], rack=None)
            )
    return tuple(endpoints)


def _partition_hints(
    r: Any, tp: TopicPartition, result: FetchResult, hints: dict[TopicPartition, tuple[int, int]]
) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if result.diverging_epoch is not None and has_field(r.PartitionData, "diverging_epoch"):
        epoch, end_offset = result.diverging_epoch
        fields["diverging_epoch"] = build(r.EpochEndOffset, epoch=epoch, end_offset=end_offset)
    hint = hints.get(tp)
    if hint is not None and has_field(r.PartitionData, "current_leader"):
        fields["current_leader"] = build(r.LeaderIdAndEpoch, leader_id=hint[0], leader_epoch=hint[1])
    return fields
