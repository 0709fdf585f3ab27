"""ElectLeaders (43): move leadership back to each partition's preferred replica.

Any broker answers (Kafka forwards to its controller). The broker decides from its metadata image
what needs no election (ELECTION_NOT_NEEDED), what cannot have one (PREFERRED_LEADER_NOT_AVAILABLE:
the preferred replica is not live or not in the ISR) and what is unknown, and has the control
plane elect the rest (within the request's timeout; ZkControlPlane.elect_preferred_leaders). With null partitions every partition is elected and, as Kafka,
those that needed no election are left out of the answer.

UNCLEAN elections: a partition with a leader needs none (ELECTION_NOT_NEEDED, as Kafka); Strom's
controller elects an out-of-ISR leader only under the topic's unclean.leader.election.enable, so a
leaderless partition answers INVALID_REQUEST.
"""

from __future__ import annotations

from typing import Any

from strom.broker.control_plane.plane import PREFERRED_NOT_AVAILABLE_MESSAGE, Outcome
from strom.broker.dispatcher import RequestContext
from strom.broker.handlers.partition_view import partition_view
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import ZERO_THROTTLE, build, to_ms

PREFERRED = 0
UNCLEAN = 1

ELECTION_NOT_NEEDED_MESSAGE = "Leader election not needed for topic partition."
UNCLEAN_REFUSED_MESSAGE = (
    "Strom elects an unclean leader only under the topic's unclean.leader.election.enable"
)


def _decide(ctx: RequestContext, topic: str, partition: int, election_type: int) -> Outcome | None:
    """The answer known without an election, or None when the controller has to elect."""
    image = ctx.broker.control_plane.image
    state = image.topic(topic)
    if state is None:
        return ErrorCode.unknown_topic_or_partition, f"No such topic as {topic}"
    p = next((s for s in state.partitions if s.partition == partition), None)
    if p is None:
        return ErrorCode.unknown_topic_or_partition, f"No such partition as {topic}-{partition}"
    plane = ctx.broker.control_plane
    live = set(plane.live_broker_ids)
    leader = partition_view(ctx.broker.replica_manager, plane, topic, p).leader
    has_leader = leader >= 0 and leader in live
    if election_type == UNCLEAN:
        if has_leader:
            return ErrorCode.election_not_needed, ELECTION_NOT_NEEDED_MESSAGE
        return ErrorCode.invalid_request, UNCLEAN_REFUSED_MESSAGE
    if not p.replicas:
        return ErrorCode.preferred_leader_not_available, PREFERRED_NOT_AVAILABLE_MESSAGE
    preferred = p.replicas[0]
    if has_leader and leader == preferred:
        return ErrorCode.election_not_needed, ELECTION_NOT_NEEDED_MESSAGE
    if preferred not in live or preferred not in p.isr:
        return ErrorCode.preferred_leader_not_available, PREFERRED_NOT_AVAILABLE_MESSAGE
    return None


def _all_partitions(ctx: RequestContext) -> list[tuple[str, int]]:
    image = ctx.broker.control_plane.image
    return sorted((t.name, p.partition) for t in image.topics() for p in t.partitions)


async def handle_elect_leaders(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    election_type = int(getattr(request, "election_type", PREFERRED))  # v0 knows only preferred
    if election_type not in (PREFERRED, UNCLEAN):
        return build(
            r.ElectLeadersResponse,
            throttle_time=ZERO_THROTTLE,
            error_code=ErrorCode.invalid_request,
            replica_election_results=(),
        )
    every = request.topic_partitions is None
    wanted: list[tuple[str, int]] = (
        _all_partitions(ctx)
        if every
        else list(dict.fromkeys((t.topic, int(p)) for t in request.topic_partitions for p in t.partitions))
    )
    outcomes: dict[tuple[str, int], Outcome] = {}
    to_elect: list[tuple[str, int]] = []
    for topic, partition in wanted:
        decided = _decide(ctx, topic, partition, election_type)
        if decided is None:
            to_elect.append((topic, partition))
        else:
            outcomes[(topic, partition)] = decided
    if to_elect:
        outcomes.update(
            await ctx.broker.control_plane.elect_preferred_leaders(
                to_elect, max(0.0, to_ms(request.timeout) / 1000)
            )
        )
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition), (error, message) in outcomes.items():
        if every and error == ErrorCode.election_not_needed:
            continue  # as Kafka: electing every partition reports only those that needed it
        by_topic.setdefault(topic, []).append(
            build(r.PartitionResult, partition_id=partition, error_code=error, error_message=message)
        )
    results = tuple(
        build(
            r.ReplicaElectionResult,
            topic=topic,
            partition_result=tuple(sorted(ps, key=lambda p: p.partition_id)),
        )
        for topic, ps in sorted(by_topic.items())
    )
    return build(
        r.ElectLeadersResponse,
        throttle_time=ZERO_THROTTLE,
        error_code=ErrorCode.none,
        replica_election_results=results,
    )
