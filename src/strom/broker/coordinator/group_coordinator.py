"""The group coordinator for classic consumer groups (Kafka's GroupCoordinator).

Membership follows the classic rebalance protocol. A JoinGroup moves the group to
PreparingRebalance; the join completes when every known member has rejoined (or the
longest rebalance timeout passes, dropping the members that did not), which starts a
new generation in CompletingRebalance and hands the leader every member's metadata.
The leader's SyncGroup carries the assignment; storing it in ``__consumer_offsets``
makes the group Stable and answers every member's SyncGroup. Heartbeats keep a
member alive for ``session.timeout.ms``; a member that misses it is removed and the
group rebalances.

Static members (KIP-345) are keyed by ``group.instance.id``: a restart within the
session timeout replaces the member id without a rebalance, and the old instance
is fenced. Everything runs on the event loop; waiting requests hold futures that
the state machine completes, and the timers are the loop's own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from strom.broker.coordinator.group import (
    ClassicGroup,
    GroupState,
    JoinResult,
    MemberMetadata,
    OffsetAndMetadata,
    SyncResult,
)
from strom.broker.coordinator.group_metadata_manager import (
    OFFSETS_TOPIC,
    GroupMetadataManager,
    TransactionalProducer,
)
from strom.broker.detached import DetachedTasks
from strom.broker.partition import TopicPartition
from strom.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

UNKNOWN_MEMBER_ID = ""
CLASSIC_GROUP_TYPE = "classic"


@dataclass(frozen=True, slots=True)
class GroupConfig:
    min_session_timeout_ms: int
    max_session_timeout_ms: int
    initial_rebalance_delay_ms: int
    max_size: int
    offsets_retention_ms: int
    offset_metadata_max_bytes: int


@dataclass(frozen=True, slots=True)
class JoinRequest:
    group_id: str
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    require_known_member_id: bool  # JoinGroup v4+: a new dynamic member first gets MEMBER_ID_REQUIRED
    supports_skip_assignment: bool  # JoinGroup v9+ (KIP-814)


class GroupCoordinator:
    def __init__(
        self,
        config: GroupConfig,
        manager: GroupMetadataManager,
        ensure_offsets_topic: Callable[[], None],
        time_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        *,
        follows_leadership: bool = False,
    ) -> None:
        self.config = config
        self._manager = manager
        self._ensure_offsets_topic = ensure_offsets_topic
        self._time_ms = time_ms
        self._groups: dict[str, ClassicGroup] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        # In a cluster the coordinator owns only the groups of the offsets partitions this broker
        # leads (Kafka's GroupCoordinator.onElection/onResignation); a single node owns them all.
        self._follows_leadership = follows_leadership
        self._owned: set[int] = set()
        # Offsets partitions being loaded (off the loop): partition -> the leader epoch the load
        # started in. Their groups answer COORDINATOR_LOAD_IN_PROGRESS until the load is adopted.
        self._loading: dict[int, int] = {}
        self._load_tasks: set[asyncio.Task[None]] = set()
        # A member's write and what follows from it run to their end even if its client goes
        # away meanwhile: committed records are applied, an assignment reaches the waiting members.
        self._writes = DetachedTasks(log)
        self._stopped = False

    # --- lifecycle -----------------------------------------------------------------------

    def startup(self) -> None:
        """Load every group and offset; members of loaded groups must heartbeat within their timeout.
        In a cluster nothing is loaded here: each partition's groups load when this broker becomes
        its leader (``on_become_leader``)."""
        self._loop = asyncio.get_running_loop()
        if not self._follows_leadership:
            self._adopt(self._manager.load())

    def _adopt(self, groups: dict[str, ClassicGroup]) -> None:
        for group in groups.values():
            self._groups[group.group_id] = group
            for member in group.members.values():
                self._schedule_heartbeat_expiration(group, member)

    def shutdown(self) -> None:
        self._stopped = True
        self._writes.cancel_all()
        self._loading.clear()
        for task in self._load_tasks:
            task.cancel()
        self._manager.loader.shutdown()
        for group in self._groups.values():
            group.cancel_timers()

    # --- leadership of the offsets topic's partitions (a cluster) --------------------------

    def on_become_leader(self, tp: TopicPartition, leader_epoch: int) -> None:
        """This broker now leads ``tp``: if it is an offsets partition, load its groups off the
        loop and coordinate them once loaded (Kafka's scheduleLoadGroupAndOffsets)."""
        if (
            not self._follows_leadership
            or self._stopped
            or tp.topic != OFFSETS_TOPIC
            or tp.partition in self._owned
            or tp.partition in self._loading
        ):
            return
        self._loading[tp.partition] = leader_epoch
        task = self.loop.create_task(self._load(tp.partition, leader_epoch))
        self._load_tasks.add(task)
        task.add_done_callback(self._load_tasks.discard)

    def _load_is_current(self, partition: int, leader_epoch: int) -> bool:
        """The load of ``partition`` started in ``leader_epoch`` is still the one expected: no
        resignation (and no new leadership after one) since it started."""
        return self._loading.get(partition) == leader_epoch

    async def _load(self, partition: int, leader_epoch: int) -> None:
        def is_current() -> bool:
            return self._load_is_current(partition, leader_epoch)

        try:
            groups = await self._manager.load_partition(partition, is_current)
        except Exception:
            # Not owned: its groups answer NOT_COORDINATOR rather than look empty.
            log.exception("loading an offsets partition failed", extra={"partition": partition})
            if is_current():
                del self._loading[partition]
            return
        if groups is None or not is_current():
            log.info(
                "discarded a stale load of an offsets partition",
                extra={"partition": partition, "leader_epoch": leader_epoch},
            )
            return
        del self._loading[partition]
        self._owned.add(partition)
        self._adopt(groups)
        log.info(
            "coordinating the groups of an offsets partition",
            extra={"partition": partition, "leader_epoch": leader_epoch, "groups": len(groups)},
        )

    def on_become_follower(self, tp: TopicPartition) -> None:
        """This broker no longer leads ``tp``: unload its groups. Their members' waiting requests
        answer NOT_COORDINATOR; the clients find the new coordinator and rejoin there."""
        if not self._follows_leadership or tp.topic != OFFSETS_TOPIC:
            return
        self._loading.pop(tp.partition, None)  # a load in progress is stale now
        if tp.partition not in self._owned:
            return
        self._owned.discard(tp.partition)
        unloaded = 0
        for group in [g for g in self._groups.values() if self._partition_of(g.group_id) == tp.partition]:
            self._unload(group)
            unloaded += 1
        log.info(
            "stopped coordinating an offsets partition", extra={"partition": tp.partition, "groups": unloaded}
        )

    def _unload(self, group: ClassicGroup) -> None:
        group.cancel_timers()
        for member in group.members.values():
            if member.join_future is not None and not member.join_future.done():
                member.join_future.set_result(
                    JoinResult(ErrorCode.not_coordinator, member_id=member.member_id)
                )
            if member.sync_future is not None and not member.sync_future.done():
                member.sync_future.set_result(SyncResult(ErrorCode.not_coordinator))
        group.transition_to(GroupState.DEAD, self._time_ms())
        del self._groups[group.group_id]

    def _partition_of(self, group_id: str) -> int:
        return self._manager.partition_of(group_id).partition

    def coordinator_error(self, group_id: str) -> ErrorCode:
        """NOT_COORDINATOR for a group this broker does not coordinate (in a cluster: the group's
        offsets partition is led elsewhere), COORDINATOR_LOAD_IN_PROGRESS while its partition
        loads, else NONE."""
        if self._follows_leadership:
            partition = self._partition_of(group_id)
            if partition in self._loading:
                return ErrorCode.coordinator_load_in_progress
            if partition not in self._owned:
                return ErrorCode.not_coordinator
        return ErrorCode.none

    @property
    def loading(self) -> bool:
        """An offsets partition is loading (ListGroups then answers COORDINATOR_LOAD_IN_PROGRESS)."""
        return bool(self._loading)

    def _is_current(self, group: ClassicGroup) -> bool:
        """``group`` is still the coordinator's (not unloaded, deleted or replaced meanwhile)."""
        return self._groups.get(group.group_id) is group and not group.is_(GroupState.DEAD)

    def _gone_error(
        self, group_id: str, otherwise: ErrorCode = ErrorCode.coordinator_not_available
    ) -> ErrorCode:
        """The answer for a group that went away while a request waited: NOT_COORDINATOR once
        another broker coordinates it, else ``otherwise`` (by default COORDINATOR_NOT_AVAILABLE:
        the client retries and meets a fresh group)."""
        error = self.coordinator_error(group_id)
        return error if error != ErrorCode.none else otherwise

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "the group coordinator has not started"
        return self._loop

    # --- JoinGroup -----------------------------------------------------------------------

    async def join_group(self, req: JoinRequest) -> JoinResult:
        if not req.group_id:
            return JoinResult(ErrorCode.invalid_group_id, member_id=req.member_id)
        if (
            not self.config.min_session_timeout_ms
            <= req.session_timeout_ms
            <= self.config.max_session_timeout_ms
        ):
            return JoinResult(ErrorCode.invalid_session_timeout, member_id=req.member_id)
        if (error := self.coordinator_error(req.group_id)) != ErrorCode.none:
            return JoinResult(error, member_id=req.member_id)
        self._ensure_offsets_topic()
        group = self._groups.get(req.group_id)
        is_unknown_member = req.member_id == UNKNOWN_MEMBER_ID
        created = False
        if group is None:
            if not is_unknown_member:
                return JoinResult(ErrorCode.unknown_member_id, member_id=req.member_id)
            group = self._groups[req.group_id] = ClassicGroup(req.group_id, self._time_ms())
            created = True
        if group.is_(GroupState.DEAD):
            # Deleted concurrently: the client retries and meets a fresh group.
            return JoinResult(ErrorCode.coordinator_not_available, member_id=req.member_id)
        if not group.supports_protocols(req.protocol_type, [name for name, _ in req.protocols]):
            result = JoinResult(ErrorCode.inconsistent_group_protocol, member_id=req.member_id)
        elif not self._accepts_joining_member(group, req.member_id):
            member = group.members.get(req.member_id)
            if member is not None:
                # Over group.max.size (e.g. after it was lowered): the last members to rejoin leave.
                self._remove_member_and_update_group(group, member)
            result = JoinResult(ErrorCode.group_max_size_reached, member_id=req.member_id)
        elif is_unknown_member:
            return await self._join_unknown_member(group, req)
        else:
            return await self._join_known_member(group, req)
        if created:
            del self._groups[req.group_id]
        return result

    def _accepts_joining_member(self, group: ClassicGroup, member_id: str) -> bool:
        """group.max.size, counted as Kafka counts it in each state."""
        if group.state in (GroupState.EMPTY, GroupState.DEAD):
            return True
        member = group.members.get(member_id)
        if group.is_(GroupState.PREPARING_REBALANCE):
            # Counting members already rejoined lets the last ones to rejoin be turned away.
            awaiting = sum(1 for m in group.members.values() if m.is_awaiting_join)
            return (member is not None and member.is_awaiting_join) or awaiting < self.config.max_size
        return member is not None or len(group.members) < self.config.max_size

    async def _join_unknown_member(self, group: ClassicGroup, req: JoinRequest) -> JoinResult:
        prefix = req.group_instance_id if req.group_instance_id is not None else req.client_id
        new_member_id = f"{prefix}-{uuid.uuid4()}"
        if req.group_instance_id is not None:
            old_member_id = group.static_member_id(req.group_instance_id)
            if old_member_id is not None:
                return await self._replace_static_member(group, old_member_id, new_member_id, req)
        elif req.require_known_member_id:
            # KIP-394: the member learns its id first, so a lost JoinGroup response leaves no ghost member.
            timer = self.loop.call_later(
                req.session_timeout_ms / 1000, self._expire_pending_member, group, new_member_id
            )
            group.pending_members[new_member_id] = timer
            return JoinResult(ErrorCode.member_id_required, member_id=new_member_id)
        return await self._add_member_and_rebalance(group, new_member_id, req)

    async def _join_known_member(self, group: ClassicGroup, req: JoinRequest) -> JoinResult:
        member_id = req.member_id
        if member_id in group.pending_members:
            group.pending_members.pop(member_id).cancel()
            return await self._add_member_and_rebalance(group, member_id, req)
        if group.is_static_member_fenced(member_id, req.group_instance_id):
            return JoinResult(ErrorCode.fenced_instance_id, member_id=member_id)
        member = group.members.get(member_id)
        if member is None or group.state in (GroupState.EMPTY, GroupState.DEAD):
            return JoinResult(ErrorCode.unknown_member_id, member_id=member_id)
        if group.is_(GroupState.PREPARING_REBALANCE):
            return await self._update_member_and_rebalance(group, member, req, "member rejoined")
        if group.is_(GroupState.COMPLETING_REBALANCE):
            if member.matches(req.protocols):
                # A repeated join (its response was lost): answer with the current generation.
                return self._current_join_result(group, member_id)
            return await self._update_member_and_rebalance(group, member, req, "member changed its metadata")
        # Stable
        if group.is_leader(member_id) or not member.matches(req.protocols):
            reason = "leader rejoined" if group.is_leader(member_id) else "member changed its metadata"
            return await self._update_member_and_rebalance(group, member, req, reason)
        return self._current_join_result(group, member_id, leader_gets_members=False)

    def _current_join_result(
        self, group: ClassicGroup, member_id: str, leader_gets_members: bool = True
    ) -> JoinResult:
        members = (
            group.current_member_metadata() if leader_gets_members and group.is_leader(member_id) else ()
        )
        return JoinResult(
            ErrorCode.none,
            generation_id=group.generation_id,
            protocol_type=group.protocol_type,
            protocol_name=group.protocol_name,
            leader_id=group.leader_id or "",
            member_id=member_id,
            members=members,
        )

    async def _add_member_and_rebalance(
        self, group: ClassicGroup, member_id: str, req: JoinRequest
    ) -> JoinResult:
        member = MemberMetadata(
            member_id=member_id,
            group_instance_id=req.group_instance_id,
            client_id=req.client_id,
            client_host=req.client_host,
            rebalance_timeout_ms=req.rebalance_timeout_ms,
            session_timeout_ms=req.session_timeout_ms,
            protocol_type=req.protocol_type,
            protocols=list(req.protocols),
        )
        future: asyncio.Future[JoinResult] = self.loop.create_future()
        member.join_future = future
        member.is_new = True
        group.add_member(member)
        if group.in_initial_delay:
            group.new_member_added = True
        self._maybe_prepare_rebalance(group, f"member {member_id} joined")
        self._maybe_complete_join(group)
        return await self._await_join(group, member, future)

    async def _update_member_and_rebalance(
        self, group: ClassicGroup, member: MemberMetadata, req: JoinRequest, reason: str
    ) -> JoinResult:
        self._update_member(member, req)
        if member.is_awaiting_join:
            assert member.join_future is not None
            member.join_future.set_result(
                JoinResult(ErrorCode.rebalance_in_progress, member_id=member.member_id)
            )
        future: asyncio.Future[JoinResult] = self.loop.create_future()
        member.join_future = future
        self._maybe_prepare_rebalance(group, reason)
        self._maybe_complete_join(group)
        return await self._await_join(group, member, future)

    @staticmethod
    def _update_member(member: MemberMetadata, req: JoinRequest) -> None:
        member.protocols = list(req.protocols)
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.session_timeout_ms = req.session_timeout_ms
        member.client_id = req.client_id
        member.client_host = req.client_host

    async def _replace_static_member(
        self, group: ClassicGroup, old_member_id: str, new_member_id: str, req: JoinRequest
    ) -> JoinResult:
        """A known group.instance.id joined with no member id: the instance restarted (KIP-345)."""
        assert req.group_instance_id is not None
        member = group.members[old_member_id]
        fenced_join, fenced_sync = member.join_future, member.sync_future
        member.join_future = member.sync_future = None
        if fenced_join is not None and not fenced_join.done():
            fenced_join.set_result(JoinResult(ErrorCode.fenced_instance_id, member_id=old_member_id))
        if fenced_sync is not None and not fenced_sync.done():
            fenced_sync.set_result(SyncResult(ErrorCode.fenced_instance_id))
        old_protocols = member.protocols
        group.replace_static_member(req.group_instance_id, old_member_id, new_member_id)
        self._update_member(member, req)
        log.info(
            "static member rejoined",
            extra={"group": group.group_id, "instance": req.group_instance_id, "member": new_member_id},
        )
        if group.is_(GroupState.STABLE) and group.select_protocol() == group.protocol_name:
            # Same protocol: keep the generation and the assignment; persist the new member id.
            async with group.write_lock:
                error = (
                    (await self._manager.store_group(group)).error
                    if self._is_current(group)
                    else self._gone_error(group.group_id)
                )
            if error != ErrorCode.none:
                if group.static_member_id(req.group_instance_id) == new_member_id:
                    group.replace_static_member(req.group_instance_id, new_member_id, old_member_id)
                    member.protocols = old_protocols
                return JoinResult(error, member_id=UNKNOWN_MEMBER_ID)
            self._schedule_heartbeat_expiration(group, member)
            if not req.supports_skip_assignment:
                # Before JoinGroup v9 a leader cannot be told to skip the assignment: name the old
                # leader id instead, so the restarted instance acts as a follower and nothing rebalances.
                result = self._current_join_result(group, new_member_id, leader_gets_members=False)
                if group.is_leader(new_member_id):
                    result = dataclasses.replace(result, leader_id=old_member_id)
                return result
            # KIP-814: the leader gets the members but keeps the current assignment.
            result = self._current_join_result(group, new_member_id)
            return dataclasses.replace(result, skip_assignment=group.is_leader(new_member_id))
        future: asyncio.Future[JoinResult] = self.loop.create_future()
        member.join_future = future
        self._maybe_prepare_rebalance(group, f"static member {req.group_instance_id} rejoined")
        self._maybe_complete_join(group)
        return await self._await_join(group, member, future)

    async def _await_join(
        self, group: ClassicGroup, member: MemberMetadata, future: asyncio.Future[JoinResult]
    ) -> JoinResult:
        try:
            return await future
        except asyncio.CancelledError:
            # The JoinGroup's connection closed while the rebalance waited: the member stopped
            # (Ctrl-C during a join), and no one will read the answer. A member that was never in a
            # generation leaves at once instead of holding the rebalance open for its whole timeout;
            # an existing one is now simply not rejoined, and its session timeout still applies.
            if group.members.get(member.member_id) is member and member.join_future is future:
                member.join_future = None
                if member.is_new:
                    log.info(
                        "removing new member whose join was abandoned",
                        extra={"group": group.group_id, "member": member.member_id},
                    )
                    self._remove_member_and_update_group(group, member)
                else:
                    self._schedule_heartbeat_expiration(group, member)
            raise

    def _expire_pending_member(self, group: ClassicGroup, member_id: str) -> None:
        if group.pending_members.pop(member_id, None) is not None:
            self._maybe_complete_join(group)

    # --- rebalancing ---------------------------------------------------------------------

    def _maybe_prepare_rebalance(self, group: ClassicGroup, reason: str) -> None:
        if group.can_transition_to(GroupState.PREPARING_REBALANCE):
            self._prepare_rebalance(group, reason)

    def _prepare_rebalance(self, group: ClassicGroup, reason: str) -> None:
        if group.is_(GroupState.COMPLETING_REBALANCE):
            self._propagate_sync_error(group, ErrorCode.rebalance_in_progress)
        if group.sync_timer is not None:
            group.sync_timer.cancel()
            group.sync_timer = None
        was_empty = group.is_(GroupState.EMPTY)
        group.transition_to(GroupState.PREPARING_REBALANCE, self._time_ms())
        rebalance_timeout = group.rebalance_timeout_ms()
        delay = min(self.config.initial_rebalance_delay_ms, rebalance_timeout)
        if was_empty and delay > 0:
            # Wait for more members of a starting group before the first generation.
            group.in_initial_delay = True
            group.new_member_added = False
            group.join_timer = self.loop.call_later(
                delay / 1000, self._on_initial_delay, group, rebalance_timeout - delay
            )
        else:
            group.join_timer = self.loop.call_later(rebalance_timeout / 1000, self._complete_join, group)
            # Everyone left may already have rejoined (or no one is left): complete now, so what the
            # join writes (e.g. the Empty group) is stored before the triggering request is answered.
            self._maybe_complete_join(group)
        log.info(
            "preparing to rebalance",
            extra={"group": group.group_id, "generation": group.generation_id, "reason": reason},
        )

    def _on_initial_delay(self, group: ClassicGroup, remaining_ms: int) -> None:
        if group.new_member_added and remaining_ms > 0:
            group.new_member_added = False
            delay = min(self.config.initial_rebalance_delay_ms, remaining_ms)
            group.join_timer = self.loop.call_later(
                delay / 1000, self._on_initial_delay, group, max(remaining_ms - delay, 0)
            )
            return
        group.in_initial_delay = False
        self._complete_join(group)

    def _maybe_complete_join(self, group: ClassicGroup) -> None:
        if (
            group.is_(GroupState.PREPARING_REBALANCE)
            and not group.in_initial_delay
            and group.has_all_members_joined()
        ):
            self._complete_join(group)

    def _complete_join(self, group: ClassicGroup) -> None:
        if not group.is_(GroupState.PREPARING_REBALANCE):
            return
        if group.join_timer is not None:
            group.join_timer.cancel()
            group.join_timer = None
        group.in_initial_delay = False
        for member in group.not_yet_rejoined_members():
            log.info(
                "removing member that did not rejoin",
                extra={"group": group.group_id, "member": member.member_id},
            )
            group.remove_member(member.member_id)
        group.init_next_generation(self._time_ms())
        if group.is_(GroupState.EMPTY):
            log.info("group is empty", extra={"group": group.group_id, "generation": group.generation_id})
            task = self.loop.create_task(self._store_empty_group(group, group.generation_id))
            group.background_writes.add(task)
            task.add_done_callback(group.background_writes.discard)
            return
        log.info(
            "new generation",
            extra={
                "group": group.group_id,
                "generation": group.generation_id,
                "protocol": group.protocol_name,
                "members": len(group.members),
            },
        )
        for member in group.members.values():
            future = member.join_future
            member.join_future = None
            member.is_new = False
            result = self._current_join_result(group, member.member_id)
            if future is not None and not future.done():
                future.set_result(result)
            self._schedule_heartbeat_expiration(group, member)
        generation = group.generation_id
        group.sync_timer = self.loop.call_later(
            group.rebalance_timeout_ms() / 1000, self._expire_pending_sync, group, generation
        )

    async def _store_empty_group(self, group: ClassicGroup, generation: int) -> None:
        """Record that ``group`` became Empty in ``generation`` (after the group's earlier writes).
        A failure only logs, as in Kafka: the members are gone and nobody waits for the answer."""
        async with group.write_lock:
            if not self._is_current(group) or not group.is_(GroupState.EMPTY):
                return  # unloaded, deleted, or members joined again: a later write records the group
            if group.generation_id != generation:
                return
            outcome = await self._manager.store_group(group)
        if outcome.error != ErrorCode.none:
            log.warning(
                "storing the empty group failed",
                extra={"group": group.group_id, "generation": generation, "error": outcome.error.name},
            )

    async def _settle(self, group: ClassicGroup) -> None:
        """Wait for the writes the coordinator started on its own for ``group`` (so a LeaveGroup
        is answered once the Empty group it caused is stored, as on a single node before)."""
        if group.background_writes:
            await asyncio.wait(set(group.background_writes))

    def _expire_pending_sync(self, group: ClassicGroup, generation: int) -> None:
        """Members of the generation that never sent SyncGroup are dropped, and the group rebalances."""
        group.sync_timer = None
        if group.generation_id != generation or not group.pending_sync_members:
            return
        if group.state not in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            return
        for member_id in list(group.pending_sync_members):
            log.info(
                "removing member that did not sync", extra={"group": group.group_id, "member": member_id}
            )
            group.remove_member(member_id)
        self._maybe_prepare_rebalance(group, "members did not sync in time")

    def _propagate_sync_error(self, group: ClassicGroup, error: ErrorCode) -> None:
        for member in group.members.values():
            member.assignment = b""
            if member.is_awaiting_sync:
                assert member.sync_future is not None
                member.sync_future.set_result(SyncResult(error))
            member.sync_future = None

    # --- heartbeats and session timeouts --------------------------------------------------

    def _schedule_heartbeat_expiration(self, group: ClassicGroup, member: MemberMetadata) -> None:
        member.cancel_heartbeat()
        member.heartbeat_timer = self.loop.call_later(
            member.session_timeout_ms / 1000, self._on_heartbeat_expired, group, member
        )

    def _on_heartbeat_expired(self, group: ClassicGroup, member: MemberMetadata) -> None:
        member.heartbeat_timer = None
        if group.members.get(member.member_id) is not member:
            return
        if member.is_awaiting_join or member.is_awaiting_sync:
            # A member blocked in JoinGroup or SyncGroup is alive by definition.
            self._schedule_heartbeat_expiration(group, member)
            return
        log.info(
            "member session expired",
            extra={
                "group": group.group_id,
                "member": member.member_id,
                "timeout_ms": member.session_timeout_ms,
            },
        )
        self._remove_member_and_update_group(group, member)

    def _remove_member_and_update_group(self, group: ClassicGroup, member: MemberMetadata) -> None:
        group.remove_member(member.member_id)
        join, sync = member.join_future, member.sync_future
        member.join_future = member.sync_future = None
        if join is not None and not join.done():
            join.set_result(JoinResult(ErrorCode.unknown_member_id, member_id=member.member_id))
        if sync is not None and not sync.done():
            sync.set_result(SyncResult(ErrorCode.unknown_member_id))
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance(group, f"member {member.member_id} left")
        elif group.is_(GroupState.PREPARING_REBALANCE):
            self._maybe_complete_join(group)

    def heartbeat(
        self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None
    ) -> ErrorCode:
        if (error := self.coordinator_error(group_id)) != ErrorCode.none:
            return error
        group = self._groups.get(group_id)
        if group is None:
            return ErrorCode.unknown_member_id
        if group.is_(GroupState.DEAD):
            return ErrorCode.coordinator_not_available
        if group.is_static_member_fenced(member_id, group_instance_id):
            return ErrorCode.fenced_instance_id
        member = group.members.get(member_id)
        if member is None or group.is_(GroupState.EMPTY):
            return ErrorCode.unknown_member_id
        if generation_id != group.generation_id:
            return ErrorCode.illegal_generation
        self._schedule_heartbeat_expiration(group, member)
        if group.is_(GroupState.PREPARING_REBALANCE):
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    # --- SyncGroup -----------------------------------------------------------------------

    async def sync_group(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: dict[str, bytes],
    ) -> SyncResult:
        if (error := self.coordinator_error(group_id)) != ErrorCode.none:
            return SyncResult(error)
        group = self._groups.get(group_id)
        if group is None:
            return SyncResult(ErrorCode.unknown_member_id)
        if group.is_(GroupState.DEAD):
            return SyncResult(ErrorCode.coordinator_not_available)
        if group.is_static_member_fenced(member_id, group_instance_id):
            return SyncResult(ErrorCode.fenced_instance_id)
        member = group.members.get(member_id)
        if member is None or group.is_(GroupState.EMPTY):
            return SyncResult(ErrorCode.unknown_member_id)
        if generation_id != group.generation_id:
            return SyncResult(ErrorCode.illegal_generation)
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
            protocol_name is not None and protocol_name != group.protocol_name
        ):
            return SyncResult(ErrorCode.inconsistent_group_protocol)
        if group.is_(GroupState.PREPARING_REBALANCE):
            return SyncResult(ErrorCode.rebalance_in_progress)
        group.pending_sync_members.discard(member_id)
        self._schedule_heartbeat_expiration(group, member)
        if group.is_(GroupState.STABLE):
            return self._sync_result(group, member)
        # CompletingRebalance: wait for the leader's assignment.
        future: asyncio.Future[SyncResult] = self.loop.create_future()
        member.sync_future = future
        if group.is_leader(member_id):
            await self._writes.run(self._store_assignment(group, generation_id, assignments))
        return await future

    async def _store_assignment(
        self, group: ClassicGroup, generation_id: int, assignments: dict[str, bytes]
    ) -> None:
        """The leader's assignment: stored (after the group's earlier writes, once the ISR has
        it), then the group is Stable and every waiting member gets its part. A member that
        joined meanwhile (a new rebalance) or an unload answered the waiting members already:
        then, as in Kafka, nothing more happens for this generation."""
        async with group.write_lock:
            if not (
                self._is_current(group)
                and group.is_(GroupState.COMPLETING_REBALANCE)
                and group.generation_id == generation_id
            ):
                return
            for m in group.members.values():
                m.assignment = assignments.get(m.member_id, b"")
            outcome = await self._manager.store_group(group)
            if not (
                self._is_current(group)
                and group.is_(GroupState.COMPLETING_REBALANCE)
                and group.generation_id == generation_id
            ):
                return
            if outcome.error != ErrorCode.none:
                self._propagate_sync_error(group, outcome.error)
                self._maybe_prepare_rebalance(group, "storing the assignment failed")
                return
            group.transition_to(GroupState.STABLE, self._time_ms())
            log.info(
                "group is stable",
                extra={
                    "group": group.group_id,
                    "generation": group.generation_id,
                    "members": len(group.members),
                },
            )
            for m in group.members.values():
                if m.is_awaiting_sync:
                    assert m.sync_future is not None
                    m.sync_future.set_result(self._sync_result(group, m))
                m.sync_future = None

    @staticmethod
    def _sync_result(group: ClassicGroup, member: MemberMetadata) -> SyncResult:
        return SyncResult(ErrorCode.none, member.assignment, group.protocol_type, group.protocol_name)

    # --- LeaveGroup ----------------------------------------------------------------------

    async def leave_group(
        self, group_id: str, members: list[tuple[str, str | None]]
    ) -> tuple[ErrorCode, list[ErrorCode]]:
        """Remove each (member id, group instance id); returns the group error and one error per member."""
        if (error := self.coordinator_error(group_id)) != ErrorCode.none:
            return error, [error for _ in members]
        group = self._groups.get(group_id)
        if group is None:
            return ErrorCode.none, [ErrorCode.unknown_member_id for _ in members]
        if group.is_(GroupState.DEAD):
            return ErrorCode.coordinator_not_available, []
        errors = []
        for member_id, group_instance_id in members:
            if group_instance_id is not None:
                current = group.static_member_id(group_instance_id)
                if current is None:
                    errors.append(ErrorCode.unknown_member_id)
                    continue
                if member_id != UNKNOWN_MEMBER_ID and member_id != current:
                    errors.append(ErrorCode.fenced_instance_id)
                    continue
                member_id = current
            elif member_id in group.pending_members:
                group.pending_members.pop(member_id).cancel()
                self._maybe_complete_join(group)
                errors.append(ErrorCode.none)
                continue
            member = group.members.get(member_id)
            if member is None:
                errors.append(ErrorCode.unknown_member_id)
                continue
            log.info("member left", extra={"group": group.group_id, "member": member_id})
            self._remove_member_and_update_group(group, member)
            errors.append(ErrorCode.none)
        await self._settle(group)
        return ErrorCode.none, errors

    # --- offsets -------------------------------------------------------------------------

    async def commit_offsets(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: dict[TopicPartition, OffsetAndMetadata],
        request_version: int,
    ) -> dict[TopicPartition, ErrorCode]:
        error = self._validate_offset_commit(
            group_id, generation_id, member_id, group_instance_id, request_version
        )
        if error != ErrorCode.none:
            return dict.fromkeys(offsets, error)
        group = self._groups[group_id]
        results, valid = self._split_by_metadata_size(offsets)
        if valid:
            error = await self._writes.run(self._store_offsets(group, valid))
            for tp in valid:
                results[tp] = error
        return results

    async def _store_offsets(self, group: ClassicGroup, offsets: dict[TopicPartition, OffsetAndMetadata]) -> ErrorCode:
        """Applied once the ISR holds the records, under the group's write lock: commits of a
        group take effect in their log order, and a commit read back never goes backwards."""
        async with group.write_lock:
            if not self._is_current(group):
                return self._gone_error(group.group_id)
            outcome = await self._manager.store_offsets(group.group_id, offsets)
            if outcome.error == ErrorCode.none:
                group.commit_offsets(offsets, outcome.base_offset)
            return outcome.error

    async def commit_transactional_offsets(
        self,
        group_id: str,
        producer: TransactionalProducer,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: dict[TopicPartition, OffsetAndMetadata],
        verify: Callable[[TopicPartition], Awaitable[ErrorCode]] | None = None,
    ) -> dict[TopicPartition, ErrorCode]:
        """TxnOffsetCommit: the offsets are written as a batch of the producer's transaction and
        stay pending in the group (not fetched, not expired) until the transaction's marker lands
        in the group's offsets partition (``on_transaction_completed``). ``verify`` asks the
        transaction coordinator whether that partition is in the producer's ongoing transaction
        (KIP-890), before the transaction's first write there: a late commit must not open a
        transaction no coordinator will end."""
        error = self._validate_txn_offset_commit(group_id, generation_id, member_id, group_instance_id)
        if error != ErrorCode.none:
            return dict.fromkeys(offsets, error)
        group = self._groups[group_id]
        results, valid = self._split_by_metadata_size(offsets)
        guard = self._manager.start_verification(group_id, producer.producer_id) if valid and verify else None
        if guard is not None and verify is not None:
            error = await verify(self._manager.partition_of(group_id))
            if error != ErrorCode.none:
                results.update(dict.fromkeys(valid, error))
                return results
        if valid:
            error = await self._writes.run(self._store_transactional_offsets(group, valid, producer, guard))
            for tp in valid:
                results[tp] = error
        return results

    async def _store_transactional_offsets(
        self,
        group: ClassicGroup,
        offsets: dict[TopicPartition, OffsetAndMetadata],
        producer: TransactionalProducer,
        guard: object | None,
    ) -> ErrorCode:
        async with group.write_lock:
            if not self._is_current(group):
                return self._gone_error(group.group_id)
            outcome = await self._manager.store_offsets(group.group_id, offsets, producer, guard)
            # A marker that landed while the write waited for the ISR (the coordinator aborting
            # the transaction on its timeout) has ended it: nothing is pending.
            if outcome.error == ErrorCode.none and self._manager.transaction_open(
                group.group_id, producer.producer_id
            ):
                pending = group.pending_txn_offsets.setdefault(producer.producer_id, {})
                for tp, offset in offsets.items():
                    pending[tp] = (offset, outcome.base_offset)
            return outcome.error

    def _split_by_metadata_size(
        self, offsets: dict[TopicPartition, OffsetAndMetadata]
    ) -> tuple[dict[TopicPartition, ErrorCode], dict[TopicPartition, OffsetAndMetadata]]:
        """OFFSET_METADATA_TOO_LARGE for the offsets whose metadata passes offset.metadata.max.bytes,
        and the others, to write."""
        results: dict[TopicPartition, ErrorCode] = {}
        valid: dict[TopicPartition, OffsetAndMetadata] = {}
        for tp, offset in offsets.items():
            if len(offset.metadata.encode()) > self.config.offset_metadata_max_bytes:
                results[tp] = ErrorCode.offset_metadata_too_large
            else:
                valid[tp] = offset
        return results, valid

    def _validate_txn_offset_commit(
        self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None
    ) -> ErrorCode:
        """Kafka's checks of a transactional commit: a member's fields when given (v3+, KIP-447),
        none before (older producers do not know the group's members)."""
        if not group_id:
            return ErrorCode.invalid_group_id
        if (error := self.coordinator_error(group_id)) != ErrorCode.none:
            return error
        self._ensure_offsets_topic()
        group = self._groups.get(group_id)
        if group is None:
            if generation_id >= 0:
                return ErrorCode.illegal_generation  # a member of a generation the group never had
            # A producer committing for a group without membership: a simple group of its own.
            self._groups[group_id] = ClassicGroup(group_id, self._time_ms())
            return ErrorCode.none
        if group.is_(GroupState.DEAD):
            return ErrorCode.coordinator_not_available
        if generation_id < 0 and group.is_(GroupState.EMPTY):
            return ErrorCode.none
        # Without member fields (v0-v2) a transaction commits whatever the group's state, unlike
        # OffsetCommit: the producer cannot know the group's members.
        if generation_id < 0 and member_id == UNKNOWN_MEMBER_ID and group_instance_id is None:
            return ErrorCode.none
        if group.is_static_member_fenced(member_id, group_instance_id):
            return ErrorCode.fenced_instance_id
        if member_id not in group.members:
            return ErrorCode.unknown_member_id
        if generation_id != group.generation_id:
            return ErrorCode.illegal_generation
        return ErrorCode.none

    def on_transaction_completed(self, offsets_partition: int, producer_id: int, committed: bool) -> None:
        """A producer's COMMIT or ABORT marker landed in offsets partition ``offsets_partition``
        (and the ISR has it): its pending offsets in that partition's groups are applied or
        dropped (Kafka's scheduleHandleTxnCompletion)."""
        for group in list(self._groups.values()):
            if (
                producer_id in group.pending_txn_offsets
                and self._partition_of(group.group_id) == offsets_partition
            ):
                group.complete_txn_offsets(producer_id, committed)

    def _validate_offset_commit(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        request_version: int,
    ) -> ErrorCode:
        if not group_id:
            return ErrorCode.invalid_group_id
        if (error := self.coordinator_error(group_id)) != ErrorCode.none:
            return error
        self._ensure_offsets_topic()
        group = self._groups.get(group_id)
        if group is None:
            if generation_id >= 0:
                # v9 tells the client the group is gone; older versions keep Kafka's ILLEGAL_GENERATION.
                return ErrorCode.group_id_not_found if request_version >= 9 else ErrorCode.illegal_generation
            # A standalone consumer (assign(), no membership) commits for a group of its own.
            self._groups[group_id] = ClassicGroup(group_id, self._time_ms())
            return ErrorCode.none
        if group.is_(GroupState.DEAD):
            return ErrorCode.coordinator_not_available
        if generation_id < 0 and group.is_(GroupState.EMPTY):
            return ErrorCode.none
        if group.is_static_member_fenced(member_id, group_instance_id):
            return ErrorCode.fenced_instance_id
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.unknown_member_id
        if generation_id != group.generation_id:
            return ErrorCode.illegal_generation
        if group.is_(GroupState.COMPLETING_REBALANCE):
            return ErrorCode.rebalance_in_progress
        self._schedule_heartbeat_expiration(group, member)
        return ErrorCode.none

    def fetch_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """Committed offsets of ``partitions`` (None: every partition the group has an offset for).
        A transaction's pending offsets are not among them until it commits."""
        group = self._groups.get(group_id)
        offsets = group.offsets if group is not None and not group.is_(GroupState.DEAD) else {}
        if partitions is None:
            return dict(offsets)
        return {tp: offsets.get(tp) for tp in partitions}

    def unstable_offsets(self, group_id: str, partitions: Iterable[TopicPartition]) -> set[TopicPartition]:
        """Those of ``partitions`` with a transactional commit pending (OffsetFetch's
        ``require_stable`` answers them UNSTABLE_OFFSET_COMMIT, KIP-447)."""
        group = self._groups.get(group_id)
        if group is None or not group.pending_txn_offsets:
            return set()
        return {tp for tp in partitions if group.has_pending_txn_offset(tp)}

    async def delete_offsets(
        self, group_id: str, partitions: list[TopicPartition]
    ) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        if (error := self.coordinator_error(group_id)) != ErrorCode.none:
            return error, {}
        group = self._groups.get(group_id)
        if group is None or group.is_(GroupState.DEAD):
            return ErrorCode.group_id_not_found, {}
        async with group.write_lock:
            # Decided after the group's earlier writes are applied.
            if not self._is_current(group):
                return self._gone_error(group_id, ErrorCode.group_id_not_found), {}
            return await self._delete_offsets(group, partitions)

    async def _delete_offsets(
        self, group: ClassicGroup, partitions: list[TopicPartition]
    ) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        group_id = group.group_id
        results: dict[TopicPartition, ErrorCode] = {}
        if not group.is_(GroupState.EMPTY):
            if group.protocol_type != "consumer":
                return ErrorCode.non_empty_group, {}
            subscribed = group.subscribed_topics()
            for tp in partitions:
                if subscribed is None or tp.topic in subscribed:
                    results[tp] = ErrorCode.group_subscribed_to_topic
        # A tombstone also for a partition with only a transaction's pending offset: it drops that.
        deletable = [
            tp
            for tp in partitions
            if tp not in results and (tp in group.offsets or group.has_pending_txn_offset(tp))
        ]
        outcome = await self._manager.delete_offsets(group_id, deletable)
        if outcome.error != ErrorCode.none:
            return outcome.error, {}
        group.remove_offsets(deletable)
        for tp in partitions:
            results.setdefault(tp, ErrorCode.none)
        return ErrorCode.none, results

    async def on_topic_deleted(self, topic: str) -> int:
        """A deleted topic's committed offsets go with it, in every group (as Kafka does); returns count."""
        removed = 0
        for group in list(self._groups.values()):
            if not any(tp.topic == topic for tp in self._offset_partitions(group)):
                continue
            async with group.write_lock:
                gone = [tp for tp in self._offset_partitions(group) if tp.topic == topic]
                if not gone or not self._is_current(group):
                    continue
                if (await self._manager.delete_offsets(group.group_id, gone)).error == ErrorCode.none:
                    group.remove_offsets(gone)
                    removed += len(gone)
        return removed

    @staticmethod
    def _offset_partitions(group: ClassicGroup) -> set[TopicPartition]:
        """Partitions with a committed offset or a transaction's pending one."""
        return group.offsets.keys() | group.pending_txn_partitions()

    async def expire_offsets(self) -> int:
        """offsets.retention.minutes: drop offsets of groups that stayed empty that long; returns count."""
        removed = 0
        for group in list(self._groups.values()):
            async with group.write_lock:
                if self._is_current(group):
                    removed += await self._expire_group_offsets(group)
        return removed

    async def _expire_group_offsets(self, group: ClassicGroup) -> int:
        now = self._time_ms()
        retention = self.config.offsets_retention_ms
        expired = [
            tp
            for tp, offset in group.offsets.items()
            if self._is_expired(group, tp, offset, now, retention) and not group.has_pending_txn_offset(tp)
        ]
        if expired:
            if (await self._manager.delete_offsets(group.group_id, expired)).error != ErrorCode.none:
                return 0
            group.remove_offsets(expired)
            log.info("expired offsets", extra={"group": group.group_id, "partitions": len(expired)})
        if (
            self._is_current(group)
            and group.is_(GroupState.EMPTY)
            and not group.offsets
            and not group.pending_txn_offsets
            and not group.pending_members
        ):
            # A group that never had a generation has no metadata record to delete.
            await self._remove_empty_group(group, write=group.generation_id > 0)
        return len(expired)

    async def _remove_empty_group(self, group: ClassicGroup, *, write: bool = True) -> ErrorCode:
        """Delete an Empty group (its offsets' and metadata's tombstones if ``write``); the caller
        holds its write lock. The group is Dead while the tombstones wait for the ISR, so a member
        joining meanwhile is told to retry (and meets a fresh group) instead of joining a group
        whose records are being deleted; if the write fails, the group is as it was."""
        state_timestamp = group.current_state_timestamp
        group.transition_to(GroupState.DEAD, self._time_ms())
        error = (await self._manager.delete_group(group)).error if write else ErrorCode.none
        if error != ErrorCode.none:
            if self._groups.get(group.group_id) is group:  # not unloaded meanwhile
                group.state, group.current_state_timestamp = GroupState.EMPTY, state_timestamp
            return error
        group.cancel_timers()
        if self._groups.get(group.group_id) is group:
            del self._groups[group.group_id]
        log.info("deleted group", extra={"group": group.group_id})
        return ErrorCode.none

    @staticmethod
    def _is_expired(
        group: ClassicGroup, tp: TopicPartition, offset: OffsetAndMetadata, now: int, retention: int
    ) -> bool:
        # Which offsets may expire at all (KIP-211), and from when the retention counts.
        if not group.protocol_type:
            base = offset.commit_timestamp  # standalone commits, never a member
        elif group.is_(GroupState.EMPTY):
            base = group.current_state_timestamp
        elif group.is_(GroupState.STABLE):
            subscribed = group.subscribed_topics()
            if subscribed is None or tp.topic in subscribed:
                return False
            base = offset.commit_timestamp
        else:
            return False
        # An explicit expiry (OffsetCommit v2-v4 retention_time) replaces only the age test.
        if offset.expire_timestamp >= 0:
            return now >= offset.expire_timestamp
        return now - base >= retention

    # --- admin ---------------------------------------------------------------------------

    def group(self, group_id: str) -> ClassicGroup | None:
        group = self._groups.get(group_id)
        return None if group is None or group.is_(GroupState.DEAD) else group

    def list_groups(self, states: set[str] | None, types: set[str] | None) -> list[ClassicGroup]:
        """Groups, filtered by state names and group types (case-insensitive; empty means all)."""
        if types and CLASSIC_GROUP_TYPE not in {t.lower() for t in types}:
            return []
        wanted = {s.lower() for s in states} if states else None
        return [
            g
            for g in self._groups.values()
            if not g.is_(GroupState.DEAD) and (wanted is None or g.state.value.lower() in wanted)
        ]

    async def delete_groups(self, group_ids: list[str]) -> dict[str, ErrorCode]:
        results: dict[str, ErrorCode] = {}
        for group_id in group_ids:
            group = self._groups.get(group_id)
            if not group_id:
                results[group_id] = ErrorCode.invalid_group_id
            elif (error := self.coordinator_error(group_id)) != ErrorCode.none:
                results[group_id] = error
            elif group is None or group.is_(GroupState.DEAD):
                results[group_id] = ErrorCode.group_id_not_found
            elif not group.is_(GroupState.EMPTY):
                results[group_id] = ErrorCode.non_empty_group
            else:
                results[group_id] = await self._delete_group(group)
        return results

    async def _delete_group(self, group: ClassicGroup) -> ErrorCode:
        async with group.write_lock:
            # Decided after the group's earlier writes: tombstones for every offset they committed.
            if not self._is_current(group):
                return self._gone_error(group.group_id, ErrorCode.group_id_not_found)
            if not group.is_(GroupState.EMPTY):
                return ErrorCode.non_empty_group
            return await self._remove_empty_group(group)
