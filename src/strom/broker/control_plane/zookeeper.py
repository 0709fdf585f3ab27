"""The broker's side of a cluster on ZooKeeper (Kafka's KafkaZkClient + AdminZkClient, broker half).

``ZkControlPlane`` connects the broker to ZooKeeper, makes sure the cluster id there matches the
one in its log dirs' meta.properties, registers the broker (ephemeral ``/brokers/ids/N``), and
watches what the cluster's metadata is made of: the live brokers, the controller, every topic's
assignment and config, and /isr_change_notification, whose notifications name the partition
states written (every state is read, pipelined, at start and after any disconnection; then only
the notified ones). From them it keeps a
``MetadataImage`` (the same class the single-node control plane keeps), whose
``PartitionState.partition_epoch`` is the version of the partition's state znode, and tells the
broker which topic changed. The broker applies those changes (see BrokerServer).

It also makes the writes a broker makes in Kafka's ZooKeeper mode: topics (assignment and config
in one multi-op), partitions, topic deletion requests, topic configs with their change
notification, producer id blocks, and, for the replication layer (``ClusterLink``), the leader's
conditional write of a partition's ISR (those queued meanwhile in one multi-op, with their
notification). Everything ZooKeeper does happens off the event loop
(AsyncZooKeeper); the watch callbacks run on the loop.

A znode it cannot read (not JSON, a field missing, a topic config Kafka's validators refuse, a
topic without a ``topic_id`` as Kafka 2.x tools write it) is skipped, counted and logged once
with its path; the image keeps what it last read there (a topic never read well is withheld:
not served, and its local logs are neither deleted nor moved aside). Only a topic znode that
is gone (the controller's deletion removes it) or created anew (another creation zxid) ends a
topic. A watch callback that fails is logged once and its znode re-read until it succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar

from kazoo.exceptions import BadVersionError, KazooException

from strom.broker.config import KafkaConfig
from strom.broker.control_plane.assignment import assign_replicas
from strom.broker.control_plane.controller.requests import request_preferred_leader_election
from strom.broker.control_plane.controller.writer import state_change_notification
from strom.broker.control_plane.local import (
    META_PROPERTIES,
    TopicExistsError,
    legal_topic_name,
    validate_topic_name,
)
from strom.broker.control_plane.metadata import MetadataImage, PartitionState, TopicState
from strom.broker.control_plane.plane import (
    ADMIN_ANSWER_GRACE_S,
    PREFERRED_NOT_AVAILABLE_MESSAGE,
    AdminTasks,
    MetadataWaitTimeout,
    Outcome,
    Reassignment,
    ZooKeeperUnavailableError,
    admin_timeout_s,
)
from strom.broker.zk import znodes
from strom.broker.zk.client import (
    AsyncZooKeeper,
    Create,
    MultiOpFailed,
    NodeExistsError,
    NoNodeError,
    SessionState,
    SetData,
    Watch,
    ZnodeStat,
)
from strom.protocol.errors import ErrorCode
from strom.storage.checkpoint import write_atomically
from strom.storage.log_config import InvalidConfigError, LogConfig

log = logging.getLogger(__name__)

# A partition whose state znode the controller has not written yet: no leader, no epoch.
NO_STATE_EPOCH = -1
# Re-registration after a session expiry, and re-reads after a failed watch callback: backoff.
RETRY_BACKOFF_MIN_S = 0.2
RETRY_BACKOFF_MAX_S = 10.0
# ISR changes written in one multi-op at most (well under ZooKeeper's 1 MiB jute.maxbuffer).
ISR_CHANGES_PER_WRITE = 500
# How often an admin request polls for the controller to consume its /admin znode.
ADMIN_POLL_S = 0.05

T = TypeVar("T")


class InconsistentClusterIdError(RuntimeError):
    """The log dirs belong to another cluster than the one in ZooKeeper (Kafka's
    InconsistentClusterIdException): the broker refuses to start rather than mix data."""


class UnknownTopicError(KeyError):
    pass


@dataclasses.dataclass(slots=True)
class _TopicWatches:
    watches: list[Watch] = dataclasses.field(default_factory=list)

    def cancel(self) -> None:
        for watch in self.watches:
            watch.cancel()


# What a change notification may name: a legal topic name (a path segment) and a partition.
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")
_MAX_PARTITION = 2**31 - 1


def read_meta_properties(log_dirs: list[Path]) -> dict[Path, dict[str, str]]:
    """Each log dir's meta.properties (absent ones omitted)."""
    found = {}
    for log_dir in log_dirs:
        path = log_dir / META_PROPERTIES
        if path.exists():
            found[log_dir] = dict(
                line.split("=", 1)
                for line in path.read_text(encoding="utf-8").splitlines()
                if "=" in line and not line.startswith("#")
            )
    return found


def new_cluster_id() -> str:
    return znodes.encode_uuid(uuid.uuid4())


class ZkControlPlane:
    """The cluster's metadata as this broker sees it in ZooKeeper, and the broker's writes there."""

    def __init__(
        self,
        config: KafkaConfig,
        log_dirs: list[Path],
        on_topic_changed: Callable[[str], None],
        on_brokers_changed: Callable[[], None],
        applied: Callable[[str], bool] = lambda name: True,
    ) -> None:
        """``applied(topic)``: whether this broker has applied the topic's partition states (a
        created topic is answered once it has)."""
        assert config.zookeeper_connect is not None
        self.config = config
        self.node_id = config.node_id
        self.log_dirs = log_dirs
        self.image = MetadataImage()
        self.cluster_id = ""
        self.live_brokers: dict[int, znodes.BrokerRegistration] = {}
        # Broker epochs: the creation zxid of each live broker's registration (a restart changes it).
        self.broker_epochs: dict[int, int] = {}
        self.controller_id = -1
        self._on_topic_changed = on_topic_changed
        self._on_brokers_changed = on_brokers_changed
        self._applied = applied
        self._admin = AdminTasks()
        self._zk: AsyncZooKeeper | None = None
        # The last readable topic znode with a topic id, and its creation zxid (a new one: the
        # topic was deleted and created again).
        self._topics: dict[str, znodes.TopicZNode] = {}
        self._topic_czxids: dict[str, int] = {}
        self._configs: dict[str, dict[str, str]] = {}
        # Each partition state read: (state, znode version = partition epoch, mzxid). The mzxid
        # orders reads that raced (a newer write has a higher one, also across a re-creation).
        self._states: dict[tuple[str, int], tuple[znodes.LeaderAndIsr, int, int]] = {}
        self._topic_watches: dict[str, _TopicWatches] = {}
        self._broker_watches: dict[int, Watch] = {}
        # Partition-state changes come as /isr_change_notification/isr_change_N znodes (one
        # ChildrenWatch, not one DataWatch per partition): the newest child seen and processed,
        # the children last listed, partition states to read, and whether to read them all
        # (at start and after any disconnection: a notification may have been missed or purged).
        self._notification_seen = ""
        self._notifications: list[str] = []
        self._wanted: set[tuple[str, int]] = set()
        self._reread_all = True
        self._disconnected = False
        self._sync_needed = asyncio.Event()
        # The leaders' ISR changes waiting to be written (one multi-op for those queued meanwhile).
        self._isr_changes: dict[
            tuple[str, int],
            tuple[PartitionState, znodes.LeaderAndIsr, asyncio.Future[PartitionState | None]],
        ] = {}
        self._isr_writer: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._changed = asyncio.Event()
        self._registration: bytes | None = None
        self._session_expired = False
        self._registering: asyncio.Task[None] | None = None
        self._closing = False
        # Znodes skipped as unreadable: path -> why, logged once until the path reads well again.
        self._unreadable: dict[str, str] = {}
        self.skipped_znode_reads = 0
        # Paths whose watch callback failed, being re-read until it succeeds; topics whose change
        # the broker was not told (its callback raised).
        self._rereading: set[str] = set()
        self._untold: set[str] = set()

    @property
    def zk(self) -> AsyncZooKeeper:
        assert self._zk is not None, "the control plane has not started"
        return self._zk

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect, create Kafka's top-level paths, settle the cluster id, and load the metadata
        (with its watches). The broker registers later (``register``), once it listens."""
        assert self.config.zookeeper_connect is not None
        self._zk = AsyncZooKeeper(
            self.config.zookeeper_connect,
            self.config.zookeeper_session_timeout_ms,
            self.config.zookeeper_connection_timeout_ms,
        )
        self._zk.add_session_listener(self._on_session)
        await self._zk.start()
        for path in znodes.PERSISTENT_PATHS:
            await self._zk.ensure_path(path)
        await self._settle_cluster_id()
        await self._zk.watch_data(
            znodes.CONTROLLER, self._guarded_data(znodes.CONTROLLER, self._on_controller)
        )
        await self._zk.watch_children(
            znodes.BROKER_IDS, self._guarded_children(znodes.BROKER_IDS, self._on_broker_ids)
        )
        await self._zk.watch_children(znodes.ISR_CHANGE_NOTIFICATION, self._on_notifications)
        names = await self._zk.get_children(znodes.TOPICS)
        for name in names:
            self._topic_watches.setdefault(name, _TopicWatches())
        await asyncio.gather(*(self._watch_topic(name) for name in names))
        await self._zk.watch_children(
            znodes.TOPICS, self._guarded_children(znodes.TOPICS, self._on_topic_names)
        )
        # Every partition state, pipelined, before the broker serves; then the notifications'.
        await self._sync_states()
        self._spawn(self._follow_states(), "follow partition states")
        log.info(
            "connected to ZooKeeper",
            extra={
                "zookeeper": self.config.zookeeper_connect,
                "cluster_id": self.cluster_id,
                "topics": len(self._topics),
                "brokers": sorted(self.live_brokers),
            },
        )

    async def close(self) -> None:
        """Close the session: the registration (an ephemeral znode) goes at once."""
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        if self._zk is not None:
            await self._zk.stop()

    async def _settle_cluster_id(self) -> None:
        loop = asyncio.get_running_loop()
        props = await loop.run_in_executor(None, read_meta_properties, self.log_dirs)
        local = {p.get("cluster.id", "") for p in props.values()} - {""}
        if len(local) > 1:
            raise InconsistentClusterIdError(f"the log dirs belong to different clusters: {sorted(local)}")
        for log_dir, p in props.items():
            node = p.get("node.id") or p.get("broker.id")
            if node is not None and int(node) != self.node_id:
                raise InconsistentClusterIdError(
                    f"log dir {log_dir} belongs to broker {node}, not {self.node_id}"
                )
        proposed = next(iter(local), None) or new_cluster_id()
        with contextlib.suppress(NodeExistsError):
            await self.zk.create(znodes.CLUSTER_ID, znodes.ClusterIdZNode(proposed).encode(), makepath=True)
        data, _ = await self.zk.get(znodes.CLUSTER_ID)
        self.cluster_id = znodes.ClusterIdZNode.decode(data).id
        if local and self.cluster_id not in local:
            raise InconsistentClusterIdError(
                f"the cluster id in ZooKeeper, {self.cluster_id}, does not match the one in the log dirs "
                f"({next(iter(local))}): these log dirs belong to another cluster"
            )
        missing = [d for d in self.log_dirs if d not in props]
        text = f"version=0\ncluster.id={self.cluster_id}\nbroker.id={self.node_id}\n"

        def write() -> None:
            for log_dir in missing:
                log_dir.mkdir(parents=True, exist_ok=True)
                write_atomically(log_dir / META_PROPERTIES, text.encode("utf-8"))

        await loop.run_in_executor(None, write)

    def _spawn(self, coro: Coroutine[Any, Any, Any], what: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None and not self._closing:
                log.error("ZooKeeper task failed", extra={"task": what, "error": repr(t.exception())})

        task.add_done_callback(done)
        return task

    # -- registration -------------------------------------------------------------------------

    def registration(self, endpoints: list[tuple[str, str, int]]) -> znodes.BrokerRegistration:
        """``endpoints``: (listener name, host, port) for each advertised listener."""
        return znodes.BrokerRegistration(
            broker_id=self.node_id,
            endpoints=tuple(f"{name}://{host}:{port}" for name, host, port in endpoints),
            listener_security_protocol_map={name: "PLAINTEXT" for name, _, _ in endpoints},
            rack=self.config.broker_rack,
        )

    async def register(self, registration: znodes.BrokerRegistration) -> None:
        """Create /brokers/ids/N. A registration left by an earlier session of this broker (a crash
        and a quick restart) lingers until that session expires: retry until then."""
        self._registration = registration.encode()
        await self._register()

    async def _register(self) -> None:
        assert self._registration is not None
        path = znodes.broker_path(self.node_id)
        deadline = time.monotonic() + 2 * self.config.zookeeper_session_timeout_ms / 1000
        while True:
            try:
                await self.zk.create(path, self._registration, ephemeral=True)
                break
            except NodeExistsError:
                existing = await self.zk.exists(path)
                if existing is not None and existing.ephemeralOwner == self.zk.session_id:
                    break  # ours: created by a try whose answer the connection lost
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"broker {self.node_id} is already registered in ZooKeeper by another session; "
                        "is another broker running with the same broker.id?"
                    ) from None
                await asyncio.sleep(0.2)
        log.info("registered in ZooKeeper", extra={"broker": self.node_id, "path": path})

    def _on_session(self, state: str) -> None:
        if self._closing:
            return  # closing the session reports it lost too; that is no expiry
        if state in (SessionState.SUSPENDED, SessionState.EXPIRED):
            self._disconnected = True
        elif state == SessionState.CONNECTED and self._disconnected:
            # Notifications may have been missed (and purged) meanwhile: read every state again.
            self._disconnected = False
            self._reread_all = True
            self._sync_needed.set()
        if state == SessionState.EXPIRED:
            log.warning("ZooKeeper session expired", extra={"broker": self.node_id})
            self._session_expired = True
        elif state == SessionState.CONNECTED and self._session_expired:
            # A new session: the old one's ephemeral registration is gone, register again.
            self._session_expired = False
            if self._registration is not None and (self._registering is None or self._registering.done()):
                self._registering = self._spawn(self._register_until_done(), "re-register")

    async def _register_until_done(self) -> None:
        """Register again after a session expiry, retried with backoff until it succeeds: a broker
        that runs unregistered is never a replica the controller elects or counts (close cancels)."""
        backoff = RETRY_BACKOFF_MIN_S
        while not self._closing:
            try:
                await self._register()
                return
            except Exception as e:
                log.warning(
                    "re-registration in ZooKeeper failed; retrying",
                    extra={"broker": self.node_id, "error": repr(e), "retry_s": backoff},
                )
            await asyncio.sleep(backoff)
            backoff = min(2 * backoff, RETRY_BACKOFF_MAX_S)

    # -- unreadable znodes and failed watch callbacks ----------------------------------------

    def _skip_unreadable(self, path: str, why: str) -> None:
        """Count a read of ``path`` that is skipped; log it once until the path reads well again."""
        self.skipped_znode_reads += 1
        if self._unreadable.get(path) != why:
            self._unreadable[path] = why
            log.error(
                "skipping an unreadable znode; keeping what was last read there",
                extra={"path": path, "error": why, "skipped_reads": self.skipped_znode_reads},
            )

    def _readable(self, path: str) -> None:
        if self._unreadable.pop(path, None) is not None:
            log.info("znode readable again", extra={"path": path})

    def unreadable_znodes(self) -> dict[str, str]:
        """The znodes skipped because they could not be read (path -> why)."""
        return dict(self._unreadable)

    def _guarded_data(
        self, path: str, callback: Callable[[bytes | None, ZnodeStat | None], None]
    ) -> Callable[[bytes | None, ZnodeStat | None], None]:
        """``callback`` for a data watch on ``path``: if it raises, log once and re-read ``path``
        (with backoff) until a call succeeds, so the znode's state converges."""

        def guarded(data: bytes | None, stat: ZnodeStat | None) -> None:
            try:
                callback(data, stat)
            except Exception:
                self._callback_failed(path, self._reread_data(path, callback))

        return guarded

    def _guarded_children(
        self, path: str, callback: Callable[[list[str]], None]
    ) -> Callable[[list[str]], None]:
        def guarded(children: list[str]) -> None:
            try:
                callback(children)
            except Exception:
                self._callback_failed(path, self._reread_children(path, callback))

        return guarded

    def _callback_failed(self, path: str, reread: Coroutine[Any, Any, None]) -> None:
        if path in self._rereading or self._closing:
            reread.close()  # a re-read is under way already; it reads the newest data
            return
        log.exception("a ZooKeeper watch callback failed; re-reading the znode", extra={"path": path})
        self._rereading.add(path)
        self._spawn(reread, f"re-read {path}")

    async def _reread(self, path: str, attempt: Callable[[], Awaitable[None]]) -> None:
        backoff = RETRY_BACKOFF_MIN_S
        try:
            while not self._closing:
                await asyncio.sleep(backoff)
                try:
                    await attempt()
                    log.info("re-read a znode whose watch callback had failed", extra={"path": path})
                    return
                except Exception as e:
                    log.debug("re-reading a znode failed", extra={"path": path, "error": repr(e)})
                backoff = min(2 * backoff, RETRY_BACKOFF_MAX_S)
        finally:
            self._rereading.discard(path)

    async def _reread_data(
        self, path: str, callback: Callable[[bytes | None, ZnodeStat | None], None]
    ) -> None:
        async def attempt() -> None:
            found = await self.zk.get_or_none(path)
            callback(*(found if found is not None else (None, None)))

        await self._reread(path, attempt)

    async def _reread_children(self, path: str, callback: Callable[[list[str]], None]) -> None:
        async def attempt() -> None:
            callback(await self.zk.get_children(path))

        await self._reread(path, attempt)

    # -- brokers and the controller ----------------------------------------------------------

    def _on_controller(self, data: bytes | None, stat: ZnodeStat | None) -> None:
        previous = self.controller_id
        self.controller_id = -1
        if data:
            try:
                self.controller_id = znodes.ControllerZNode.decode(data).broker_id
                self._readable(znodes.CONTROLLER)
            except znodes.MALFORMED as e:
                self._skip_unreadable(znodes.CONTROLLER, repr(e))
        if previous != self.controller_id:
            log.info("controller changed", extra={"controller": self.controller_id})
            self.signal_change()

    def _on_broker_ids(self, children: list[str]) -> None:
        ids = {int(c) for c in children if c.isdigit()}
        for gone in set(self._broker_watches) - ids:
            self._broker_watches.pop(gone).cancel()
            self._broker_gone(gone)
        for new in ids - set(self._broker_watches):
            self._broker_watches[new] = Watch()  # a placeholder until the watch is armed
            self._spawn(self._watch_broker(new), f"watch broker {new}")

    async def _watch_broker(self, broker_id: int) -> None:
        path = znodes.broker_path(broker_id)

        def on_data(data: bytes | None, stat: ZnodeStat | None) -> None:
            if data is None or stat is None:
                self._readable(path)
                self._broker_gone(broker_id)
                return
            try:
                registration = znodes.BrokerRegistration.decode(broker_id, data)
                registration.endpoint()
            except znodes.MALFORMED as e:
                self._skip_unreadable(path, repr(e))
                return
            self._readable(path)
            self.live_brokers[broker_id] = registration
            self.broker_epochs[broker_id] = stat.czxid
            self.signal_change()
            self._on_brokers_changed()

        placeholder = self._broker_watches.get(broker_id)
        watch = await self.zk.watch_data(path, self._guarded_data(path, on_data))
        if self._broker_watches.get(broker_id) is placeholder and placeholder is not None:
            self._broker_watches[broker_id] = watch
        else:  # gone meanwhile
            watch.cancel()

    def _broker_gone(self, broker_id: int) -> None:
        self._unreadable.pop(znodes.broker_path(broker_id), None)
        if self.live_brokers.pop(broker_id, None) is not None:
            self.broker_epochs.pop(broker_id, None)
            self.signal_change()
            self._on_brokers_changed()

    def broker_endpoint(self, broker_id: int) -> tuple[str, int] | None:
        registration = self.live_brokers.get(broker_id)
        return registration.endpoint() if registration is not None else None

    def broker_epoch(self, broker_id: int) -> int | None:
        return self.broker_epochs.get(broker_id)

    def peer_endpoint(self, broker_id: int) -> tuple[str, int] | None:
        """Where this broker reaches ``broker_id``: its inter-broker listener (a peer that registered
        no such listener is reached on its first)."""
        registration = self.live_brokers.get(broker_id)
        if registration is None:
            return None
        return registration.endpoint(self.config.inter_broker_listener_name) or registration.endpoint()

    def broker_racks(self) -> dict[int, str | None]:
        return {b: r.rack for b, r in self.live_brokers.items()}

    # -- topics -------------------------------------------------------------------------------

    def _on_topic_names(self, children: list[str]) -> None:
        names = set(children)
        for gone in set(self._topic_watches) - names:
            self._forget_topic(gone)
        for new in names - set(self._topic_watches):
            self._topic_watches[new] = _TopicWatches()
            self._spawn(self._watch_topic(new), f"watch topic {new}")

    async def _watch_topic(self, name: str) -> None:
        """Arm the topic's data and config watches (its entry in ``_topic_watches`` is made)."""
        watches = self._topic_watches.get(name)
        if watches is None or watches.watches:
            return
        topic_path = znodes.topic_path(name)
        config_path = znodes.topic_config_path(name)
        topic_watch = await self.zk.watch_data(
            topic_path,
            self._guarded_data(topic_path, lambda data, stat: self._on_topic_data(name, data, stat)),
        )
        config_watch = await self.zk.watch_data(
            config_path, self._guarded_data(config_path, lambda data, stat: self._on_topic_config(name, data))
        )
        if self._topic_watches.get(name) is not watches:  # deleted meanwhile
            topic_watch.cancel()
            config_watch.cancel()
            return
        watches.watches += [topic_watch, config_watch]

    def _on_topic_data(self, name: str, data: bytes | None, stat: ZnodeStat | None) -> None:
        watches = self._topic_watches.get(name)
        if watches is None:
            return
        path = znodes.topic_path(name)
        if data is None or stat is None:
            # Gone: the controller deleted the topic (its one multi-op removes this znode).
            self._readable(path)
            self._forget_topic(name)
            return
        try:
            topic = znodes.TopicZNode.decode(data)
        except znodes.MALFORMED as e:
            self._skip_unreadable(path, repr(e))
            return
        known = self._topics.get(name)
        recreated = self._topic_czxids.get(name, stat.czxid) != stat.czxid
        if topic.topic_id is None:
            # Kafka 2.x's format: the controller gives it an id. Until then it stays as last read
            # (or withheld if never read with one); it is not deleted.
            self._skip_unreadable(path, "no topic_id (the controller assigns one)")
            if recreated and known is not None:
                self._forget_topic(name, keep_watches=True)
            return
        if known is not None and not recreated and known.topic_id != topic.topic_id:
            # The same znode, rewritten with another id: not a deletion the controller made, so
            # the hosted logs (named by the old id) stay as they are.
            self._skip_unreadable(path, f"topic_id changed from {known.topic_id} without a deletion")
            return
        withheld = known is None and path in self._unreadable
        self._readable(path)
        if recreated:
            # States read before this topic's znode was created belong to its predecessor.
            for key in [k for k, v in self._states.items() if k[0] == name and v[2] < stat.czxid]:
                del self._states[key]
        self._topics[name] = topic
        self._topic_czxids[name] = stat.czxid
        if withheld or recreated:
            # Its states were written while it was not read (the start's read skipped it).
            self._want({(name, p) for p in topic.partitions if (name, p) not in self._states})
        self._rebuild(name)

    # -- partition states: change notifications and pipelined reads ----------------------------

    def _on_notifications(self, children: list[str]) -> None:
        self._notifications = children
        self._sync_needed.set()

    def _want(self, keys: set[tuple[str, int]]) -> None:
        if keys:
            self._wanted |= keys
            self._sync_needed.set()

    async def _follow_states(self) -> None:
        """Read what the notifications (and re-reads) ask for, one pass at a time, for as long as
        the broker runs; a failed pass (ZooKeeper unreachable) is retried with backoff."""
        backoff = RETRY_BACKOFF_MIN_S
        while not self._closing:
            await self._sync_needed.wait()
            self._sync_needed.clear()
            try:
                await self._sync_states()
                backoff = RETRY_BACKOFF_MIN_S
            except Exception as e:
                if self._closing:
                    return
                log.warning(
                    "reading partition states failed; retrying",
                    extra={"error": repr(e), "retry_s": backoff},
                )
                self._sync_needed.set()
                await asyncio.sleep(backoff)
                backoff = min(2 * backoff, RETRY_BACKOFF_MAX_S)

    async def _sync_states(self) -> None:
        """One pass: the partitions named by notifications newer than the last one processed (in
        sequence order), or every partition of every topic when a re-read is due, read pipelined
        and applied to the image topic by topic. Nothing is marked done unless the pass succeeds."""
        reread_all = self._reread_all
        self._reread_all = False
        wanted, self._wanted = self._wanted, set()
        try:
            seen = self._notification_seen
            fresh = sorted(
                c for c in self._notifications if c.startswith(znodes.ISR_CHANGE_PREFIX) and c > seen
            )
            keys = set(wanted)
            if reread_all:
                # The notifications listed are older than this read: it covers them.
                keys |= {(n, p) for n, topic in self._topics.items() for p in topic.partitions}
            elif fresh:
                keys |= await self._notified_partitions(fresh)
            await self._read_states(keys)
        except BaseException:
            self._reread_all = self._reread_all or reread_all
            self._wanted |= wanted
            raise
        if fresh:
            self._notification_seen = max(seen, fresh[-1])

    async def _notified_partitions(self, notifications: list[str]) -> set[tuple[str, int]]:
        paths = [f"{znodes.ISR_CHANGE_NOTIFICATION}/{c}" for c in notifications]
        keys: set[tuple[str, int]] = set()
        for path, found in zip(paths, await self.zk.get_many(paths), strict=True):
            if found is None:
                # Purged before it was read (the controller deletes them after a while): what
                # it named is unknown, so every state is read again.
                self._reread_all = True
                self._sync_needed.set()
                continue
            try:
                partitions = znodes.decode_partition_list(found[0])
            except znodes.MALFORMED as e:
                self._skip_unreadable(path, repr(e))
                continue
            keys.update(
                (topic, partition)
                for topic, partition in partitions
                if _TOPIC_NAME.fullmatch(topic) and 0 <= partition <= _MAX_PARTITION
            )
        return keys

    async def _read_states(self, keys: set[tuple[str, int]]) -> None:
        """Read the state znodes of ``keys`` in one pipeline and update the image of each topic
        for the partitions whose state changed."""
        if not keys:
            return
        ordered = sorted(keys)
        results = await self.zk.get_many([znodes.partition_state_path(t, p) for t, p in ordered])
        changed: dict[str, set[int]] = {}
        for (topic, partition), found in zip(ordered, results, strict=True):
            if found is None:
                continue  # not created yet (its creation is announced), or its topic is being deleted
            data, stat = found
            path = znodes.partition_state_path(topic, partition)
            try:
                state = znodes.LeaderAndIsr.decode(data)
            except znodes.MALFORMED as e:
                self._skip_unreadable(path, repr(e))
                continue  # the last state read stays
            self._readable(path)
            if self._put_state(topic, partition, state, stat):
                changed.setdefault(topic, set()).add(partition)
        # Every topic's image is updated (and its broker told) even if telling one fails; a topic
        # whose broker was not told is told again by the retried pass.
        failure: Exception | None = None
        for topic in [*changed, *(self._untold - changed.keys())]:
            try:
                self._update_partitions(topic, changed.get(topic, set()))
            except Exception as e:
                failure = e
        if failure is not None:
            raise failure

    def _put_state(self, topic: str, partition: int, state: znodes.LeaderAndIsr, stat: ZnodeStat) -> bool:
        """Keep ``state`` unless a newer one was read already; whether it is new."""
        current = self._states.get((topic, partition))
        if current is not None and current[2] >= stat.mzxid:
            return False
        self._states[(topic, partition)] = (state, stat.version, stat.mzxid)
        return True

    def _on_topic_config(self, name: str, data: bytes | None) -> None:
        if name not in self._topic_watches:
            return
        path = znodes.topic_config_path(name)
        try:
            configs = znodes.EntityConfigZNode.decode(data).config
            # Kafka's validators, as for CreateTopics: a config no log could run with is skipped
            # (the last valid one, or the defaults, stay) rather than stop every broker.
            LogConfig.from_props(configs, self.config.log_config_defaults())
        except (*znodes.MALFORMED, InvalidConfigError) as e:
            self._skip_unreadable(path, repr(e))
            return
        self._readable(path)
        self._configs[name] = configs
        self._rebuild(name)

    def is_withheld(self, name: str) -> bool:
        """``name``'s topic znode exists but was never read with a topic id (unreadable, or Kafka
        2.x's format awaiting the controller's id): not served, and its logs are kept as they are."""
        return name in self._topic_watches and name not in self._topics

    def topic_configs(self, name: str) -> dict[str, str]:
        """The last valid config overrides read for ``name`` (a withheld topic's too)."""
        return dict(self._configs.get(name, {}))

    def _forget_topic(self, name: str, keep_watches: bool = False) -> None:
        if not keep_watches:
            watches = self._topic_watches.pop(name, None)
            if watches is not None:
                watches.cancel()
            self._configs.pop(name, None)
            for path in [p for p in self._unreadable if p.startswith(f"{znodes.topic_path(name)}/")]:
                del self._unreadable[path]
            self._unreadable.pop(znodes.topic_config_path(name), None)
            self._unreadable.pop(znodes.topic_path(name), None)
        self._topics.pop(name, None)
        self._topic_czxids.pop(name, None)
        for key in [k for k in self._states if k[0] == name]:
            del self._states[key]
        self._rebuild(name)

    def _rebuild(self, name: str) -> None:
        """Make the image's entry of ``name`` what the znodes say, and tell the broker."""
        znode = self._topics.get(name)
        if znode is None or znode.topic_id is None:
            # Not (or no longer) a topic; one without an id awaits the controller's upgrade of it.
            changed = self.image.remove(name) is not None
        else:
            partitions = []
            for p, replicas in sorted(znode.partitions.items()):
                state = self._states.get((name, p))
                if state is None:
                    partitions.append(
                        PartitionState(p, -1, NO_STATE_EPOCH, list(replicas), [], NO_STATE_EPOCH)
                    )
                else:
                    partitions.append(self._partition_state(name, p, replicas))
            topic = TopicState(name, znode.topic_id, partitions, dict(self._configs.get(name, {})))
            previous = self.image.topic(name)
            if previous is not None and previous.topic_id != topic.topic_id:
                self.image.remove(name)
            changed = previous != topic
            self.image.put(topic)
        self._tell(name, changed)

    def _partition_state(self, name: str, partition: int, replicas: list[int]) -> PartitionState:
        lai, version, _ = self._states[(name, partition)]
        return PartitionState(partition, lai.leader, lai.leader_epoch, list(replicas), list(lai.isr), version)

    def _update_partitions(self, name: str, partitions: set[int]) -> None:
        """The image's entry of ``name`` with only ``partitions`` made anew (a state change of a few
        partitions of a large topic costs what they cost, not the whole topic's rebuild)."""
        znode = self._topics.get(name)
        previous = self.image.topic(name)
        if (
            znode is None
            or previous is None
            or previous.topic_id != znode.topic_id
            or len(previous.partitions) != len(znode.partitions)
        ):
            self._rebuild(name)
            return
        updated = list(previous.partitions)
        changed = False
        for p in partitions:
            replicas = znode.partitions.get(p)
            if replicas is None or updated[p].partition != p:
                continue  # not (yet) a partition of the topic as read
            state = self._partition_state(name, p, replicas)
            if state != updated[p]:
                updated[p] = state
                changed = True
        if changed:
            # A new TopicState: the broker compares the one it applied with the image's.
            self.image.put(dataclasses.replace(previous, partitions=updated))
        self._tell(name, changed)

    def _tell(self, name: str, changed: bool) -> None:
        if changed or name in self._untold:
            self.signal_change()
            # Until the broker has been told (its callback may raise), a re-read tells it again.
            self._untold.add(name)
            self._on_topic_changed(name)
            self._untold.discard(name)

    def signal_change(self) -> None:
        """Wake every ``wait_until``: the metadata, or what the broker made of it, changed."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_until(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until ``condition()`` holds after a change of the metadata."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)
        return True

    @staticmethod
    def is_ready(topic: TopicState | None) -> bool:
        """Every partition of ``topic`` has a state (the controller has elected its leaders)."""
        return topic is not None and all(p.partition_epoch != NO_STATE_EPOCH for p in topic.partitions)

    # -- ClusterLink: the leader's ISR changes -------------------------------------------------

    async def alter_partition(self, topic: str, state: PartitionState) -> PartitionState | None:
        """Queue the ISR change; the changes queued meanwhile are written together (as Kafka's
        AlterPartitionManager sends one request for all of them), each fenced by its version."""
        cached = self._states.get((topic, state.partition))
        previous = cached[0] if cached is not None else None
        data = znodes.LeaderAndIsr(
            leader=state.leader,
            leader_epoch=state.leader_epoch,
            isr=list(state.isr),
            controller_epoch=previous.controller_epoch if previous is not None else 0,
            leader_recovery_state=previous.leader_recovery_state if previous is not None else 0,
        )
        future: asyncio.Future[PartitionState | None] = asyncio.get_running_loop().create_future()
        # The replica manager has one change in flight per partition: the key is free.
        self._isr_changes[(topic, state.partition)] = (state, data, future)
        if self._isr_writer is None or self._isr_writer.done():
            self._isr_writer = self._spawn(self._write_isr_changes(), "write ISR changes")
        return await future

    async def _write_isr_changes(self) -> None:
        while self._isr_changes:
            keys = list(itertools.islice(self._isr_changes, ISR_CHANGES_PER_WRITE))
            batch = {k: self._isr_changes.pop(k) for k in keys}
            try:
                await self._write_isr_batch(batch)
            except Exception as e:
                for _, _, future in batch.values():
                    if not future.done():
                        future.set_exception(e)

    async def _write_isr_batch(
        self,
        batch: dict[
            tuple[str, int], tuple[PartitionState, znodes.LeaderAndIsr, asyncio.Future[PartitionState | None]]
        ],
    ) -> None:
        """One multi-op of every state in ``batch`` and its change notification; a state whose
        version no longer matches (a newer state is on its way) is answered None and the rest
        written again without it."""
        while True:
            for key in [k for k, (_, _, future) in batch.items() if future.done()]:
                del batch[key]  # its caller gave up
            if not batch:
                return
            keys = list(batch)
            ops: list[SetData | Create] = [
                SetData(
                    znodes.partition_state_path(t, p),
                    batch[(t, p)][1].encode(),
                    batch[(t, p)][0].partition_epoch,
                )
                for t, p in keys
            ]
            # The writes and their change notification in one multi-op: every broker learns of them.
            ops.append(state_change_notification(keys))
            try:
                results = await self.zk.multi(ops)
            except MultiOpFailed as e:
                if e.index < len(keys) and isinstance(e.cause, (BadVersionError, NoNodeError)):
                    refused = batch.pop(keys[e.index])[2]
                    if not refused.done():
                        refused.set_result(None)
                    continue
                raise
            changed: dict[str, set[int]] = {}
            for (topic, partition), stat in zip(keys, results, strict=False):
                state, data, future = batch[(topic, partition)]
                if self._put_state(topic, partition, data, stat):
                    changed.setdefault(topic, set()).add(partition)
                if not future.done():
                    future.set_result(
                        dataclasses.replace(state, isr=list(state.isr), partition_epoch=stat.version)
                    )
            for topic, partitions in changed.items():
                self._update_partitions(topic, partitions)
            return

    # -- admin writes (Kafka's AdminZkClient) --------------------------------------------------

    def new_topic_id(self) -> uuid.UUID:
        # Kafka reserves the zero UUID and UUIDs whose first 8 bytes are zero as sentinels.
        while True:
            topic_id = uuid.uuid4()
            if topic_id.int >> 64 and self.image.topic_by_id(topic_id) is None:
                return topic_id

    def assignment(
        self, num_partitions: int, replication_factor: int, first_partition: int = 0
    ) -> dict[int, list[int]]:
        """Replicas for new partitions over the live brokers (raises InvalidReplicationFactorError)."""
        return assign_replicas(
            self.broker_racks(), num_partitions, replication_factor, first_partition=first_partition
        )

    @property
    def replicated(self) -> bool:
        return True

    @property
    def live_broker_ids(self) -> Collection[int]:
        return self.live_brokers.keys()

    async def _run_admin(self, operation: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """Run to its end; answered within the request's timeout (ZooKeeper errors as
        ZooKeeperUnavailableError: REQUEST_TIMED_OUT, not a closed connection)."""
        try:
            return await self._admin.run(operation, timeout_s + ADMIN_ANSWER_GRACE_S)
        except KazooException as e:
            raise ZooKeeperUnavailableError(f"ZooKeeper: {e!r}") from e

    async def create_topic(
        self,
        name: str,
        num_partitions: int,
        configs: Mapping[str, str],
        *,
        replication_factor: int = -1,
        assignment: Mapping[int, list[int]] | None = None,
        timeout_ms: int | None = None,
    ) -> uuid.UUID:
        if assignment is None:
            rf = self.config.default_replication_factor if replication_factor == -1 else replication_factor
            assignment = self.assignment(num_partitions, rf)
        timeout_s = admin_timeout_s(timeout_ms)
        deadline = time.monotonic() + timeout_s
        topic_id = await self._run_admin(self._create_topic(name, assignment, configs, timeout_s), timeout_s)
        # As Kafka answers once the topic's leaders are in the handling broker's metadata: here
        # also once this broker leads the partitions ZooKeeper gives it (so the Metadata it serves
        # next names them), within what is left of the timeout.
        if not await self.wait_until(lambda: self._applied(name), deadline - time.monotonic()):
            raise MetadataWaitTimeout(f"topic {name} was created, but its leaders are not ready yet")
        return topic_id

    async def _create_topic(
        self, name: str, assignment: Mapping[int, list[int]], configs: Mapping[str, str], timeout_s: float
    ) -> uuid.UUID:
        """Write the topic's config and assignment in one multi-op, then wait (at most
        ``timeout_s``) until the controller has created every partition's state. Returns the
        topic id; MetadataWaitTimeout if the topic was created but its leaders are not there yet."""
        validate_topic_name(name)
        if name in self.image:
            raise TopicExistsError(f"Topic '{name}' already exists.")
        topic_id = self.new_topic_id()
        config_path = znodes.topic_config_path(name)
        config_data = znodes.EntityConfigZNode(dict(configs)).encode()
        # A config left by an earlier topic of this name (Kafka deletes it with the topic) is replaced.
        config_op: Create | SetData = (
            SetData(config_path, config_data)
            if await self.zk.exists(config_path)
            else Create(config_path, config_data)
        )
        topic_data = znodes.TopicZNode(topic_id, {p: list(r) for p, r in assignment.items()}).encode()
        try:
            await self.zk.multi([config_op, Create(znodes.topic_path(name), topic_data)])
        except MultiOpFailed as e:
            if isinstance(e.cause, NodeExistsError):
                raise TopicExistsError(f"Topic '{name}' already exists.") from e
            raise
        log.info("created topic in ZooKeeper", extra={"topic": name, "partitions": len(assignment)})

        def ready() -> bool:
            topic = self.image.topic(name)
            return topic is not None and topic.topic_id == topic_id and self.is_ready(topic)

        if not await self.wait_until(ready, timeout_s):
            raise MetadataWaitTimeout(f"topic {name} was created, but its partitions have no leaders yet")
        return topic_id

    async def create_partitions(
        self, name: str, total: int, assignment: list[list[int]] | None = None, timeout_ms: int | None = None
    ) -> None:
        timeout_s = admin_timeout_s(timeout_ms)
        await self._run_admin(self._create_partitions(name, total, assignment, timeout_s), timeout_s)

    async def _create_partitions(
        self, name: str, total: int, assignment: list[list[int]] | None, timeout_s: float
    ) -> None:
        """Grow ``name`` to ``total`` partitions (a conditional write of its topic znode; retried
        if another writer got there first), then wait until the new partitions have states."""
        while True:
            found = await self.zk.get_or_none(znodes.topic_path(name))
            if found is None:
                raise UnknownTopicError(name)
            data, stat = found
            znode = znodes.TopicZNode.decode(data)
            existing = len(znode.partitions)
            if total <= existing:
                raise ValueError(f"Topic already has {existing} partitions.")
            replication_factor = len(znode.partitions[0])
            new = (
                {existing + i: list(r) for i, r in enumerate(assignment)}
                if assignment is not None
                else self.assignment(total - existing, replication_factor, first_partition=existing)
            )
            grown = dataclasses.replace(znode, partitions={**znode.partitions, **new})
            try:
                await self.zk.set(znodes.topic_path(name), grown.encode(), stat.version)
                break
            except BadVersionError:
                continue
            except NoNodeError as e:
                raise UnknownTopicError(name) from e

        def ready() -> bool:
            topic = self.image.topic(name)
            return topic is not None and len(topic.partitions) >= total and self.is_ready(topic)

        if not await self.wait_until(ready, timeout_s):
            raise MetadataWaitTimeout(f"partitions of {name} were created, but they have no leaders yet")

    async def delete_topic(self, name: str, timeout_ms: int | None = None) -> TopicState | None:
        timeout_s = admin_timeout_s(timeout_ms)
        return await self._run_admin(self._delete_topic(name, timeout_s), timeout_s)

    async def _delete_topic(self, name: str, timeout_s: float) -> TopicState | None:
        """Ask the controller to delete ``name`` (/admin/delete_topics/T) and wait until it is gone.
        Returns the topic as it was, or None if it did not exist."""
        topic = self.image.topic(name)
        if topic is None:
            return None
        with contextlib.suppress(NodeExistsError):  # asked already
            await self.zk.create(znodes.delete_topic_path(name), b"")

        def gone() -> bool:
            current = self.image.topic(name)
            return current is None or current.topic_id != topic.topic_id

        if not await self.wait_until(gone, timeout_s):
            raise MetadataWaitTimeout(f"topic {name} is marked for deletion but not yet deleted")
        return topic

    async def set_topic_configs(self, name: str, configs: Mapping[str, str]) -> TopicState:
        timeout_s = admin_timeout_s(None)
        return await self._run_admin(self._set_topic_configs(name, configs, timeout_s), timeout_s)

    async def _set_topic_configs(self, name: str, configs: Mapping[str, str], timeout_s: float) -> TopicState:
        """Replace ``name``'s config overrides and notify every broker (/config/changes)."""
        if name not in self._topics:
            raise UnknownTopicError(name)
        path = znodes.topic_config_path(name)
        data = znodes.EntityConfigZNode(dict(configs)).encode()
        try:
            await self.zk.set(path, data)
        except NoNodeError:
            await self.zk.create(path, data, makepath=True)
        await self.zk.create(
            f"{znodes.CONFIG_CHANGES}/{znodes.CONFIG_CHANGE_PREFIX}",
            znodes.encode_config_change("topics", name),
            sequence=True,
        )
        wanted = dict(configs)

        def applied() -> bool:
            topic = self.image.topic(name)
            return topic is None or topic.configs == wanted

        await self.wait_until(applied, timeout_s)
        topic = self.image.topic(name)
        if topic is None:
            raise UnknownTopicError(name)
        return topic

    async def elect_preferred_leaders(
        self, partitions: list[tuple[str, int]], timeout_s: float
    ) -> dict[tuple[str, int], Outcome]:
        """Write /admin/preferred_replica_election, wait for the controller to consume it (it
        writes the states, then deletes the request: once it is gone, they are final) and answer
        from the partition states then read in ZooKeeper."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        timed_out: Outcome = (
            ErrorCode.request_timed_out,
            f"The controller did not elect the preferred leaders within {int(timeout_s * 1000)} ms",
        )
        try:
            await request_preferred_leader_election(self.zk, partitions, timeout_s)
            while await self.zk.exists(znodes.PREFERRED_REPLICA_ELECTION) is not None:
                if loop.time() >= deadline:
                    return dict.fromkeys(partitions, timed_out)
                await asyncio.sleep(ADMIN_POLL_S)
            outcomes: dict[tuple[str, int], Outcome] = {}
            for topic, partition in partitions:
                got = await self.zk.get_or_none(znodes.partition_state_path(topic, partition))
                state = self.image.topic(topic)
                replicas = (
                    next((p.replicas for p in state.partitions if p.partition == partition), [])
                    if state
                    else []
                )
                if got is not None and replicas and znodes.LeaderAndIsr.decode(got[0]).leader == replicas[0]:
                    outcomes[(topic, partition)] = (ErrorCode.none, None)
                else:
                    outcomes[(topic, partition)] = (
                        ErrorCode.preferred_leader_not_available,
                        PREFERRED_NOT_AVAILABLE_MESSAGE,
                    )
            return outcomes
        except TimeoutError:
            return dict.fromkeys(partitions, timed_out)
        except KazooException as e:
            return dict.fromkeys(partitions, (ErrorCode.request_timed_out, f"ZooKeeper: {e!r}"))

    async def _topic_znode(self, topic: str) -> znodes.TopicZNode | None:
        got = await self.zk.get_or_none(znodes.topic_path(topic))
        return znodes.TopicZNode.decode(got[0]) if got is not None else None

    async def reassignment(self, topic: str, partition: int) -> Reassignment | None:
        state = self.image.topic(topic)
        p = next((s for s in state.partitions if s.partition == partition), None) if state else None
        if p is None:
            return None
        try:
            znode = await self._topic_znode(topic)
        except KazooException as e:
            raise ZooKeeperUnavailableError(f"ZooKeeper: {e!r}") from e
        if znode is None:
            return Reassignment(list(p.replicas), [], [])
        return Reassignment(
            znode.partitions.get(partition, p.replicas),
            znode.adding_replicas.get(partition, []),
            znode.removing_replicas.get(partition, []),
        )

    async def reassignments(
        self, wanted: Mapping[str, set[int] | None] | None
    ) -> list[tuple[str, int, Reassignment]]:
        """Read from the topic znodes' adding/removing fields."""
        found: list[tuple[str, int, Reassignment]] = []
        try:
            if wanted is None:
                wanted = dict.fromkeys(sorted(await self.zk.get_children(znodes.TOPICS)))
            for name, partitions in wanted.items():
                if not legal_topic_name(name):
                    continue  # never joined into a znode path: ".." would read /brokers
                znode = await self._topic_znode(name)
                if znode is None:
                    continue  # as Kafka: an unknown topic is simply not being reassigned
                for p in sorted(set(znode.adding_replicas) | set(znode.removing_replicas)):
                    if partitions is None or p in partitions:
                        found.append(
                            (
                                name,
                                p,
                                Reassignment(
                                    znode.partitions.get(p, []),
                                    znode.adding_replicas.get(p, []),
                                    znode.removing_replicas.get(p, []),
                                ),
                            )
                        )
        except KazooException as e:
            raise ZooKeeperUnavailableError(f"ZooKeeper: {e!r}") from e
        return found

    async def reassign(
        self, targets: list[tuple[str, int, list[int]]], timeout_s: float
    ) -> dict[tuple[str, int], Outcome]:
        """Write /admin/reassign_partitions (after any earlier request is consumed), wait for the
        controller to take it (it starts KIP-455's adding/removing replicas in the topic znodes and
        deletes the request), then answer each partition by what its topic znode says (the
        controller skips a partition it cannot reassign, e.g. of a topic deleted meanwhile)."""
        requests = [znodes.PartitionReplicas(t, p, r) for t, p, r in targets]
        submitted = await self._submit_reassignment(requests, timeout_s)
        if submitted[0] != ErrorCode.none:
            return {(r.topic, r.partition): submitted for r in requests}
        return {(r.topic, r.partition): await self._reassignment_started(r) for r in requests}

    async def _submit_reassignment(
        self, requests: list[znodes.PartitionReplicas], timeout_s: float
    ) -> Outcome:
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
                    await self.zk.create(znodes.REASSIGN_PARTITIONS, data, makepath=True)
                    break
                except NodeExistsError:
                    if loop.time() >= deadline:
                        return timed_out
                    await asyncio.sleep(ADMIN_POLL_S)
            while await self.zk.exists(znodes.REASSIGN_PARTITIONS) is not None:
                if loop.time() >= deadline:
                    return timed_out
                await asyncio.sleep(ADMIN_POLL_S)
        except KazooException as e:
            return ErrorCode.request_timed_out, f"ZooKeeper: {e!r}"
        return ErrorCode.none, None

    async def _reassignment_started(self, request: znodes.PartitionReplicas) -> Outcome:
        """Started (or done) when the topic znode's target replicas are the ones asked for."""
        try:
            znode = await self._topic_znode(request.topic)
        except KazooException as e:
            return ErrorCode.request_timed_out, f"ZooKeeper: {e!r}"
        except znodes.MALFORMED:
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

    async def stop_admin(self) -> None:
        """Nothing to wait for: a cluster's admin operations change ZooKeeper, not local logs."""

    async def allocate_producer_id_block(self, size: int = znodes.PRODUCER_ID_BLOCK_SIZE) -> range:
        """The next block of producer ids, unique across the cluster: a conditional update of
        /latest_producer_id_block, retried when another broker took a block meanwhile.
        ZooKeeperUnavailableError when ZooKeeper cannot be reached."""
        try:
            return await self._allocate_producer_id_block(size)
        except KazooException as e:
            raise ZooKeeperUnavailableError(f"ZooKeeper: {e!r}") from e

    async def _allocate_producer_id_block(self, size: int) -> range:
        while True:
            data, stat = await self.zk.get(znodes.LATEST_PRODUCER_ID_BLOCK)
            if data:
                block = znodes.ProducerIdBlock.decode(data).next(self.node_id, size)
            else:
                block = znodes.ProducerIdBlock(self.node_id, 0, size - 1)
            try:
                await self.zk.set(znodes.LATEST_PRODUCER_ID_BLOCK, block.encode(), stat.version)
            except BadVersionError:
                continue
            return range(block.block_start, block.block_end + 1)
