"""Group membership and committed offsets (Kafka's classic protocol), on the I/O loop.

The ConsumerCoordinator finds the group's coordinator broker (FindCoordinator), joins
(JoinGroup, retried with the member id a v4+ broker hands out), and syncs (SyncGroup:
the leader runs the assignor the group chose over every member's subscription). While
stable it heartbeats every ``heartbeat.interval.ms``; a heartbeat answered with
REBALANCE_IN_PROGRESS makes the next poll() rejoin, ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID
mean the member was dropped (its partitions are lost). A member that does not poll
within ``max.poll.interval.ms`` leaves the group and rejoins on its next poll.

Rebalances start in poll() and run as a task that may outlive one poll(). Listener
callbacks and assignment changes go to the caller's thread (``CallerTasks``): eager
rebalancing revokes everything before JoinGroup, cooperative rebalancing revokes only
the partitions that move, after SyncGroup, and then rejoins so their new owners get them.

Group requests use their own connection to the coordinator (as the Java client does),
so a JoinGroup that waits for the whole group never holds up fetches or heartbeats.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from strom.client.cluster import Cluster, TopicPartition
from strom.client.consumer.assignors import (
    ConsumerPartitionAssignor,
    RebalanceProtocol,
    assignors_for,
    rebalance_protocol,
)
from strom.client.consumer.caller import CallerTasks
from strom.client.consumer.protocol import (
    NO_GENERATION,
    Assignment,
    ConsumerProtocolError,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from strom.client.consumer.structs import ConsumerGroupMetadata, OffsetAndMetadata
from strom.client.consumer.subscription_state import SubscriptionState
from strom.client.errors import CommitFailedError, ErrorCode, KafkaException, KafkaTimeoutError
from strom.client.network_client import NetworkClient
from strom.network.connection import BrokerConnection, KafkaConnectionError, RequestTimeoutError
from strom.network.pool import Node
from strom.protocol.apis import ApiKey, request_module
from strom.protocol.messages import build

log = logging.getLogger(__name__)

PROTOCOL_TYPE = "consumer"
JOIN_GROUP_MAX_VERSION = 9
SYNC_GROUP_MAX_VERSION = 5
HEARTBEAT_MAX_VERSION = 4
LEAVE_GROUP_MAX_VERSION = 5
OFFSET_COMMIT_MIN_VERSION, OFFSET_COMMIT_MAX_VERSION = 2, 9
OFFSET_FETCH_MIN_VERSION, OFFSET_FETCH_MAX_VERSION = 1, 9
# Connections to a group coordinator get their own ids, apart from the broker's data connection.
_COORDINATOR_ID_BASE = 2**31 - 1

_COORDINATOR_ERRORS = frozenset({ErrorCode.coordinator_not_available, ErrorCode.not_coordinator})
_GENERATION_ERRORS = frozenset({ErrorCode.unknown_member_id, ErrorCode.illegal_generation})
# JoinGroup/SyncGroup errors after which the member simply joins again.
_REJOIN_ERRORS = _GENERATION_ERRORS | {ErrorCode.rebalance_in_progress}

# One step of a rebalance on the caller's thread: a rebalance listener method and its partitions,
# or (None, partitions) for the new assignment.
_Step = tuple[str | None, set[TopicPartition]]


class _ListenerFailed(Exception):
    """A rebalance listener method raised ``cause``."""

    def __init__(self, method: str, cause: Exception) -> None:
        super().__init__(method, cause)
        self.method = method
        self.cause = cause


class MemberState(enum.Enum):
    UNJOINED = 0
    PREPARING_REBALANCE = 1
    COMPLETING_REBALANCE = 2
    STABLE = 3


@dataclass(frozen=True, slots=True)
class Generation:
    generation_id: int = NO_GENERATION
    member_id: str = ""
    protocol_name: str | None = None

    @property
    def is_valid(self) -> bool:
        return self.generation_id != NO_GENERATION and bool(self.member_id)


NO_GENERATION_INFO = Generation()


def _ms(value: float) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=value)


class ConsumerCoordinator:
    def __init__(
        self,
        client: NetworkClient,
        config: Mapping[str, Any],
        subscriptions: SubscriptionState,
        *,
        caller: CallerTasks,
        notify: Callable[[], None],
        assignment_changed: Callable[[set[TopicPartition]], None],
        refresh_pattern: Callable[[], Awaitable[None]],
    ) -> None:
        self.client = client
        self.subscriptions = subscriptions
        self.group_id: str = config["group.id"]
        self.group_instance_id: str | None = config["group.instance.id"]
        self.session_timeout_ms: int = config["session.timeout.ms"]
        self.heartbeat_interval = config["heartbeat.interval.ms"] / 1000
        self.max_poll_interval = config["max.poll.interval.ms"] / 1000
        rebalance_timeout = config["rebalance.timeout.ms"]
        self.rebalance_timeout_ms: int = (
            rebalance_timeout if rebalance_timeout is not None else config["max.poll.interval.ms"]
        )
        self.request_timeout = config["request.timeout.ms"] / 1000
        self.rack_id: str | None = config["client.rack"] or None
        self.auto_commit: bool = config["enable.auto.commit"]
        self.auto_commit_interval = config["auto.commit.interval.ms"] / 1000
        self.assignors: list[ConsumerPartitionAssignor] = assignors_for(
            config["partition.assignment.strategy"]
        )
        self.protocol = rebalance_protocol(self.assignors)
        self._caller = caller
        self._notify = notify
        self._assignment_changed = assignment_changed
        self._refresh_pattern = refresh_pattern

        self.coordinator_id: int | None = None
        self.generation = NO_GENERATION_INFO
        self.state = MemberState.UNJOINED
        self.rejoin_needed = True
        self.is_leader = False
        self.last_poll = time.monotonic()
        self.next_auto_commit = time.monotonic() + self.auto_commit_interval
        self._joined_subscription: set[str] = set()
        self._assignment_snapshot: dict[str, int] | None = None
        self._rebalance_task: asyncio.Task[None] | None = None
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._pending_commits: set[asyncio.Task[Any]] = set()
        self._errors: list[Exception] = []
        self._closing = False
        # Set while the commit before a rebalance runs: poll() returns no records until the
        # partitions are revoked, as Kafka's poll commits and revokes before it collects.
        self.holding_records = False

    # -- what poll() asks (the caller's thread) ---------------------------------------------

    def need_rejoin(self) -> bool:
        if not self.subscriptions.has_auto_assigned_partitions or self._closing:
            return False
        return (
            self.rejoin_needed
            or self.state is MemberState.UNJOINED
            or self._joined_subscription != self.subscriptions.subscription
        )

    @property
    def rebalancing(self) -> bool:
        task = self._rebalance_task
        return task is not None and not task.done()

    def record_poll(self) -> None:
        self.last_poll = time.monotonic()

    def take_error(self) -> Exception | None:
        """A fatal group error or a listener's exception, for poll() to raise once."""
        return self._errors.pop(0) if self._errors else None

    def group_metadata(self) -> ConsumerGroupMetadata:
        generation = self.generation
        return ConsumerGroupMetadata(self.group_id, generation.generation_id, generation.member_id, self.group_instance_id)

    def request_rejoin(self, reason: str) -> None:
        if not self.rejoin_needed:
            log.info("group %s: rejoin requested: %s", self.group_id, reason)
        self.rejoin_needed = True
        self._notify()

    def _fail(self, error: Exception) -> None:
        self._errors.append(error)
        self._notify()

    # -- the coordinator broker ------------------------------------------------------------------

    async def ensure_coordinator_ready(self, deadline: float | None = None) -> int:
        attempt = 0
        while self.coordinator_id is None:
            try:
                node = await self.client.find_coordinator(self.group_id)
            except (KafkaConnectionError, RequestTimeoutError, KafkaException) as exc:
                if isinstance(exc, KafkaException) and not exc.retriable:
                    raise
                if deadline is not None and time.monotonic() >= deadline:
                    raise KafkaTimeoutError(f"no coordinator for group {self.group_id}: {exc}") from exc
                await self.client.backoff(min(attempt, 4))
                attempt += 1
                continue
            coordinator_id = _COORDINATOR_ID_BASE - node.node_id
            self.client.pool.set_node(Node(coordinator_id, node.host, node.port, node.rack))
            self.coordinator_id = coordinator_id
            log.info("group %s: coordinator is broker %d (%s)", self.group_id, node.node_id, node.address)
        return self.coordinator_id

    def mark_coordinator_unknown(self, reason: str) -> None:
        if self.coordinator_id is not None:
            log.info("group %s: coordinator unknown: %s", self.group_id, reason)
            self.client.pool.disconnect(self.coordinator_id)
            self.coordinator_id = None

    async def _send(
        self, build_request: Callable[[BrokerConnection], Any], timeout: float | None = None
    ) -> Any:
        """Send to the coordinator; connection failures become a retriable COORDINATOR_NOT_AVAILABLE."""
        coordinator_id = self.coordinator_id
        if coordinator_id is None:
            raise KafkaException("group coordinator unknown", ErrorCode.coordinator_not_available)
        try:
            return await self.client.send(coordinator_id, build_request, timeout=timeout)
        except (KafkaConnectionError, RequestTimeoutError) as exc:
            if self.coordinator_id == coordinator_id:
                self.mark_coordinator_unknown(str(exc))
            raise KafkaException(str(exc), ErrorCode.coordinator_not_available) from exc

    def _check_coordinator_error(self, error: ErrorCode, context: str) -> None:
        if error in _COORDINATOR_ERRORS:
            self.mark_coordinator_unknown(f"{context}: {error.name}")

    # -- joining -----------------------------------------------------------------------------

    def ensure_active_group(self) -> None:
        """Start a rebalance if one is needed and none is running (from poll)."""
        if self.need_rejoin() and not self.rebalancing:
            self._rebalance_task = asyncio.ensure_future(self._rebalance())

    async def _rebalance(self) -> None:
        prepared = False
        attempt = 0
        while self.need_rejoin():
            try:
                await self.ensure_coordinator_ready()
                if self.subscriptions.has_pattern_subscription:
                    await self._refresh_pattern()
                if not prepared:
                    await self._on_join_prepare()
                    prepared = True
                assignment = await self._join_and_sync()
                if assignment is None:
                    continue  # rejoin at once (member id handed out, rebalance restarted...)
                await self._on_join_complete(assignment)
                prepared = False
                attempt = 0
            except (KafkaException, KafkaConnectionError, RequestTimeoutError) as exc:
                if self.state is not MemberState.STABLE:
                    self.state = MemberState.UNJOINED
                self.rejoin_needed = True
                code = (
                    exc.error_code if isinstance(exc, KafkaException) else ErrorCode.coordinator_not_available
                )
                if code is not None and (code.retriable or code in _REJOIN_ERRORS):
                    log.info("group %s: join failed, retrying: %s", self.group_id, exc)
                    if code in _GENERATION_ERRORS:
                        prepared = False  # out of the group: what it still owns is lost
                    await self.client.backoff(min(attempt, 4))
                    attempt += 1
                    continue
                log.error("group %s: join failed: %s", self.group_id, exc)
                self._fail(exc if isinstance(exc, KafkaException) else KafkaException(str(exc)))
                return
            except ConsumerProtocolError as exc:  # a member's subscription or our assignment is garbage
                self.state = MemberState.UNJOINED
                self.rejoin_needed = True
                log.error("group %s: rebalance failed: %s", self.group_id, exc)
                self._fail(KafkaException(f"group {self.group_id}: rebalance failed: {exc}"))
                return
        self._notify()

    def _member_subscription(self, assignor: ConsumerPartitionAssignor) -> bytes:
        topics = self._joined_subscription
        return encode_subscription(
            Subscription(
                topics=tuple(sorted(topics)),
                user_data=assignor.subscription_user_data(topics),
                owned_partitions=tuple(sorted(self.subscriptions.assigned_partitions())),
                generation_id=self.generation.generation_id,
                rack_id=self.rack_id,
            )
        )

    async def _join_and_sync(self) -> bytes | None:
        """One JoinGroup and SyncGroup round: the member's assignment, or None to rejoin."""
        self._stop_heartbeat()
        self.state = MemberState.PREPARING_REBALANCE
        self.rejoin_needed = False
        self._joined_subscription = set(self.subscriptions.subscription)
        protocols = [(a.name, self._member_subscription(a)) for a in self.assignors]
        member_id = self.generation.member_id

        def build_join(connection: BrokerConnection) -> Any:
            version = connection.version(ApiKey.JOIN_GROUP, JOIN_GROUP_MAX_VERSION)
            module = request_module(ApiKey.JOIN_GROUP, version)
            return build(
                module.JoinGroupRequest,
                group_id=self.group_id,
                session_timeout=_ms(self.session_timeout_ms),
                rebalance_timeout=_ms(self.rebalance_timeout_ms),
                member_id=member_id,
                group_instance_id=self.group_instance_id,
                protocol_type=PROTOCOL_TYPE,
                protocols=tuple(module.JoinGroupRequestProtocol(name=n, metadata=m) for n, m in protocols),
                reason="rebalance" if member_id else "joining the group",
            )

        # The coordinator answers once every member rejoined: up to the rebalance timeout.
        timeout = max(self.request_timeout, self.rebalance_timeout_ms / 1000 + 5)
        joined = await self._send(build_join, timeout)
        error = ErrorCode(joined.error_code)
        if error == ErrorCode.member_id_required:
            self.generation = Generation(NO_GENERATION, joined.member_id, None)
            self.rejoin_needed = True
            return None
        if error != ErrorCode.none:
            self._handle_group_error(error, "JoinGroup")
            self.rejoin_needed = True
            if error == ErrorCode.rebalance_in_progress:
                return None
            raise KafkaException.from_code(error, f"JoinGroup({self.group_id})")
        self.generation = Generation(int(joined.generation_id), joined.member_id, joined.protocol_name)
        self.state = MemberState.COMPLETING_REBALANCE
        self.is_leader = joined.leader == joined.member_id
        assignments: dict[str, bytes] = {}
        if self.is_leader and not getattr(joined, "skip_assignment", False):
            assignments = await self._perform_assignment(joined.protocol_name, joined.members)
        generation = self.generation

        def build_sync(connection: BrokerConnection) -> Any:
            version = connection.version(ApiKey.SYNC_GROUP, SYNC_GROUP_MAX_VERSION)
            module = request_module(ApiKey.SYNC_GROUP, version)
            return build(
                module.SyncGroupRequest,
                group_id=self.group_id,
                generation_id=generation.generation_id,
                member_id=generation.member_id,
                group_instance_id=self.group_instance_id,
                protocol_type=PROTOCOL_TYPE,
                protocol_name=generation.protocol_name,
                assignments=tuple(
                    module.SyncGroupRequestAssignment(member_id=member, assignment=data)
                    for member, data in assignments.items()
                ),
            )

        synced = await self._send(build_sync, timeout)
        error = ErrorCode(synced.error_code)
        if error != ErrorCode.none:
            self._handle_group_error(error, "SyncGroup")
            self.rejoin_needed = True
            if error == ErrorCode.rebalance_in_progress:
                return None
            raise KafkaException.from_code(error, f"SyncGroup({self.group_id})")
        return bytes(synced.assignment)

    def _handle_group_error(self, error: ErrorCode, context: str) -> None:
        """Bookkeeping for a JoinGroup/SyncGroup/Heartbeat error, as Kafka's AbstractCoordinator does."""
        if error in _GENERATION_ERRORS or error == ErrorCode.fenced_instance_id:
            log.info("group %s: %s: %s; resetting the generation", self.group_id, context, error.name)
            self.reset_generation()
        else:
            self._check_coordinator_error(error, context)
        if self.state is not MemberState.STABLE:
            self.state = MemberState.UNJOINED

    def reset_generation(self) -> None:
        self.generation = NO_GENERATION_INFO
        self.state = MemberState.UNJOINED
        self.rejoin_needed = True
        self._stop_heartbeat()

    async def _perform_assignment(
        self, protocol_name: str | None, members: Iterable[Any]
    ) -> dict[str, bytes]:
        assignor = self._assignor(protocol_name)
        subscriptions = {
            m.member_id: dataclasses.replace(
                decode_subscription(bytes(m.metadata)), group_instance_id=m.group_instance_id
            )
            for m in members
        }
        topics = {t for s in subscriptions.values() for t in s.topics}
        self.subscriptions.group_subscription = set(topics)
        cluster = await self.client.refresh_metadata(topics | self.subscriptions.subscription)
        partitions_per_topic = _partition_counts(cluster, topics)
        self._assignment_snapshot = partitions_per_topic
        log.info(
            "group %s: leader assigning %d partitions of %d topics to %d members with %s",
            self.group_id,
            sum(partitions_per_topic.values()),
            len(partitions_per_topic),
            len(subscriptions),
            assignor.name,
        )
        assigned = assignor.assign(partitions_per_topic, subscriptions)
        return {
            member: encode_assignment(Assignment(tuple(assigned.get(member, ())))) for member in subscriptions
        }

    def _assignor(self, name: str | None) -> ConsumerPartitionAssignor:
        for assignor in self.assignors:
            if assignor.name == name:
                return assignor
        raise KafkaException(f"the group chose assignor {name!r}, which this consumer does not have")

    async def _on_join_prepare(self) -> None:
        """Before JoinGroup: commit (auto-commit), then revoke (eager) or drop lost partitions."""
        try:
            if self.auto_commit and self.generation.is_valid:
                # The positions as the caller's thread sees them at its next poll(): what earlier
                # polls returned, never the records of the poll that started this rebalance, which
                # the application may still be processing.
                offsets = await self._caller.call(self._hold_records)
                await self.commit_offsets_quietly(offsets, self.rebalance_timeout_ms / 1000)
            await self._revoke_before_join()
        finally:
            self.holding_records = False
        self.is_leader = False
        self.subscriptions.group_subscription = set()

    def _hold_records(self) -> dict[TopicPartition, OffsetAndMetadata]:
        """On the caller's thread: stop poll() returning records, and take the positions to commit."""
        self.holding_records = True
        return self.subscriptions.all_consumed()

    async def _revoke_before_join(self) -> None:
        owned = self.subscriptions.assigned_partitions()
        if not self.generation.is_valid:
            if owned:
                await self._rebalance_turn(("on_partitions_lost", owned), (None, set()))
        elif self.protocol is RebalanceProtocol.EAGER:
            await self._rebalance_turn(("on_partitions_revoked", owned), (None, set()))
        else:
            gone = {tp for tp in owned if tp.topic not in self.subscriptions.subscription}
            if gone:
                await self._rebalance_turn(("on_partitions_revoked", gone), (None, owned - gone))

    async def _on_join_complete(self, data: bytes) -> None:
        generation = self.generation
        assignment = decode_assignment(data)
        assigned = set(assignment.partitions)
        foreign = {tp for tp in assigned if tp.topic not in self.subscriptions.subscription}
        if foreign:
            # The subscription changed during the rebalance: take what still fits, rejoin for the rest.
            assigned -= foreign
            self.request_rejoin("the assignment has topics this member no longer subscribes to")
        self.state = MemberState.STABLE
        self._start_heartbeat()
        owned = self.subscriptions.assigned_partitions()
        revoked = owned - assigned if self.protocol is RebalanceProtocol.COOPERATIVE else set()
        added = assigned - owned
        self._assignor(generation.protocol_name).on_assignment(assignment, generation.generation_id)
        self.next_auto_commit = time.monotonic() + self.auto_commit_interval
        log.info(
            "group %s: generation %d, member %s assigned %s",
            self.group_id,
            generation.generation_id,
            generation.member_id,
            sorted(map(str, assigned)),
        )
        revoking: tuple[_Step, ...] = (("on_partitions_revoked", revoked),) if revoked else ()
        await self._rebalance_turn(*revoking, (None, assigned), ("on_partitions_assigned", added))
        if revoked:
            self.request_rejoin("partitions revoked: a follow-up rebalance assigns them")

    def _apply_assignment(self, partitions: set[TopicPartition]) -> None:
        """On the caller's thread: the new assignment, without buffered data of partitions it drops."""
        dropped = self.subscriptions.assigned_partitions() - partitions
        self.subscriptions.assign_from_subscribed(partitions)
        self._assignment_changed(dropped)

    async def _rebalance_turn(self, *steps: _Step) -> None:
        """Run the listener calls and the assignment change of a rebalance as one piece of work of
        the caller's thread, as Kafka runs them inside one poll().

        Queued one by one, a poll() could return between them: showing the new assignment before
        on_partitions_assigned ran (an application seeing it could commit or seek before the
        listener's own seeks and commits), or handing out buffered records of partitions that
        on_partitions_revoked already gave up. A listener that raises fails the consumer (its next
        poll() raises); the steps after it still run.
        """
        try:
            await self._caller.call(self._run_steps, steps)
        except _ListenerFailed as failed:
            log.error(
                "group %s: rebalance listener %s failed", self.group_id, failed.method, exc_info=failed.cause
            )
            self._fail(KafkaException(f"rebalance listener {failed.method} raised {failed.cause!r}"))
        except Exception as exc:  # a coroutine listener given to the synchronous Consumer
            log.error("group %s: rebalance listener failed", self.group_id, exc_info=exc)
            self._fail(KafkaException(f"rebalance listener raised {exc!r}"))

    def _run_steps(self, steps: tuple[_Step, ...]) -> Awaitable[None] | None:
        """On the caller's thread: the steps of a _rebalance_turn. When a listener method returns an
        awaitable (AsyncConsumer), returns a coroutine that awaits it and finishes the steps."""
        failures: list[_ListenerFailed] = []
        for index, (method, partitions) in enumerate(steps):
            pending = self._run_step(method, partitions, failures)
            if pending is not None:
                return self._finish_steps(pending, method or "", steps[index + 1 :], failures)
        if failures:
            raise failures[0]
        return None

    async def _finish_steps(
        self,
        pending: Awaitable[Any],
        method: str,
        rest: tuple[_Step, ...],
        failures: list[_ListenerFailed],
    ) -> None:
        try:
            await pending
        except Exception as exc:
            failures.append(_ListenerFailed(method, exc))
        for next_method, partitions in rest:
            step = self._run_step(next_method, partitions, failures)
            if step is not None:
                try:
                    await step
                except Exception as exc:
                    failures.append(_ListenerFailed(next_method or "", exc))
        if failures:
            raise failures[0]

    def _run_step(
        self, method: str | None, partitions: set[TopicPartition], failures: list[_ListenerFailed]
    ) -> Awaitable[Any] | None:
        """One step: the new assignment (method None) or a listener call, whose failure is noted."""
        if method is None:
            self._apply_assignment(partitions)
            return None
        listener = self.subscriptions.listener
        if listener is None:
            return None
        if method == "on_partitions_lost" and not hasattr(listener, method):
            method = "on_partitions_revoked"  # a listener without it: lost partitions are revoked
        try:
            result = getattr(listener, method)(set(partitions))
        except Exception as exc:
            failures.append(_ListenerFailed(method, exc))
            return None
        return result if inspect.isawaitable(result) else None

    def on_metadata_update(self, cluster: Cluster) -> None:
        """The leader rejoins when a topic the group subscribes to appeared, went or changed its
        partition count since it computed the assignment, as Kafka's leader does."""
        snapshot = self._assignment_snapshot
        if not self.is_leader or snapshot is None or self.state is not MemberState.STABLE:
            return
        current = _partition_counts(cluster, self.subscriptions.group_subscription)
        if current != snapshot:
            self.request_rejoin("the partitions of the group's topics changed")

    # -- heartbeats --------------------------------------------------------------------------

    def _start_heartbeat(self) -> None:
        if self._heartbeat_task is None or self._heartbeat_task.done():
            self._heartbeat_task = asyncio.ensure_future(self._heartbeat_loop())

    def _stop_heartbeat(self) -> None:
        task, self._heartbeat_task = self._heartbeat_task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    async def _heartbeat_loop(self) -> None:
        last_success = time.monotonic()
        while self.state is MemberState.STABLE and not self._closing:
            started = time.monotonic()
            if started - self.last_poll > self.max_poll_interval:
                log.warning(
                    "group %s: no poll() within max.poll.interval.ms (%d ms); leaving the group",
                    self.group_id,
                    self.max_poll_interval * 1000,
                )
                self._heartbeat_task = None
                await self.maybe_leave_group("consumer poll timeout has expired")
                self._notify()
                return
            if started - last_success > self.session_timeout_ms / 1000:
                self.mark_coordinator_unknown("no successful heartbeat within the session timeout")
                last_success = started
            try:
                await self.ensure_coordinator_ready()
                error = await self._heartbeat()
            except KafkaException as exc:
                error = exc.error_code or ErrorCode.unknown_server_error
            if error == ErrorCode.none:
                last_success = time.monotonic()
            elif error == ErrorCode.rebalance_in_progress:
                # Keep heartbeating until poll() starts the join.
                self.request_rejoin("the group is rebalancing")
            elif error in _GENERATION_ERRORS or error == ErrorCode.fenced_instance_id:
                self._heartbeat_task = None
                self._handle_group_error(error, "Heartbeat")
                if error == ErrorCode.fenced_instance_id:
                    self._fail(KafkaException.from_code(error, f"Heartbeat({self.group_id})"))
                self._notify()
                return
            else:
                self._check_coordinator_error(error, "Heartbeat")
            elapsed = time.monotonic() - started
            await asyncio.sleep(max(0.0, self.heartbeat_interval - elapsed))

    async def _heartbeat(self) -> ErrorCode:
        generation = self.generation

        def build_heartbeat(connection: BrokerConnection) -> Any:
            version = connection.version(ApiKey.HEARTBEAT, HEARTBEAT_MAX_VERSION)
            module = request_module(ApiKey.HEARTBEAT, version)
            return build(
                module.HeartbeatRequest,
                group_id=self.group_id,
                generation_id=generation.generation_id,
                member_id=generation.member_id,
                group_instance_id=self.group_instance_id,
            )

        response = await self._send(build_heartbeat)
        return ErrorCode(response.error_code)

    # -- leaving -----------------------------------------------------------------------------

    async def maybe_leave_group(self, reason: str) -> None:
        """LeaveGroup for a dynamic member (a static one only stops heartbeating), then forget the generation."""
        generation = self.generation
        if (
            self.group_instance_id is None
            and self.coordinator_id is not None
            and self.state is not MemberState.UNJOINED
            and generation.member_id
        ):
            log.info("group %s: member %s leaving: %s", self.group_id, generation.member_id, reason)

            def build_leave(connection: BrokerConnection) -> Any:
                version = connection.version(ApiKey.LEAVE_GROUP, LEAVE_GROUP_MAX_VERSION)
                module = request_module(ApiKey.LEAVE_GROUP, version)
                if version >= 3:
                    member = build(
                        module.MemberIdentity,
                        member_id=generation.member_id,
                        group_instance_id=None,
                        reason=reason,
                    )
                    return module.LeaveGroupRequest(group_id=self.group_id, members=(member,))
                return module.LeaveGroupRequest(group_id=self.group_id, member_id=generation.member_id)

            try:
                await self._send(build_leave)
            except KafkaException as exc:
                log.info("group %s: LeaveGroup failed: %s", self.group_id, exc)
        self.reset_generation()

    async def close(self, timeout: float) -> None:
        """Commit (auto-commit), revoke, leave; stop heartbeating. Never raises for group errors."""
        deadline = time.monotonic() + timeout
        try:
            if self.auto_commit and (
                self.generation.is_valid or not self.subscriptions.has_auto_assigned_partitions
            ):
                remaining = max(0.0, deadline - time.monotonic())
                await self.commit_offsets_quietly(self.subscriptions.all_consumed(), remaining)
            await self.leave("the consumer is being closed", deadline, revoke_static=False)
        finally:
            self._closing = True
            self._stop_heartbeat()
            pending = set(self._pending_commits)
            if pending:  # asynchronous commits get what is left of the timeout, then are dropped
                await asyncio.wait(pending, timeout=max(0.0, deadline - time.monotonic()))
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)

    async def leave(self, reason: str, deadline: float, *, revoke_static: bool) -> None:
        """Revoke the partitions and leave the group (unsubscribe, close). A static member sends no
        LeaveGroup, and on close keeps its partitions (its restart gets them back)."""
        task = self._rebalance_task
        if task is not None and not task.done() and task is not asyncio.current_task():
            in_round = self.state in (MemberState.PREPARING_REBALANCE, MemberState.COMPLETING_REBALANCE)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if in_round and self.coordinator_id is not None:
                # The abandoned JoinGroup or SyncGroup can wait at the coordinator for the whole
                # rebalance, and a broker answers a connection's requests in order: closing the
                # connection abandons it there too, and LeaveGroup goes out on a new one at once.
                self.client.pool.disconnect(self.coordinator_id)
        if self.subscriptions.has_auto_assigned_partitions and (
            self.group_instance_id is None or revoke_static
        ):
            owned = self.subscriptions.assigned_partitions()
            if owned:
                lost = not self.generation.is_valid or self.state is not MemberState.STABLE
                method = "on_partitions_lost" if lost else "on_partitions_revoked"
                await self._rebalance_turn((method, owned), (None, set()))
        if self.coordinator_id is not None:
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await self.maybe_leave_group(reason)
            except TimeoutError:
                log.info("group %s: LeaveGroup did not finish in time", self.group_id)
        self.reset_generation()
        self._joined_subscription = set()

    # -- committed offsets -----------------------------------------------------------------

    def _commit_generation(self) -> Generation:
        if not self.subscriptions.has_auto_assigned_partitions:
            return NO_GENERATION_INFO  # manual assignment: a "simple" group commit
        if self.state is not MemberState.STABLE or not self.generation.is_valid:
            if self.rebalancing:
                raise CommitFailedError(
                    "commit refused: the group is rebalancing; poll() to rejoin, then commit again",
                    ErrorCode.rebalance_in_progress,
                )
            raise CommitFailedError(
                "commit refused: this consumer is not part of an active group (it was removed or has not joined); "
                "poll() to rejoin, then commit again",
                ErrorCode.unknown_member_id,
            )
        return self.generation

    async def commit_offsets(
        self, offsets: Mapping[TopicPartition, OffsetAndMetadata], timeout: float
    ) -> None:
        """OffsetCommit with retries of retriable errors until ``timeout`` (commit_sync).

        Raises CommitFailedError when the group rebalanced around the commit.
        """
        if not offsets:
            return
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        try:
            # The whole call, a request to a broker that stopped answering included, keeps to timeout.
            async with asyncio.timeout(timeout):
                if self._pending_commits:  # keep commits in order (wait, not gather: never cancel them)
                    await asyncio.wait(set(self._pending_commits))
                attempt = 0
                while True:
                    try:
                        await self._commit_once(offsets, deadline)
                        return
                    except KafkaException as exc:
                        if not exc.retriable or isinstance(exc, CommitFailedError):
                            raise
                        last_error = exc
                        if time.monotonic() >= deadline:
                            break
                        await self.client.backoff(min(attempt, 4))
                        attempt += 1
        except TimeoutError:
            pass
        raise KafkaTimeoutError(
            f"offset commit did not complete within {timeout * 1000:.0f} ms"
            + (f": {last_error}" if last_error is not None else "")
        )

    def commit_offsets_async(
        self,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        callback: Callable[[dict[TopicPartition, OffsetAndMetadata], Exception | None], Any] | None,
    ) -> None:
        """One OffsetCommit attempt in the background; ``callback`` runs on the caller's thread."""
        offsets = dict(offsets)

        async def commit() -> None:
            error: Exception | None = None
            try:
                if offsets:
                    await self._commit_once(offsets, time.monotonic() + self.request_timeout)
            except KafkaException as exc:
                error = exc
                log.info("group %s: asynchronous commit failed: %s", self.group_id, exc)
            if callback is not None:
                self._caller.post(callback, offsets, error)

        task = asyncio.ensure_future(commit())
        self._pending_commits.add(task)
        task.add_done_callback(self._pending_commits.discard)

    async def commit_offsets_quietly(
        self, offsets: Mapping[TopicPartition, OffsetAndMetadata], timeout: float
    ) -> None:
        """The auto-commit before a rebalance and on close: failures are logged, not raised."""
        if self.subscriptions.has_auto_assigned_partitions:
            # A deleted topic's partitions fail every commit with UNKNOWN_TOPIC_OR_PARTITION, which
            # is retriable: the commit would retry until the timeout (the rebalance timeout, when it
            # comes before the rebalance that drops those partitions). Metadata already says so.
            known = self.client.cluster.topics
            offsets = {tp: offset for tp, offset in offsets.items() if tp.topic in known}
        try:
            await self.commit_offsets(offsets, timeout)
        except KafkaException as exc:
            log.warning(
                "group %s: auto-commit of %s failed: %s", self.group_id, sorted(map(str, offsets)), exc
            )

    async def _commit_once(
        self, offsets: Mapping[TopicPartition, OffsetAndMetadata], deadline: float
    ) -> None:
        await self.ensure_coordinator_ready(deadline)
        generation = self._commit_generation()
        by_topic: dict[str, list[tuple[int, OffsetAndMetadata]]] = {}
        for tp, offset in offsets.items():
            by_topic.setdefault(tp.topic, []).append((tp.partition, offset))

        def build_commit(connection: BrokerConnection) -> Any:
            version = connection.version(
                ApiKey.OFFSET_COMMIT, OFFSET_COMMIT_MAX_VERSION, OFFSET_COMMIT_MIN_VERSION
            )
            module = request_module(ApiKey.OFFSET_COMMIT, version)
            return build(
                module.OffsetCommitRequest,
                group_id=self.group_id,
                generation_id_or_member_epoch=generation.generation_id,
                member_id=generation.member_id,
                group_instance_id=self.group_instance_id if generation.is_valid else None,
                retention_time=_ms(-1),
                topics=tuple(
                    build(
                        module.OffsetCommitRequestTopic,
                        name=topic,
                        partitions=tuple(
                            build(
                                module.OffsetCommitRequestPartition,
                                partition_index=partition,
                                committed_offset=offset.offset,
                                committed_leader_epoch=-1
                                if offset.leader_epoch is None
                                else offset.leader_epoch,
                                committed_metadata=offset.metadata,
                            )
                            for partition, offset in partitions
                        ),
                    )
                    for topic, partitions in by_topic.items()
                ),
            )

        response = await self._send(build_commit)
        for topic in response.topics:
            for partition in topic.partitions:
                error = ErrorCode(partition.error_code)
                if error == ErrorCode.none:
                    continue
                context = f"OffsetCommit({self.group_id}, {topic.name}-{partition.partition_index})"
                if error in _GENERATION_ERRORS or error == ErrorCode.rebalance_in_progress:
                    if error in _GENERATION_ERRORS:
                        self.reset_generation()
                    else:
                        self.request_rejoin("OffsetCommit answered REBALANCE_IN_PROGRESS")
                    raise CommitFailedError(
                        f"{context}: {error.name.upper()}: the group rebalanced and this member's partitions may "
                        "belong to another member now; poll() to rejoin",
                        error,
                    )
                if error == ErrorCode.fenced_instance_id:
                    self._fail(KafkaException.from_code(error, context))
                    raise CommitFailedError(f"{context}: FENCED_INSTANCE_ID", error)
                self._check_coordinator_error(error, "OffsetCommit")
                if error == ErrorCode.request_timed_out:
                    self.mark_coordinator_unknown("OffsetCommit timed out")
                raise KafkaException.from_code(error, context)

    async def fetch_committed_offsets(
        self, partitions: set[TopicPartition], timeout: float
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """OffsetFetch (require_stable: wait out pending transactional commits), retried until ``timeout``."""
        if not partitions:
            return {}
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        try:
            async with asyncio.timeout(timeout):
                attempt = 0
                while True:
                    try:
                        return await self._fetch_committed_once(partitions, deadline)
                    except KafkaException as exc:
                        if not exc.retriable:
                            raise
                        last_error = exc
                        if time.monotonic() >= deadline:
                            break
                        await self.client.backoff(min(attempt, 4))
                        attempt += 1
        except TimeoutError:
            pass
        raise KafkaTimeoutError(
            f"committed offsets not fetched within {timeout * 1000:.0f} ms"
            + (f": {last_error}" if last_error is not None else "")
        )

    async def _fetch_committed_once(
        self, partitions: set[TopicPartition], deadline: float
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        await self.ensure_coordinator_ready(deadline)
        by_topic: dict[str, list[int]] = {}
        for tp in sorted(partitions):
            by_topic.setdefault(tp.topic, []).append(tp.partition)

        def build_fetch(connection: BrokerConnection) -> Any:
            version = connection.version(
                ApiKey.OFFSET_FETCH, OFFSET_FETCH_MAX_VERSION, OFFSET_FETCH_MIN_VERSION
            )
            module = request_module(ApiKey.OFFSET_FETCH, version)
            if version >= 8:
                topics = tuple(
                    module.OffsetFetchRequestTopics(name=t, partition_indexes=tuple(p))
                    for t, p in by_topic.items()
                )
                group = build(
                    module.OffsetFetchRequestGroup,
                    group_id=self.group_id,
                    member_id=None,
                    member_epoch=-1,
                    topics=topics,
                )
                return module.OffsetFetchRequest(groups=(group,), require_stable=True)
            return build(
                module.OffsetFetchRequest,
                group_id=self.group_id,
                topics=tuple(
                    module.OffsetFetchRequestTopic(name=t, partition_indexes=tuple(p))
                    for t, p in by_topic.items()
                ),
                require_stable=True,
            )

        response = await self._send(build_fetch)
        if hasattr(response, "groups"):
            (group,) = response.groups
            top_error, topics = ErrorCode(group.error_code), group.topics
        else:
            top_error, topics = ErrorCode(getattr(response, "error_code", ErrorCode.none)), response.topics
        if top_error != ErrorCode.none:
            self._check_coordinator_error(top_error, "OffsetFetch")
            raise KafkaException.from_code(top_error, f"OffsetFetch({self.group_id})")
        found: dict[TopicPartition, OffsetAndMetadata | None] = {}
        for topic in topics:
            for partition in topic.partitions:
                tp = TopicPartition(topic.name, partition.partition_index)
                error = ErrorCode(partition.error_code)
                if error == ErrorCode.unknown_topic_or_partition:
                    found[tp] = None
                    continue
                if error != ErrorCode.none:
                    raise KafkaException.from_code(error, f"OffsetFetch({self.group_id}, {tp})")
                offset = int(partition.committed_offset)
                epoch = int(getattr(partition, "committed_leader_epoch", -1))
                found[tp] = (
                    OffsetAndMetadata(offset, partition.metadata or "", epoch if epoch >= 0 else None)
                    if offset >= 0
                    else None
                )
        return found


def _partition_counts(cluster: Cluster, topics: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for topic in topics:
        metadata = cluster.topics.get(topic)
        if metadata is not None and metadata.partitions:
            counts[topic] = len(metadata.partitions)
    return counts
