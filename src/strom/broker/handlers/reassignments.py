"""AlterPartitionReassignments (45) and ListPartitionReassignments (46).

Any broker answers (Kafka forwards to its controller; here every broker writes ZooKeeper). A
reassignment is validated as Kafka's controller validates a manual assignment, then written to
/admin/reassign_partitions; the controller starts it (KIP-455's adding/removing replicas in the
topic znode) and deletes the request once every partition of it has started, which the broker
waits for within the request's timeout; each partition is then answered by what its topic znode
says (the controller skips a partition it cannot reassign, e.g. of a topic deleted meanwhile). A
cancellation (null replicas) asks the controller for the partition's original replicas (those it
had before the reassignment began: the current replicas without the adding ones). The listing
reads the topic znodes' adding/removing fields. On a single node no reassignment can be in
progress and only this broker can hold a replica.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kazoo.exceptions import KazooException, NodeExistsError

from strom.broker.cluster.local import legal_topic_name
from strom.broker.dispatcher import RequestContext
from strom.broker.zk import znodes
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import ZERO_THROTTLE, build, to_ms

NO_REASSIGNMENT_MESSAGE = "No partition reassignment is in progress."
_POLL_S = 0.05

Outcome = tuple[ErrorCode, str | None]


class _Invalid(Exception):
    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message


async def _topic_znode(ctx: RequestContext, topic: str) -> znodes.TopicZNode | None:
    cluster = ctx.broker.cluster
    if cluster is None:
        return None
    got = await cluster.zk.get_or_none(znodes.topic_path(topic))
    return znodes.TopicZNode.decode(got[0]) if got is not None else None


def _validate_target(
    ctx: RequestContext, replicas: list[int], current: list[int], allow_rf_change: bool
) -> None:
    """Kafka's validation of a manual partition assignment (ReplicationControlManager's messages)."""
    if not replicas:
        raise _Invalid(
            ErrorCode.invalid_replica_assignment,
            "The manual partition assignment includes an empty replica list.",
        )
    cluster = ctx.broker.cluster
    registered = {ctx.broker.node_id} if cluster is None else set(cluster.live_brokers)
    seen: set[int] = set()
    for broker in sorted(replicas):
        if broker not in registered:
            raise _Invalid(
                ErrorCode.invalid_replica_assignment,
                f"The manual partition assignment includes broker {broker}, but no such broker is registered.",
            )
        if broker in seen:
            raise _Invalid(
                ErrorCode.invalid_replica_assignment,
                f"The manual partition assignment includes the broker {broker} more than once.",
            )
        seen.add(broker)
    if not allow_rf_change and len(replicas) != len(current):
        raise _Invalid(
            ErrorCode.invalid_replication_factor,
            f"The replication factor is changed from {len(current)} to {len(replicas)} "
            "but allowReplicationFactorChange is false",
        )


async def _submit(ctx: RequestContext, requests: list[znodes.PartitionReplicas], timeout_s: float) -> Outcome:
    """Write /admin/reassign_partitions (after any earlier request is consumed) and wait for the
    controller to take it."""
    cluster = ctx.broker.cluster
    assert cluster is not None
    zk = cluster.zk
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    timed_out: Outcome = (
        ErrorCode.request_timed_out,
        f"The controller did not start the reassignment within {int(timeout_s * 1000)} ms",
    )
    data = znodes.encode_reassignment(requests)
    try:
        while True:
            try:
                await zk.create(znodes.REASSIGN_PARTITIONS, data, makepath=True)
                break
            except NodeExistsError:
                if loop.time() >= deadline:
                    return timed_out
                await asyncio.sleep(_POLL_S)
        while await zk.exists(znodes.REASSIGN_PARTITIONS) is not None:
            if loop.time() >= deadline:
                return timed_out
            await asyncio.sleep(_POLL_S)
    except KazooException as e:
        return ErrorCode.request_timed_out, f"ZooKeeper: {e!r}"
    return ErrorCode.none, None


async def _started(ctx: RequestContext, request: znodes.PartitionReplicas) -> Outcome:
    """The answer for a partition whose request the controller consumed: started (or done) when its
    topic znode's target replicas are the ones asked for."""
    try:
        znode = await _topic_znode(ctx, request.topic)
    except KazooException as e:
        return ErrorCode.request_timed_out, f"ZooKeeper: {e!r}"
    except (ValueError, KeyError, TypeError, AttributeError):
        znode = None
    current = znode.partitions.get(request.partition) if znode is not None else None
    if znode is None or current is None:
        return (
            ErrorCode.unknown_topic_or_partition,
            f"Unable to find partition {request.topic}:{request.partition}.",
        )
    removing = znode.removing_replicas.get(request.partition, [])
    if [b for b in current if b not in removing] == request.replicas:
        return ErrorCode.none, None
    return (
        ErrorCode.unknown_server_error,
        f"The controller did not start the reassignment of {request.topic}:{request.partition} "
        f"to {request.replicas}; its replicas are {current}",
    )


async def _decide(
    ctx: RequestContext, topic: str, partition: int, replicas: list[int] | None, allow_rf_change: bool
) -> tuple[Outcome | None, list[int] | None]:
    """Either the partition's answer, or the replicas to ask the controller for."""
    state = ctx.broker.control_plane.image.topic(topic)
    if state is None:
        return (ErrorCode.unknown_topic_or_partition, f"Unable to find a topic named {topic}."), None
    p = next((s for s in state.partitions if s.partition == partition), None)
    if p is None:
        return (ErrorCode.unknown_topic_or_partition, f"Unable to find partition {topic}:{partition}."), None
    znode = await _topic_znode(ctx, topic)
    adding = znode.adding_replicas.get(partition, []) if znode is not None else []
    removing = znode.removing_replicas.get(partition, []) if znode is not None else []
    current = znode.partitions.get(partition, p.replicas) if znode is not None else p.replicas
    original = [b for b in current if b not in adding]
    in_progress = bool(adding or removing)
    if replicas is None:
        if not in_progress:
            return (ErrorCode.no_reassignment_in_progress, NO_REASSIGNMENT_MESSAGE), None
        return None, original
    try:
        _validate_target(ctx, replicas, original, allow_rf_change)
    except _Invalid as e:
        return (e.error, e.message), None
    if not in_progress and replicas == current:
        return (ErrorCode.none, None), None  # already so: nothing to move
    if ctx.broker.cluster is None:
        return (ErrorCode.none, None), None  # a single node's only possible assignment is its own
    return None, replicas


async def handle_alter_partition_reassignments(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    allow_rf_change = bool(getattr(request, "allow_replication_factor_change", True))
    outcomes: dict[tuple[str, int], Outcome] = {}
    to_submit: list[znodes.PartitionReplicas] = []
    for t in request.topics:
        for p in t.partitions:
            key = (t.name, int(p.partition_index))
            target = None if p.replicas is None else [int(b) for b in p.replicas]
            decided, replicas = await _decide(ctx, t.name, key[1], target, allow_rf_change)
            if decided is not None:
                outcomes[key] = decided
            elif replicas is not None:
                to_submit.append(znodes.PartitionReplicas(t.name, key[1], replicas))
    if to_submit:
        submitted = await _submit(ctx, to_submit, max(0.0, to_ms(request.timeout) / 1000))
        for request_ in to_submit:
            key = (request_.topic, request_.partition)
            outcomes[key] = await _started(ctx, request_) if submitted[0] == ErrorCode.none else submitted
    responses = tuple(
        build(
            r.ReassignableTopicResponse,
            name=t.name,
            partitions=tuple(
                build(
                    r.ReassignablePartitionResponse,
                    partition_index=p.partition_index,
                    error_code=outcomes[(t.name, int(p.partition_index))][0],
                    error_message=outcomes[(t.name, int(p.partition_index))][1],
                )
                for p in t.partitions
            ),
        )
        for t in request.topics
    )
    return build(
        r.AlterPartitionReassignmentsResponse,
        throttle_time=ZERO_THROTTLE,
        allow_replication_factor_change=allow_rf_change,
        error_code=ErrorCode.none,
        error_message=None,
        responses=responses,
    )


async def handle_list_partition_reassignments(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    cluster = ctx.broker.cluster
    topics: list[Any] = []
    if cluster is not None:
        try:
            wanted: dict[str, set[int] | None]
            if request.topics is None:
                names = sorted(await cluster.zk.get_children(znodes.TOPICS))
                wanted = dict.fromkeys(names)
            else:
                wanted = {t.name: {int(p) for p in t.partition_indexes} for t in request.topics}
            for name, partitions in wanted.items():
                if not legal_topic_name(name):
                    continue  # never joined into a znode path: ".." would read /brokers
                znode = await _topic_znode(ctx, name)
                if znode is None:
                    continue  # as Kafka: an unknown topic is simply not being reassigned
                moving = sorted(set(znode.adding_replicas) | set(znode.removing_replicas))
                entries = tuple(
                    build(
                        r.OngoingPartitionReassignment,
                        partition_index=p,
                        replicas=tuple(znode.partitions.get(p, [])),
                        adding_replicas=tuple(znode.adding_replicas.get(p, [])),
                        removing_replicas=tuple(znode.removing_replicas.get(p, [])),
                    )
                    for p in moving
                    if partitions is None or p in partitions
                )
                if entries:
                    topics.append(build(r.OngoingTopicReassignment, name=name, partitions=entries))
        except KazooException as e:
            return build(
                r.ListPartitionReassignmentsResponse,
                throttle_time=ZERO_THROTTLE,
                error_code=ErrorCode.request_timed_out,
                error_message=f"ZooKeeper: {e!r}",
                topics=(),
            )
    return build(
        r.ListPartitionReassignmentsResponse,
        throttle_time=ZERO_THROTTLE,
        error_code=ErrorCode.none,
        error_message=None,
        topics=tuple(topics),
    )
