"""The controller's duties, in the broker that holds /controller: its election and resignation,
and what it does for every event -- broker membership, new topics and partitions, deletions,
controlled shutdowns, reassignments, preferred leader elections, config change purges. Every event
recomputes from ZooKeeper what it acts on, so running it again after a failure half-way (or twice)
finishes the job."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import replace
from functools import partial

from kazoo.exceptions import BadVersionError, KazooException, SessionExpiredError

from strom.broker.config import KafkaConfig
from strom.broker.control_plane.controller.decisions import (
    NO_LEADER,
    decide_controlled_shutdown,
    decide_on_membership,
    decide_preferred_leader,
    first,
    initial_leader_and_isr,
)
from strom.broker.control_plane.controller.events import EventQueue, Handler, retry_backoff
from strom.broker.control_plane.controller.requests import ControlledShutdownReport
from strom.broker.control_plane.controller.writer import (
    ControllerMovedError,
    Decide,
    DutyStats,
    FencedWriter,
    UnparseableZnodes,
    chunked,
    state_change_notification,
)
from strom.broker.zk import znodes
from strom.broker.zk.client import (
    AsyncZooKeeper,
    Create,
    Delete,
    MultiOpFailed,
    NodeExistsError,
    NoNodeError,
    SessionState,
    SetData,
    Watch,
    ZnodeStat,
)

log = logging.getLogger("strom.broker.control_plane.controller")

UNCLEAN_KEY = "unclean.leader.election.enable"
# Kafka's ZkNodeChangeNotificationListener: change notifications older than this are purged.
CONFIG_CHANGE_EXPIRATION_MS = 15 * 60 * 1000
# Partition-state change notifications (/isr_change_notification) older than this are purged: every
# connected broker has read them by then, and one that was disconnected re-reads every state.
ISR_CHANGE_EXPIRATION_MS = 60 * 1000
ISR_CHANGE_PURGE_INTERVAL_S = 30.0


class Controller:
    """Contends for /controller and, while it holds it, does the controller's duties."""

    def __init__(self, zk: AsyncZooKeeper, broker_id: int, config: KafkaConfig) -> None:
        self._zk = zk
        self._broker_id = broker_id
        self._config = config
        self._events = EventQueue(self._on_event_failed, lambda: self._epoch, self._on_event_done)
        self._stats = DutyStats()  # what the running event did, logged when it ends
        self._started = False
        self._stopped = False
        self._active = False
        self._epoch = -1
        self._writer: FencedWriter | None = None  # the writes of the term won
        self._controller_watch: Watch | None = None
        self._duty_watches: list[Watch] = []
        self._topic_watches: dict[str, Watch] = {}
        self._timers: list[asyncio.Task[None]] = []  # periodic duties of this term
        # Cluster view while active (rebuilt at every election).
        self._live: dict[int, int] = {}  # broker id -> broker epoch (czxid of its registration)
        self._topics: dict[str, znodes.TopicZNode] = {}
        # The id each topic had when last read with one: an old tool that rewrites a topic znode
        # without it (Kafka 2.x's format) gets the same id written back, not a new one.
        self._topic_ids: dict[str, uuid.UUID] = {}
        self._with_state: dict[str, set[int]] = {}  # partitions whose state znode exists
        self._shutting_down: set[int] = set()
        # Reassigning partitions: a watch on each one's state, to finish when the targets are in sync.
        self._reassignment_watches: dict[tuple[str, int], Watch] = {}
        # Znodes that could not be parsed (each logged once): skipped, everything else goes on.
        self._unparseable = UnparseableZnodes()

    @property
    def active(self) -> bool:
        return self._active

    @property
    def unparseable_znodes(self) -> int:
        """How many znodes the controller skips because it cannot parse them."""
        return len(self._unparseable)

    @property
    def epoch(self) -> int:
        return self._epoch if self._active else -1

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        self._zk.add_session_listener(self._on_session_event)
        self._events.start(f"controller-{self._broker_id}")
        self._events.put("startup", self._startup)

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._controller_watch is not None:
            self._controller_watch.cancel()
        await self._events.stop(5.0)
        with contextlib.suppress(KazooException, asyncio.CancelledError):
            await self._resign("stopped")

    # -- events ------------------------------------------------------------------------------

    def _on_event_done(self, name: str, ms: float) -> None:
        """One line per event: at INFO for those that read or wrote partition states."""
        stats = self._stats
        (log.info if stats.read or stats.written else log.debug)(
            "controller duty",
            extra={
                "duty": name,
                "ms": round(ms, 1),
                "states_read": stats.read,
                "states_written": stats.written,
                "multis": stats.multis,
                "states_retried": stats.retried,
                "controller_epoch": self._epoch,
            },
        )
        stats.read = stats.written = stats.multis = stats.retried = 0

    async def _on_event_failed(
        self, name: str, handler: Handler, error: Exception, failures: int, term: int
    ) -> None:
        self._stats.read = self._stats.written = self._stats.multis = self._stats.retried = 0
        if isinstance(error, ControllerMovedError):
            log.info(
                "controller fenced, resigning", extra={"broker_id": self._broker_id, "reason": str(error)}
            )
            await self._resign_safely("fenced")
            self._events.put("check-controller", self._check_controller)
            return
        # ZooKeeper unreachable for a moment, most likely: every handler recomputes from ZooKeeper
        # what it acts on, so running it again later finishes the job. A handler of an older term
        # is dropped.
        delay = retry_backoff(failures)
        log.warning(
            "controller event failed, retrying",
            extra={"event": name, "error": repr(error), "retry_in_s": delay},
            exc_info=failures == 1 and not isinstance(error, KazooException),
        )
        if name in ("startup", "check-controller") or (self._active and self._epoch == term):
            self._events.put_later(delay, name, handler)

    # -- election ------------------------------------------------------------------------------

    async def _startup(self) -> None:
        if self._controller_watch is None:
            self._controller_watch = await self._zk.watch_data(znodes.CONTROLLER, self._on_controller_change)
        await self._check_controller()

    def _on_controller_change(self, _data: bytes | None, _stat: ZnodeStat | None) -> None:
        self._events.put("check-controller", self._check_controller)

    def _on_session_event(self, state: str) -> None:
        if state == SessionState.EXPIRED:
            if self._active:
                # Stop acting at once; the cleanup runs on the event task.
                self._active = False
                log.info("controller session expired, resigning", extra={"broker_id": self._broker_id})
                self._events.put("resign", self._resign_expired)
        elif state == SessionState.CONNECTED:
            self._events.put("check-controller", self._check_controller)
            if self._active:
                # A children watch re-established on the same children says nothing; a broker may
                # have restarted (a new czxid) while this session was disconnected.
                self._events.put("broker-change", self._on_brokers_changed)

    async def _check_controller(self) -> None:
        """Resign if /controller is no longer ours; contend if there is none."""
        got = await self._zk.get_or_none(znodes.CONTROLLER)
        if got is not None:
            ours = self._owns(got)
            if self._active and not ours:
                log.info(
                    "controller znode is no longer ours, resigning", extra={"broker_id": self._broker_id}
                )
                await self._resign("controller moved")
            elif not self._active and ours:
                # Ours but not acting on it -- an election whose answer was lost with the connection,
                # or a resignation that could not delete it: free it (its deletion calls us back).
                with contextlib.suppress(NoNodeError, BadVersionError):
                    await self._zk.delete(znodes.CONTROLLER, got[1].version)
            return
        if self._active:
            await self._resign("controller znode gone")
        if not self._stopped:
            await self._elect()

    def _owns(self, got: tuple[bytes, ZnodeStat]) -> bool:
        data, stat = got
        try:
            broker = znodes.ControllerZNode.decode(data).broker_id
        except (ValueError, KeyError):
            return False
        return broker == self._broker_id and stat.ephemeralOwner == self._zk.session_id

    async def _elect(self) -> None:
        epoch_znode = await self._zk.get_or_none(znodes.CONTROLLER_EPOCH)
        if epoch_znode is None:
            with contextlib.suppress(NodeExistsError):
                await self._zk.create(znodes.CONTROLLER_EPOCH, znodes.encode_controller_epoch(0))
            epoch_znode = await self._zk.get(znodes.CONTROLLER_EPOCH)
        epoch = znodes.decode_controller_epoch(epoch_znode[0]) + 1
        session_id = self._zk.session_id
        try:
            results = await self._zk.multi(
                [
                    Create(
                        znodes.CONTROLLER, znodes.ControllerZNode(self._broker_id).encode(), ephemeral=True
                    ),
                    SetData(
                        znodes.CONTROLLER_EPOCH, znodes.encode_controller_epoch(epoch), epoch_znode[1].version
                    ),
                ]
            )
        except MultiOpFailed as e:
            # Another broker won (its /controller watch event follows), or bumped the epoch first.
            log.debug(
                "lost controller election", extra={"broker_id": self._broker_id, "cause": repr(e.cause)}
            )
            if isinstance(e.cause, BadVersionError):
                self._events.put("check-controller", self._check_controller)
            return
        self._epoch = epoch
        self._writer = FencedWriter(
            self._zk, epoch, results[1].version, session_id, self._unparseable, self._stats
        )
        self._active = True
        log.info(
            "elected controller",
            extra={
                "broker_id": self._broker_id,
                "controller_epoch": epoch,
                "epoch_zk_version": results[1].version,
            },
        )
        try:
            await self._on_become_controller()
        except BaseException:
            # Half-started duties are no duties: give the term up (the event is retried).
            await self._resign_safely("failed to start the controller's duties")
            raise

    async def _resign_expired(self) -> None:
        # The expired session took its ephemeral /controller with it. Until kazoo has a new
        # session, ZooKeeper calls fail with SessionExpiredError: the duties are stopped by then,
        # and there is nothing left in ZooKeeper to clean up.
        with contextlib.suppress(SessionExpiredError):
            await self._resign("session expired")

    async def _resign_safely(self, reason: str) -> None:
        try:
            await self._resign(reason)
        except KazooException as e:
            log.warning("controller resignation could not clean up", extra={"error": repr(e)})

    async def _resign(self, reason: str) -> None:
        """Stop the duties and delete /controller if it is still ours (at the version read)."""
        was_active = self._active or self._epoch >= 0
        self._active = False
        for watch in [
            *self._duty_watches,
            *self._topic_watches.values(),
            *self._reassignment_watches.values(),
        ]:
            watch.cancel()
        self._duty_watches.clear()
        self._topic_watches.clear()
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        self._live.clear()
        self._topics.clear()
        self._topic_ids.clear()
        self._with_state.clear()
        self._shutting_down.clear()
        self._reassignment_watches.clear()
        if was_active:
            log.info(
                "resigned as controller",
                extra={"broker_id": self._broker_id, "controller_epoch": self._epoch, "reason": reason},
            )
        self._epoch = -1
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        got = await self._zk.get_or_none(znodes.CONTROLLER)
        if got is not None and self._owns(got):
            with contextlib.suppress(NoNodeError, BadVersionError):
                await self._zk.delete(znodes.CONTROLLER, got[1].version)

    def _fenced(self) -> FencedWriter:
        """The writer of this term; ControllerMovedError once it is over."""
        if not self._active or self._writer is None:
            raise ControllerMovedError("not the controller")
        return self._writer

    # -- becoming controller -------------------------------------------------------------------

    async def _on_become_controller(self) -> None:
        for path in (
            znodes.BROKER_IDS,
            znodes.TOPICS,
            znodes.DELETE_TOPICS,
            znodes.CONTROLLED_SHUTDOWN,
            znodes.CONFIG_CHANGES,
            znodes.ISR_CHANGE_NOTIFICATION,
        ):
            await self._zk.ensure_path(path)
        self._live = await self._read_live_brokers()
        topics = sorted(await self._zk.get_children(znodes.TOPICS))
        for topic, got in zip(
            topics, await self._zk.get_many([znodes.topic_path(t) for t in topics]), strict=True
        ):
            self._take_topic(topic, got)
        # Brokers may have come and gone while there was no controller: bring every partition in
        # line with today's membership, and create the states a previous controller left missing
        # (the reconciliation read which exist).
        states = await self._reconcile(self._all_partitions(), "controller failover", set(self._live))
        for (topic, partition), state in states.items():
            if state is not None:
                self._with_state.setdefault(topic, set()).add(partition)
        await self._create_missing_states(list(self._topics))
        self._duty_watches += [
            await self._zk.watch_children(
                znodes.BROKER_IDS, lambda _: self._events.put("broker-change", self._on_brokers_changed)
            ),
            await self._zk.watch_children(
                znodes.TOPICS, lambda _: self._events.put("topics-change", self._on_topics_changed)
            ),
            await self._zk.watch_children(
                znodes.DELETE_TOPICS, lambda _: self._events.put("topic-deletion", self._on_topic_deletion)
            ),
            await self._zk.watch_children(
                znodes.CONTROLLED_SHUTDOWN,
                lambda _: self._events.put("controlled-shutdown", self._on_controlled_shutdown),
            ),
            await self._zk.watch_data(znodes.PREFERRED_REPLICA_ELECTION, self._on_preferred_election_znode),
            await self._zk.watch_data(znodes.REASSIGN_PARTITIONS, self._on_reassignment_znode),
            await self._zk.watch_children(
                znodes.CONFIG_CHANGES,
                lambda _: self._events.put("config-change-purge", self._purge_config_changes),
            ),
        ]
        await self._on_topics_changed()
        # Reassignments a previous controller left in progress (KIP-455: the topic znodes hold them).
        for topic, znode in self._topics.items():
            for partition in sorted(set(znode.adding_replicas) | set(znode.removing_replicas)):
                await self._watch_reassignment(topic, partition)
        if self._config.auto_leader_rebalance_enable:
            interval = max(1, self._config.leader_imbalance_check_interval_seconds)
            self._every(interval, "auto-rebalance", self._check_imbalance)
        self._every(ISR_CHANGE_PURGE_INTERVAL_S, "isr-change-purge", self._purge_isr_change_notifications)

    def _every(self, interval_s: float, name: str, handler: Handler) -> None:
        """Queue ``handler`` every ``interval_s`` while this term lasts."""

        async def timer() -> None:
            while True:
                await asyncio.sleep(interval_s)
                self._events.put(name, handler)

        self._timers.append(asyncio.get_running_loop().create_task(timer(), name=f"controller-{name}"))

    # -- brokers ---------------------------------------------------------------------------------

    async def _read_live_brokers(self) -> dict[int, int]:
        ids = [int(child) for child in await self._zk.get_children(znodes.BROKER_IDS) if child.isdigit()]
        registrations = await self._zk.get_many([znodes.broker_path(b) for b in ids])
        return {b: got[1].czxid for b, got in zip(ids, registrations, strict=True) if got is not None}

    async def _on_brokers_changed(self) -> None:
        """Bring the partitions of every broker that died, restarted or joined in line with the
        registrations in ZooKeeper. ``_live`` is the membership the partitions were last brought in
        line with, and it moves only once they are: an event that fails half-way (or a duplicate)
        finds the same difference again and finishes the job."""
        if not self._active:
            return
        before = self._live
        after = await self._read_live_brokers()
        dead = {b for b in before if b not in after}
        restarted = {b for b in before if b in after and after[b] != before[b]}
        joined = {b for b in after if b not in before}
        if not (dead or restarted or joined):
            return
        log.info(
            "broker membership changed",
            extra={
                "dead": sorted(dead),
                "restarted": sorted(restarted),
                "joined": sorted(joined),
                "live": sorted(after),
            },
        )
        self._shutting_down -= dead | restarted
        if dead or restarted:
            # A restarted broker lost whatever it had not flushed: it fails first (it leaves every
            # ISR and gives up leadership), then joins as new.
            gone = dead | restarted
            await self._reconcile(self._partitions_of(gone), "broker failure", set(after) - restarted)
        if joined or restarted:
            # Partitions created while no replica was live wait for one in their ISR: they are among
            # the partitions of the brokers that joined.
            await self._reconcile(self._partitions_of(joined | restarted), "broker startup", set(after))
        self._live = after

    def _partitions_of(self, brokers: set[int]) -> list[tuple[str, int]]:
        return [
            (topic, p)
            for topic, znode in self._topics.items()
            for p, replicas in znode.partitions.items()
            if brokers & set(replicas)
        ]

    def _all_partitions(self) -> list[tuple[str, int]]:
        return [(topic, p) for topic, znode in self._topics.items() for p in znode.partitions]

    async def _reconcile(
        self, partitions: list[tuple[str, int]], why: str, live: set[int]
    ) -> dict[tuple[str, int], znodes.LeaderAndIsr | None]:
        unclean = await self._unclean_allowed(sorted({t for t, _ in partitions if t in self._topics}))
        decisions: dict[tuple[str, int], Decide] = {}
        for topic, partition in partitions:
            replicas = self._topics[topic].partitions.get(partition, []) if topic in self._topics else []
            if replicas:
                decisions[(topic, partition)] = partial(
                    decide_on_membership,
                    replicas,
                    live=live,
                    shutting_down=self._shutting_down,
                    unclean=unclean[topic],
                    controller_epoch=self._epoch,
                )
        return await self._fenced().update_states(decisions, why)

    async def _unclean_allowed(self, topics: list[str]) -> dict[str, bool]:
        """unclean.leader.election.enable of each topic (its /config/topics override), else the broker's."""
        paths = [znodes.topic_config_path(topic) for topic in topics]
        allowed: dict[str, bool] = {}
        for topic, path, got in zip(topics, paths, await self._zk.get_many(paths), strict=True):
            try:
                override = znodes.EntityConfigZNode.decode(got[0] if got else None).config.get(UNCLEAN_KEY)
            except znodes.MALFORMED as e:
                self._unparseable.skip(path, e)
                override = None
            else:
                self._unparseable.parsed(path)
            if override is not None:
                allowed[topic] = override.strip().lower() == "true"
            else:
                allowed[topic] = bool(self._config.unclean_leader_election_enable)
        return allowed

    # -- topics ----------------------------------------------------------------------------------

    async def _read_topic(self, topic: str) -> tuple[znodes.TopicZNode, int] | None:
        """The topic's znode and its version; None (and out of the controller's view) when it is gone
        or cannot be parsed -- skipped, never taken for deleted: only a deletion request deletes."""
        return self._take_topic(topic, await self._zk.get_or_none(znodes.topic_path(topic)))

    def _take_topic(
        self, topic: str, got: tuple[bytes, ZnodeStat] | None
    ) -> tuple[znodes.TopicZNode, int] | None:
        znode = self._unparseable.topic(topic, got[0]) if got is not None and got[0] else None
        if got is None or znode is None:
            self._topics.pop(topic, None)
            self._with_state.pop(topic, None)
            return None
        self._topics[topic] = znode
        if znode.topic_id is not None:
            self._topic_ids[topic] = znode.topic_id
        return znode, got[1].version

    async def _on_topics_changed(self) -> None:
        if not self._active:
            return
        topics = set(await self._zk.get_children(znodes.TOPICS))
        for topic in [t for t in self._topic_watches if t not in topics]:
            self._topic_watches.pop(topic).cancel()
            self._topics.pop(topic, None)
            self._topic_ids.pop(topic, None)
            self._with_state.pop(topic, None)
        for topic in sorted(topics - set(self._topic_watches)):
            # The watch's first call queues the topic's event, which creates its partitions' states.
            self._topic_watches[topic] = await self._zk.watch_data(
                znodes.topic_path(topic), partial(self._on_topic_znode, topic)
            )

    def _on_topic_znode(self, topic: str, _data: bytes | None, _stat: ZnodeStat | None) -> None:
        self._events.put("topic-change", partial(self._on_topic_changed, topic))

    async def _on_topic_changed(self, topic: str) -> None:
        if not self._active:
            return
        read = await self._read_topic(topic)
        if read is None:
            return
        if read[0].topic_id is None:
            await self._assign_topic_id(topic, *read)
        await self._create_missing_states([topic])

    async def _assign_topic_id(self, topic: str, znode: znodes.TopicZNode, version: int) -> None:
        """A topic znode without an id (Kafka 2.x's format, as its ``--zookeeper`` tools write it)
        gets one, as Kafka 2.8+'s controller gives it -- the id the topic had if this controller
        knew one (an old tool rewrote the znode), else a new one: written back at the version read,
        so an id another writer set meanwhile is kept (the topic's watch brings it back here)."""
        topic_id = self._topic_ids.get(topic) or uuid.uuid4()
        new = replace(znode, topic_id=topic_id)
        try:
            await self._fenced().write([SetData(znodes.topic_path(topic), new.encode(), version)])
        except MultiOpFailed as e:
            if isinstance(e.cause, (BadVersionError, NoNodeError)):
                return
            raise
        self._topics[topic] = new
        self._topic_ids[topic] = topic_id
        log.info(
            "topic id assigned",
            extra={"topic": topic, "topic_id": znodes.encode_uuid(topic_id), "controller_epoch": self._epoch},
        )

    async def _create_missing_states(self, topics: list[str]) -> None:
        live = set(self._live)
        candidates = [topic for topic in topics if topic in self._topics]
        requests = await self._zk.get_many([znodes.delete_topic_path(topic) for topic in candidates])
        missing: dict[str, list[tuple[int, list[int]]]] = {}
        for topic, request in zip(candidates, requests, strict=True):
            known = self._with_state.setdefault(topic, set())
            partitions = [(p, r) for p, r in sorted(self._topics[topic].partitions.items()) if p not in known]
            if request is None and partitions:  # else being deleted: no new partitions for it
                missing[topic] = partitions
        # Which partitions have their znode already, and of those which have a state (a previous
        # controller, or an earlier try, created it): each level read in one pipeline.
        topics = list(missing)
        children = await self._zk.get_children_many([znodes.partitions_path(t) for t in topics])
        parents = {
            t: {int(c) for c in names if c.isdigit()} if names is not None else None
            for t, names in zip(topics, children, strict=True)
        }
        keys = [(t, p) for t in topics for p, _ in missing[t] if p in (parents[t] or ())]
        states = await self._zk.get_many([znodes.partition_state_path(t, p) for t, p in keys])
        self._stats.read += len(keys)
        existing = {key for key, got in zip(keys, states, strict=True) if got is not None}
        for topic in topics:
            known = self._with_state[topic]
            known.update(p for p, _ in missing[topic] if (topic, p) in existing)
            # A new topic's partitions come online together, in one fenced multi-op per chunk (as
            # Kafka's controller creates them in one batch): a client never sees some led and others
            # not. A chunk that meets a znode created meanwhile makes the topic look again.
            todo = [(p, r) for p, r in missing[topic] if (topic, p) not in existing]
            # Per partition: its znode, its state znode and its entry in the notification.
            size = 3 * len(znodes.partition_state_path(topic, 0)) + 160
            chunks = chunked(todo, partial(_constant, size))
            topic_parents = parents[topic]
            if topic_parents is None and chunks:
                # The chunk that creates the topic's partitions znode goes first, alone.
                created = await self._create_states(topic, chunks.pop(0), live, None)
                if created is None:
                    await self._create_missing_states([topic])
                    continue
                if not created:
                    continue  # the topic is gone
                known.update(created)
                topic_parents = set(created)
            # The rest together: ZooKeeper commits them to its log together.
            results = await asyncio.gather(
                *(self._create_states(topic, chunk, live, topic_parents) for chunk in chunks)
            )
            for created in results:
                known.update(created or ())
            if any(created is None for created in results):
                await self._create_missing_states([topic])

    def _state_creation_ops(
        self, topic: str, partitions: list[tuple[int, list[int]]], live: set[int], parents: set[int] | None
    ) -> tuple[list[Create | SetData | Delete], list[tuple[int, znodes.LeaderAndIsr]]]:
        """``parents``: the partitions whose znode exists (None: not even the topic's partitions
        znode). The parents are created in the same fenced multi-op: creating them with makepath
        could bring back a topic deleted meanwhile (as an empty znode)."""
        ops: list[Create | SetData | Delete] = []
        states = []
        if parents is None:
            ops.append(Create(znodes.partitions_path(topic)))
        for partition, replicas in partitions:
            if partition not in (parents or ()):
                ops.append(Create(znodes.partition_path(topic, partition)))
            state = initial_leader_and_isr(replicas, live, self._epoch)
            ops.append(Create(znodes.partition_state_path(topic, partition), state.encode()))
            states.append((partition, state))
        ops.append(state_change_notification([(topic, partition) for partition, _ in states]))
        return ops, states

    async def _create_states(
        self, topic: str, partitions: list[tuple[int, list[int]]], live: set[int], parents: set[int] | None
    ) -> list[int] | None:
        """Create the state znodes of ``partitions`` in one multi-op; the partitions created ([] if the
        topic is gone), or None when one of them exists already (the caller looks again)."""
        ops, states = self._state_creation_ops(topic, partitions, live, parents)
        try:
            await self._fenced().write(ops)
        except MultiOpFailed as e:
            if isinstance(e.cause, NodeExistsError):
                return None
            if isinstance(e.cause, NoNodeError):
                return []  # the topic znode went away meanwhile
            raise
        self._stats.written += len(states)
        self._stats.multis += 1
        for partition, state in states:
            self._log_created(topic, partition, state)
        return [partition for partition, _ in states]

    def _log_created(self, topic: str, partition: int, state: znodes.LeaderAndIsr) -> None:
        log.debug(
            "partition created",
            extra={
                "topic": topic,
                "partition": partition,
                "leader": state.leader,
                "isr": state.isr,
                "controller_epoch": self._epoch,
            },
        )

    # -- topic deletion --------------------------------------------------------------------------

    async def _on_topic_deletion(self) -> None:
        if not self._active:
            return
        for topic in sorted(await self._zk.get_children(znodes.DELETE_TOPICS)):
            await self._delete_topic(topic)

    async def _delete_topic(self, topic: str) -> None:
        """Delete the topic's znodes -- partition states, the topic, its config -- and the request:
        the partitions' znodes bottom-up in fenced multi-ops under ZooKeeper's request limit, then the
        topic znode, its config and the request in the last one, so brokers see the topic vanish at
        once (a deletion stopped half-way leaves the topic and the request, and is done again)."""
        topic_path = znodes.topic_path(topic)
        paths = await self._subtree_bottom_up(topic_path)
        last: list[Create | SetData | Delete] = []
        if paths and paths[-1] == topic_path:
            paths.pop()
            last.append(Delete(topic_path))
        if await self._zk.exists(znodes.topic_config_path(topic)) is not None:
            last.append(Delete(znodes.topic_config_path(topic)))
        last.append(Delete(znodes.delete_topic_path(topic)))
        try:
            for chunk in chunked(paths, lambda path: len(path) + 32):
                await self._fenced().write([Delete(path) for path in chunk])
            await self._fenced().write(last)
        except MultiOpFailed:
            # The tree changed while it was read (a partition being created, the request withdrawn):
            # look again.
            self._events.put_later(retry_backoff(1), "topic-deletion", self._on_topic_deletion)
            return
        if topic in self._topic_watches:
            self._topic_watches.pop(topic).cancel()
        self._topics.pop(topic, None)
        self._topic_ids.pop(topic, None)
        self._with_state.pop(topic, None)
        log.info(
            "topic deleted",
            extra={"topic": topic, "znodes": len(paths) + len(last), "controller_epoch": self._epoch},
        )

    async def _subtree_bottom_up(self, path: str) -> list[str]:
        """``path`` and every znode below it, children before parents ([] if there is no ``path``);
        each level read in one pipeline."""
        levels = [[path]]
        while levels[-1]:
            children = await self._zk.get_children_many(levels[-1])
            found = [(p, names) for p, names in zip(levels[-1], children, strict=True) if names is not None]
            levels[-1] = [p for p, _ in found]
            levels.append([f"{p}/{name}" for p, names in found for name in names])
        return [p for level in reversed(levels) for p in level]

    # -- controlled shutdown ---------------------------------------------------------------------

    async def _on_controlled_shutdown(self) -> None:
        if not self._active:
            return
        for child in sorted(await self._zk.get_children(znodes.CONTROLLED_SHUTDOWN)):
            if child.isdigit():
                await self._controlled_shutdown(int(child))

    async def _controlled_shutdown(self, broker: int) -> None:
        path = znodes.controlled_shutdown_path(broker)
        got = await self._zk.get_or_none(path)
        if got is None:
            return
        request = _shutdown_request(broker, got[0])
        if request.controller_epoch == self._epoch:
            return  # answered already (a duplicate event): a broker that wants another look asks anew
        if broker not in self._live:
            return  # not registered: nothing leads there, and its request goes with its session
        self._shutting_down.add(broker)
        live = set(self._live)
        leaders_remaining = isr_remaining = 0
        decisions: dict[tuple[str, int], Decide] = {
            (topic, partition): partial(
                decide_controlled_shutdown,
                self._topics[topic].partitions[partition],
                broker=broker,
                live=live,
                shutting_down=self._shutting_down,
                controller_epoch=self._epoch,
            )
            for topic, partition in self._partitions_of({broker})
        }
        states = await self._fenced().update_states(decisions, "controlled shutdown")
        for (topic, partition), state in sorted(states.items()):
            if state is None:
                continue
            replicas = self._topics[topic].partitions[partition]
            others = [b for b in replicas if b != broker and b in live and b not in self._shutting_down]
            if state.leader == broker and others:
                # Another live replica could still take over (once in the ISR): worth a retry.
                # A partition with no other live replica holds no shutdown up: waiting cannot help.
                leaders_remaining += 1
            elif (
                broker in state.isr
                and state.leader != broker
                and any(b in live for b in state.isr if b != broker)
            ):
                isr_remaining += 1
        log.info(
            "controlled shutdown",
            extra={"broker": broker, "leaders_remaining": leaders_remaining, "isr_remaining": isr_remaining},
        )
        # The answer goes to the request there now: one the broker made anew while this pass ran
        # (its wait ran out first) gets it too, or the broker would ask again for ever whenever a
        # pass takes longer than its wait.
        got = await self._zk.get_or_none(path)
        if got is None:
            return  # withdrawn
        report = replace(
            _shutdown_request(broker, got[0]),
            controller_epoch=self._epoch,
            leaders_remaining=leaders_remaining,
            isr_remaining=isr_remaining,
            done=leaders_remaining == 0 and isr_remaining == 0,
        )
        with contextlib.suppress(MultiOpFailed):  # withdrawn or made anew meanwhile: its own event
            await self._fenced().write([SetData(path, report.encode(), got[1].version)])

    # -- partition reassignment (KIP-455 in the topic znode) -------------------------------------

    def _on_reassignment_znode(self, data: bytes | None, _stat: ZnodeStat | None) -> None:
        if data is not None:
            self._events.put("reassignment", self._on_reassignment_request)

    async def _on_reassignment_request(self) -> None:
        """Start every reassignment of /admin/reassign_partitions, then delete it: from then on the
        topic znodes (replicas with adding_replicas/removing_replicas) hold the reassignments. The
        request goes only once every partition of it has started (or cannot be), so a failure half-way
        leaves it for the retry; starting a partition again is a no-op."""
        if not self._active:
            return
        got = await self._zk.get_or_none(znodes.REASSIGN_PARTITIONS)
        if got is None:
            return
        try:
            requests = znodes.decode_reassignment(got[0])
        except znodes.MALFORMED as e:
            self._unparseable.skip(znodes.REASSIGN_PARTITIONS, e)
            requests = []
        for request in requests:
            await self._start_reassignment(request.topic, request.partition, request.replicas)
        with contextlib.suppress(MultiOpFailed):  # a new request replaced it meanwhile: its own event
            await self._fenced().write([Delete(znodes.REASSIGN_PARTITIONS, got[1].version)])

    async def _start_reassignment(self, topic: str, partition: int, target: list[int]) -> None:
        """Kafka's phase one: replicas = target + original (new replicas start following), adding =
        target - original, removing = original - target; the leader epoch moves in the same write so
        the leader knows. After a BadVersion (the topic or the partition's state changed meanwhile)
        read and decide again."""
        while True:
            topic_got = await self._zk.get_or_none(znodes.topic_path(topic))
            znode = self._unparseable.topic(topic, topic_got[0]) if topic_got is not None else None
            current = znode.partitions.get(partition) if znode is not None else None
            if (
                topic_got is None
                or znode is None
                or current is None
                or not target
                or len(set(target)) != len(target)
            ):
                log.warning(
                    "ignoring a reassignment",
                    extra={"topic": topic, "partition": partition, "replicas": target},
                )
                return
            adding_now = znode.adding_replicas.get(partition, [])
            original = [b for b in current if b not in adding_now]  # a reassignment in progress is replaced
            replicas = target + [b for b in original if b not in target]
            adding = [b for b in target if b not in original]
            removing = [b for b in original if b not in target]
            new = replace(
                znode,
                partitions={**znode.partitions, partition: replicas},
                adding_replicas=_with(znode.adding_replicas, partition, adding),
                removing_replicas=_with(znode.removing_replicas, partition, removing),
            )
            if new == znode:
                break  # started already (a retried request)
            ops: list[Create | SetData | Delete] = [
                SetData(znodes.topic_path(topic), new.encode(), topic_got[1].version)
            ]
            state_path = znodes.partition_state_path(topic, partition)
            state_got = await self._zk.get_or_none(state_path)
            state = self._unparseable.state(state_path, state_got[0]) if state_got is not None else None
            if state_got is not None and state is not None:
                # A replica the reassignment no longer names (a cancelled one's additions) leaves
                # the ISR, unless it leads or nothing else is left in it.
                isr = [b for b in state.isr if b in replicas]
                bumped = replace(
                    state,
                    isr=isr if isr and (state.leader in isr or state.leader == NO_LEADER) else state.isr,
                    leader_epoch=state.leader_epoch + 1,
                    controller_epoch=self._epoch,
                )
                ops += [
                    SetData(state_path, bumped.encode(), state_got[1].version),
                    state_change_notification([(topic, partition)]),
                ]
            try:
                await self._fenced().write(ops)
            except MultiOpFailed as e:
                if isinstance(e.cause, (BadVersionError, NoNodeError)):
                    continue
                raise
            self._topics[topic] = new
            log.info(
                "partition reassignment started",
                extra={
                    "topic": topic,
                    "partition": partition,
                    "replicas": replicas,
                    "adding": adding,
                    "removing": removing,
                },
            )
            break
        await self._watch_reassignment(topic, partition)

    async def _watch_reassignment(self, topic: str, partition: int) -> None:
        key = (topic, partition)
        if key in self._reassignment_watches:
            # Its state may already be in sync: look now, as the watch's first call would.
            self._events.put("reassignment-progress", partial(self._complete_reassignment, topic, partition))
            return
        self._reassignment_watches[key] = await self._zk.watch_data(
            znodes.partition_state_path(topic, partition),
            partial(self._on_reassigning_state, topic, partition),
        )

    def _on_reassigning_state(
        self, topic: str, partition: int, _data: bytes | None, _stat: ZnodeStat | None
    ) -> None:
        self._events.put("reassignment-progress", partial(self._complete_reassignment, topic, partition))

    async def _complete_reassignment(self, topic: str, partition: int) -> None:
        """Kafka's phase two, once every target replica is in the ISR: the leader moves into the
        targets if it is not one, the removed replicas leave the ISR and the assignment, in one write."""
        if not self._active:
            return
        topic_got = await self._zk.get_or_none(znodes.topic_path(topic))
        state_path = znodes.partition_state_path(topic, partition)
        state_got = await self._zk.get_or_none(state_path)
        znode = self._unparseable.topic(topic, topic_got[0]) if topic_got else None
        state = self._unparseable.state(state_path, state_got[0]) if state_got else None
        if (
            topic_got is None
            or state_got is None
            or (
                znode is not None
                and partition not in znode.adding_replicas
                and partition not in znode.removing_replicas
            )
        ):
            watch = self._reassignment_watches.pop((topic, partition), None)
            if watch is not None:
                watch.cancel()
            return
        if znode is None or state is None:
            return  # skipped while it cannot be parsed; its watch calls again when it changes
        removing = znode.removing_replicas.get(partition, [])
        target = [b for b in znode.partitions.get(partition, []) if b not in removing]
        live = set(self._live)
        if not set(target) <= set(state.isr):
            return  # not in sync yet: the next ISR change calls again
        leader: int | None = state.leader
        if leader not in target or leader not in live:
            leader = first((b for b in target if b in live and b in state.isr), self._shutting_down)
            if leader is None:
                return  # no target replica alive: wait for one (a broker change brings this back)
        new_state = replace(
            state,
            leader=leader,
            isr=[b for b in state.isr if b in target],
            leader_epoch=state.leader_epoch + 1,
            controller_epoch=self._epoch,
        )
        new_znode = znodes.TopicZNode(
            znode.topic_id,
            {**znode.partitions, partition: target},
            _with(znode.adding_replicas, partition, []),
            _with(znode.removing_replicas, partition, []),
        )
        try:
            await self._fenced().write(
                [
                    SetData(
                        znodes.partition_state_path(topic, partition),
                        new_state.encode(),
                        state_got[1].version,
                    ),
                    SetData(znodes.topic_path(topic), new_znode.encode(), topic_got[1].version),
                    state_change_notification([(topic, partition)]),
                ]
            )
        except MultiOpFailed:
            # The leader changed the ISR or the topic changed meanwhile: decide again.
            self._events.put("reassignment-progress", partial(self._complete_reassignment, topic, partition))
            return
        self._topics[topic] = new_znode
        watch = self._reassignment_watches.pop((topic, partition), None)
        if watch is not None:
            watch.cancel()
        log.info(
            "partition reassignment completed",
            extra={"topic": topic, "partition": partition, "replicas": target, "leader": leader},
        )

    # -- config change notifications -------------------------------------------------------------

    async def _purge_config_changes(self) -> None:
        """Delete the /config/changes notifications older than 15 minutes (by their creation time),
        as Kafka's change-notification listener does whenever a new one arrives: every broker has
        applied them by then, and a broker that starts later reads the configs themselves."""
        if not self._active:
            return
        expired_before = time.time() * 1000 - CONFIG_CHANGE_EXPIRATION_MS
        for child in sorted(await self._zk.get_children(znodes.CONFIG_CHANGES)):
            if not child.startswith(znodes.CONFIG_CHANGE_PREFIX):
                continue
            path = f"{znodes.CONFIG_CHANGES}/{child}"
            stat = await self._zk.exists(path)
            if stat is None or stat.ctime >= expired_before:
                continue
            with contextlib.suppress(MultiOpFailed):  # deleted meanwhile
                await self._fenced().write([Delete(path, stat.version)])
            log.debug("config change notification purged", extra={"path": path})

    async def _purge_isr_change_notifications(self) -> None:
        """Delete the /isr_change_notification znodes older than a minute, oldest first, in fenced
        multi-ops: a broker connected all along has read them, and one that was not re-reads every
        partition state. Sequence order is creation order, so the scan stops at the first young one."""
        if not self._active:
            return
        expired_before = time.time() * 1000 - ISR_CHANGE_EXPIRATION_MS
        names = sorted(
            c
            for c in await self._zk.get_children(znodes.ISR_CHANGE_NOTIFICATION)
            if c.startswith(znodes.ISR_CHANGE_PREFIX)
        )
        purged = 0
        for chunk in chunked(names, lambda _: 1):
            paths = [f"{znodes.ISR_CHANGE_NOTIFICATION}/{name}" for name in chunk]
            got = await self._zk.get_many(paths)
            expired = [
                Delete(path, g[1].version)
                for path, g in zip(paths, got, strict=True)
                if g is not None and g[1].ctime < expired_before
            ]
            if expired:
                with contextlib.suppress(MultiOpFailed):  # deleted meanwhile: the next purge looks again
                    await self._fenced().write(expired)
                    purged += len(expired)
            if len(expired) < len(chunk):
                break
        if purged:
            log.debug("partition state change notifications purged", extra={"purged": purged})

    # -- preferred leader election ---------------------------------------------------------------

    def _on_preferred_election_znode(self, data: bytes | None, _stat: ZnodeStat | None) -> None:
        if data is not None:
            self._events.put("preferred-election", self._on_preferred_election)

    async def _on_preferred_election(self) -> None:
        if not self._active:
            return
        got = await self._zk.get_or_none(znodes.PREFERRED_REPLICA_ELECTION)
        if got is None:
            return
        try:
            partitions = znodes.decode_partition_list(got[0])
        except znodes.MALFORMED as e:
            self._unparseable.skip(znodes.PREFERRED_REPLICA_ELECTION, e)
            partitions = []
        await self._elect_preferred(partitions, "preferred replica election")
        with contextlib.suppress(MultiOpFailed):
            await self._fenced().write([Delete(znodes.PREFERRED_REPLICA_ELECTION, got[1].version)])

    async def _elect_preferred(self, partitions: Iterable[tuple[str, int]], why: str) -> None:
        live = set(self._live)
        decisions: dict[tuple[str, int], Decide] = {}
        for topic, partition in partitions:
            replicas = self._topics[topic].partitions.get(partition) if topic in self._topics else None
            if replicas:
                decisions[(topic, partition)] = partial(
                    decide_preferred_leader,
                    replicas,
                    live=live,
                    shutting_down=self._shutting_down,
                    controller_epoch=self._epoch,
                )
        await self._fenced().update_states(decisions, why)

    async def _check_imbalance(self) -> None:
        """Kafka's checkAndTriggerAutoLeaderRebalance: for each broker, the share of the partitions
        it is preferred for that another broker leads; above the threshold, they move back."""
        if not self._active or await self._zk.get_children(znodes.DELETE_TOPICS):
            return  # as Kafka: no rebalance while topics are being deleted
        preferred_of: dict[int, list[tuple[str, int]]] = {}
        for topic, znode in self._topics.items():
            for partition, replicas in znode.partitions.items():
                if replicas:
                    preferred_of.setdefault(replicas[0], []).append((topic, partition))
        threshold = self._config.leader_imbalance_per_broker_percentage
        preferred_of = {
            b: partitions
            for b, partitions in sorted(preferred_of.items())
            if b in self._live and b not in self._shutting_down
        }
        keys = [key for partitions in preferred_of.values() for key in partitions]
        paths = [znodes.partition_state_path(topic, partition) for topic, partition in keys]
        self._stats.read += len(paths)
        leaders: dict[tuple[str, int], int] = {}
        for key, path, got in zip(keys, paths, await self._zk.get_many(paths), strict=True):
            state = self._unparseable.state(path, got[0]) if got is not None else None
            if state is not None:
                leaders[key] = state.leader
        for broker, partitions in preferred_of.items():
            imbalanced = [key for key in partitions if leaders.get(key, broker) != broker]
            if imbalanced and 100 * len(imbalanced) / len(partitions) > threshold:
                log.info(
                    "leader imbalance, moving leadership back",
                    extra={"broker": broker, "imbalanced": len(imbalanced), "preferred": len(partitions)},
                )
                await self._elect_preferred(imbalanced, "auto leader rebalance")


def _shutdown_request(broker: int, data: bytes) -> ControlledShutdownReport:
    try:
        return ControlledShutdownReport.decode(data)
    except (ValueError, KeyError):
        return ControlledShutdownReport(broker, "")


def _with(replicas: dict[int, list[int]], partition: int, brokers: list[int]) -> dict[int, list[int]]:
    """``replicas`` with ``partition``'s entry set to ``brokers`` (removed when empty)."""
    result = {p: r for p, r in replicas.items() if p != partition}
    if brokers:
        result[partition] = brokers
    return result


def _constant(value: int, _item: object) -> int:
    return value
