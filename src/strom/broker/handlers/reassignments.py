"""AlterPartitionReassignments (45) and ListPartitionReassignments (46).

Any broker answers (Kafka forwards to its controller). A reassignment is validated as Kafka's
controller validates a manual assignment, then handed to the control plane, which has the
controller start it (KIP-455's adding and removing replicas) within the request's timeout and
answers each partition (ZkControlPlane.reassign). A cancellation (null replicas) asks for the
partition's original replicas (those it had before the reassignment began: the current replicas
without the adding ones). On a single node no reassignment can be in progress and only this
broker can hold a replica.
"""

from __future__ import annotations

from typing import Any

from strom.broker.control_plane.plane import Outcome, ZooKeeperUnavailableError
from strom.broker.dispatcher import RequestContext
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import ZERO_THROTTLE, build, to_ms

NO_REASSIGNMENT_MESSAGE = "No partition reassignment is in progress."


class _Invalid(Exception):
    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message


def _validate_target(
    ctx: RequestContext, replicas: list[int], current: list[int], allow_rf_change: bool
) -> None:
    """Kafka's validation of a manual partition assignment (ReplicationControlManager's messages)."""
    if not replicas:
        raise _Invalid(
            ErrorCode.invalid_replica_assignment,
            "The manual partition assignment includes an empty replica list.",
        )
    registered = set(ctx.broker.control_plane.live_broker_ids)
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


async def _decide(
    ctx: RequestContext, topic: str, partition: int, replicas: list[int] | None, allow_rf_change: bool
) -> tuple[Outcome | None, list[int] | None]:
    """Either the partition's answer, or the replicas to ask the controller for."""
    plane = ctx.broker.control_plane
    state = plane.image.topic(topic)
    if state is None:
        return (ErrorCode.unknown_topic_or_partition, f"Unable to find a topic named {topic}."), None
    try:
        current = await plane.reassignment(topic, partition)
    except ZooKeeperUnavailableError as e:
        return (ErrorCode.request_timed_out, str(e)), None
    if current is None:
        return (ErrorCode.unknown_topic_or_partition, f"Unable to find partition {topic}:{partition}."), None
    if replicas is None:
        if not current.in_progress:
            return (ErrorCode.no_reassignment_in_progress, NO_REASSIGNMENT_MESSAGE), None
        return None, current.original
    try:
        _validate_target(ctx, replicas, current.original, allow_rf_change)
    except _Invalid as e:
        return (e.error, e.message), None
    if not current.in_progress and replicas == current.replicas:
        return (ErrorCode.none, None), None  # already so: nothing to move
    return None, replicas


async def handle_alter_partition_reassignments(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    allow_rf_change = bool(getattr(request, "allow_replication_factor_change", True))
    outcomes: dict[tuple[str, int], Outcome] = {}
    to_submit: list[tuple[str, int, list[int]]] = []
    for t in request.topics:
        for p in t.partitions:
            key = (t.name, int(p.partition_index))
            target = None if p.replicas is None else [int(b) for b in p.replicas]
            decided, replicas = await _decide(ctx, t.name, key[1], target, allow_rf_change)
            if decided is not None:
                outcomes[key] = decided
            elif replicas is not None:
                to_submit.append((t.name, key[1], replicas))
    if to_submit:
        timeout_s = max(0.0, to_ms(request.timeout) / 1000)
        outcomes.update(await ctx.broker.control_plane.reassign(to_submit, timeout_s))
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
    wanted = (
        None
        if request.topics is None
        else {t.name: {int(p) for p in t.partition_indexes} for t in request.topics}
    )
    try:
        ongoing = await ctx.broker.control_plane.reassignments(wanted)
    except ZooKeeperUnavailableError as e:
        return build(
            r.ListPartitionReassignmentsResponse,
            throttle_time=ZERO_THROTTLE,
            error_code=ErrorCode.request_timed_out,
            error_message=str(e),
            topics=(),
        )
    by_topic: dict[str, list[Any]] = {}
    for topic, partition, reassignment in ongoing:
        by_topic.setdefault(topic, []).append(
            build(
                r.OngoingPartitionReassignment,
                partition_index=partition,
                replicas=tuple(reassignment.replicas),
                adding_replicas=tuple(reassignment.adding),
                removing_replicas=tuple(reassignment.removing),
            )
        )
    return build(
        r.ListPartitionReassignmentsResponse,
        throttle_time=ZERO_THROTTLE,
        error_code=ErrorCode.none,
        error_message=None,
        topics=tuple(
            build(r.OngoingTopicReassignment, name=t, partitions=tuple(ps)) for t, ps in by_topic.items()
        ),
    )
