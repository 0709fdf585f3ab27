"""Classic group membership and group admin: JoinGroup (11), Heartbeat (12), LeaveGroup (13),
SyncGroup (14), DescribeGroups (15), ListGroups (16) and DeleteGroups (42).

The handlers translate between each API version's layout and the group coordinator;
JoinGroup and SyncGroup wait (without blocking other connections) until the
coordinator completes the rebalance step they take part in.
"""

from __future__ import annotations

from typing import Any

from strom.broker.coordinator.group import ClassicGroup, GroupState
from strom.broker.coordinator.group_coordinator import CLASSIC_GROUP_TYPE, JoinRequest
from strom.broker.dispatcher import RequestContext
from strom.broker.slices import ArrayBuilder, sliced
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import AUTHORIZED_OPERATIONS_OMITTED, build, to_ms


def client_host(ctx: RequestContext) -> str:
    """Kafka's form of the client address: ``/<ip>``."""
    return "/" + ctx.connection.peer.rpartition(":")[0]


async def handle_join_group(ctx: RequestContext, request: Any) -> Any:
    session_timeout = to_ms(request.session_timeout)
    rebalance_timeout = to_ms(getattr(request, "rebalance_timeout", request.session_timeout))
    await ctx.broker.prepare_offsets_topic()  # off the event loop, on first use
    result = await ctx.broker.group_coordinator.join_group(
        JoinRequest(
            group_id=request.group_id,
            member_id=request.member_id,
            group_instance_id=getattr(request, "group_instance_id", None),
            client_id=ctx.header.client_id or "",
            client_host=client_host(ctx),
            session_timeout_ms=session_timeout,
            # v0 has no rebalance timeout: the session timeout bounds the rebalance.
            rebalance_timeout_ms=rebalance_timeout if rebalance_timeout >= 0 else session_timeout,
            protocol_type=request.protocol_type,
            protocols=[(p.name, p.metadata) for p in request.protocols],
            require_known_member_id=ctx.version >= 4,
            supports_skip_assignment=ctx.version >= 9,
        )
    )
    r = ctx.response
    nullable_protocol = ctx.version >= 7
    return build(
        r.JoinGroupResponse,
        error_code=result.error,
        generation_id=result.generation_id,
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name if nullable_protocol else result.protocol_name or "",
        leader=result.leader_id,
        skip_assignment=result.skip_assignment,
        member_id=result.member_id,
        members=tuple(
            build(
                r.JoinGroupResponseMember,
                member_id=member_id,
                group_instance_id=instance_id,
                metadata=metadata,
            )
            for member_id, instance_id, metadata in result.members
        ),
    )


async def handle_sync_group(ctx: RequestContext, request: Any) -> Any:
    result = await ctx.broker.group_coordinator.sync_group(
        request.group_id,
        request.generation_id,
        request.member_id,
        getattr(request, "group_instance_id", None),
        getattr(request, "protocol_type", None),
        getattr(request, "protocol_name", None),
        {a.member_id: a.assignment for a in request.assignments},
    )
    return build(
        ctx.response.SyncGroupResponse,
        error_code=result.error,
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name,
        assignment=result.assignment,
    )


async def handle_heartbeat(ctx: RequestContext, request: Any) -> Any:
    error = ctx.broker.group_coordinator.heartbeat(
        request.group_id,
        request.generation_id,
        request.member_id,
        getattr(request, "group_instance_id", None),
    )
    return build(ctx.response.HeartbeatResponse, error_code=error)


async def handle_leave_group(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    coordinator = ctx.broker.group_coordinator
    if not hasattr(request, "members"):  # v0-v2: one member, one top-level error
        error, errors = await coordinator.leave_group(request.group_id, [(request.member_id, None)])
        return build(r.LeaveGroupResponse, error_code=errors[0] if error == ErrorCode.none else error)
    identities = [(m.member_id, m.group_instance_id) for m in request.members]
    error, errors = await coordinator.leave_group(request.group_id, identities)
    return build(
        r.LeaveGroupResponse,
        error_code=error,
        members=tuple(
            build(
                r.MemberResponse, member_id=member_id, group_instance_id=instance_id, error_code=member_error
            )
            for (member_id, instance_id), member_error in zip(identities, errors, strict=False)
        ),
    )


def _described_group(ctx: RequestContext, group_id: str, group: ClassicGroup | None) -> Any:
    r = ctx.response
    if not group_id:
        return build(
            r.DescribedGroup,
            error_code=ErrorCode.invalid_group_id,
            group_id=group_id,
            group_state="",
            protocol_type="",
            protocol_data="",
            members=(),
            authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
        )
    not_coordinator = ctx.broker.group_coordinator.coordinator_error(group_id)
    if not_coordinator != ErrorCode.none:
        return build(
            r.DescribedGroup,
            error_code=not_coordinator,
            group_id=group_id,
            group_state="",
            protocol_type="",
            protocol_data="",
            members=(),
            authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
        )
    if group is None:
        # v6 reports the missing group; older versions describe it as Dead.
        error = ErrorCode.group_id_not_found if ctx.version >= 6 else ErrorCode.none
        return build(
            r.DescribedGroup,
            error_code=error,
            error_message=f"Group {group_id} not found." if error != ErrorCode.none else None,
            group_id=group_id,
            group_state=GroupState.DEAD.value,
            protocol_type="",
            protocol_data="",
            members=(),
            authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
        )
    stable = group.is_(GroupState.STABLE)
    members = tuple(
        build(
            r.DescribedGroupMember,
            member_id=m.member_id,
            group_instance_id=m.group_instance_id,
            client_id=m.client_id,
            client_host=m.client_host,
            # Metadata and assignment are meaningful only once the generation is settled.
            member_metadata=m.metadata_for(group.protocol_name) if stable and group.protocol_name else b"",
            member_assignment=m.assignment if stable else b"",
        )
        for m in group.members.values()
    )
    return build(
        r.DescribedGroup,
        error_code=ErrorCode.none,
        group_id=group_id,
        group_state=group.state.value,
        protocol_type=group.protocol_type or "",
        # Kafka names the protocol only for a settled (Stable) generation.
        protocol_data=group.protocol_name or "" if stable else "",
        members=members,
        authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
    )


async def handle_describe_groups(ctx: RequestContext, request: Any) -> Any:
    # Kafka bounds the groups of one request only by its size: a request of a million names
    # is answered a slice at a time, other clients served in between.
    coordinator = ctx.broker.group_coordinator
    groups = ArrayBuilder(ctx.response.DescribedGroup)
    async for group_id in sliced(request.groups):
        await groups.add(_described_group(ctx, group_id, coordinator.group(group_id)))
    return build(ctx.response.DescribeGroupsResponse, groups=groups.value())


async def handle_list_groups(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    states = set(getattr(request, "states_filter", ()) or ())
    types = set(getattr(request, "types_filter", ()) or ())
    coordinator = ctx.broker.group_coordinator
    groups = coordinator.list_groups(states, types)
    return build(
        r.ListGroupsResponse,
        # As Kafka: the groups loaded so far, and the error while an offsets partition loads.
        error_code=ErrorCode.coordinator_load_in_progress if coordinator.loading else ErrorCode.none,
        groups=tuple(
            build(
                r.ListedGroup,
                group_id=g.group_id,
                protocol_type=g.protocol_type or "",
                group_state=g.state.value,
                group_type=CLASSIC_GROUP_TYPE,
            )
            for g in groups
        ),
    )


async def handle_delete_groups(ctx: RequestContext, request: Any) -> Any:
    r = ctx.response
    results = await ctx.broker.group_coordinator.delete_groups(list(request.groups_names))
    return build(
        r.DeleteGroupsResponse,
        results=tuple(
            build(r.DeletableGroupResult, group_id=group_id, error_code=results[group_id])
            for group_id in request.groups_names
        ),
    )
