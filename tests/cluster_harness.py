"""A Strom cluster for tests: one ZooKeeper node and N broker processes, each broker on its own
loopback address (broker N on 127.0.0.(10 + N)), all data under one folder.

    with Cluster(tmp_path, brokers=3) as cluster:
        cluster.create_topic("t", partitions=3, replication_factor=3)
        leader = cluster.wait_for_leader("t", 0)
        cluster.kill(leader.leader)                      # SIGKILL; stop() is SIGTERM
        cluster.wait_for_leader("t", 0, exclude={leader.leader})

Faults per broker: ``kill`` (SIGKILL), ``stop_broker`` (SIGTERM), ``pause``/``resume``
(SIGSTOP/SIGCONT: its sockets stay open and nothing answers), ``restart``. With
``zookeeper_proxies=True`` each broker reaches ZooKeeper through its own ``NetProxy``
(``cluster.zk_proxy(n).blackhole()`` cuts that broker off ZooKeeper alone). With
``zookeeper_nodes=3`` ZooKeeper is a quorum of three (``cluster.zookeeper`` is a
``ZooKeeperEnsemble`` whose nodes die and restart one by one); each broker then has one proxy
per ZooKeeper node, and ``cut_zookeeper(n)`` / ``heal_zookeeper(n)`` act on all of them.

Two views of the cluster's state: ``partition_state`` / ``controller_id`` read ZooKeeper, the
truth the controller writes; ``metadata`` asks a broker, which is what clients see. The
``wait_for_*`` helpers poll until a condition holds and fail with the state they last saw and the
tail of every log. ``stop`` tears everything down, whatever state the processes are in.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import warnings
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError
from kio.schema.create_topics.v7 import request as create_topics7
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12 import request as metadata12

from brokerproc import BrokerProcess, free_port
from kafka_wire import REQUEST_TIMEOUT, ZERO_UUID, KafkaWire
from netproxy import NetProxy
from strom.broker.zk import znodes
from strom.cli.local_cluster import ZooKeeperServer, broker_host, log_tail
from strom.records.batch import InvalidBatchError
from strom.records.codec import decode_batches
from zkserver import ZooKeeperEnsemble

T = TypeVar("T")

# Short timeouts so that failures are detected and healed within a test's time (2 cores shared
# by three brokers, ZooKeeper and the clients: shorter sessions expire spuriously under load).
SESSION_TIMEOUT_MS = 2000
CLUSTER_TEST_CONFIG: dict[str, str] = {
    "zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS),
    "zookeeper.connection.timeout.ms": "10000",
    "replica.lag.time.max.ms": "1500",
    "replica.fetch.wait.max.ms": "100",
    "replica.fetch.backoff.ms": "100",
    "replica.socket.timeout.ms": "3000",
    "replica.high.watermark.checkpoint.interval.ms": "1000",
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "offsets.topic.num.partitions": "5",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "group.initial.rebalance.delay.ms": "0",
    "auto.leader.rebalance.enable": "false",
    "leader.imbalance.check.interval.seconds": "2",
    "unclean.leader.election.enable": "false",
    "num.partitions": "3",
    "log.flush.offset.checkpoint.interval.ms": "1000",
    "controlled.shutdown.retry.backoff.ms": "200",
}
CHROOT = "/strom"
# How long an outage may last: Kafka's replication test allows the session timeout plus 10 s.
RECOVERY_TIMEOUT = SESSION_TIMEOUT_MS / 1000 + 10


class ClusterError(AssertionError):
    """A cluster did not reach the state a test waited for; the message carries every log's tail."""


@dataclass(frozen=True)
class PartitionInfo:
    """One partition as Metadata reports it (leader -1: none)."""

    topic: str
    partition: int
    error_code: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline: tuple[int, ...]


@dataclass(frozen=True)
class ClusterMetadata:
    """A Metadata v12 answer: brokers (id -> host:port), the controller and each partition."""

    answered_by: int
    cluster_id: str | None
    controller_id: int
    brokers: dict[int, str]
    partitions: dict[tuple[str, int], PartitionInfo]
    topic_errors: dict[str, int]

    def partition(self, topic: str, partition: int) -> PartitionInfo:
        return self.partitions[(topic, partition)]


@dataclass(frozen=True)
class PartitionState:
    """A partition's state znode: Kafka's LeaderAndIsr and the znode version (partition epoch)."""

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int
    partition_epoch: int


class Cluster:
    """ZooKeeper plus brokers 1..``brokers`` under ``folder``.

    ``overrides`` apply to every broker on top of ``CLUSTER_TEST_CONFIG``; ``broker_overrides``
    to one broker each. The listener, log.dirs, broker.id and zookeeper.connect are the
    cluster's to set.
    """

    def __init__(
        self,
        folder: Path,
        brokers: int = 3,
        *,
        overrides: Mapping[str, str] | None = None,
        broker_overrides: Mapping[int, Mapping[str, str]] | None = None,
        zookeeper_proxies: bool = False,
        zookeeper_tick_ms: int = 200,
        zookeeper_nodes: int = 1,
        ready_timeout: float = 30.0,
    ) -> None:
        self.folder = folder
        self.zookeeper: ZooKeeperServer | ZooKeeperEnsemble = (
            ZooKeeperServer(folder / "zookeeper", tick_ms=zookeeper_tick_ms)
            if zookeeper_nodes == 1
            else ZooKeeperEnsemble(folder / "zookeeper", zookeeper_nodes, tick_ms=zookeeper_tick_ms)
        )
        # Per broker, one proxy per ZooKeeper node (the order of zookeeper.connect).
        self._zk_proxies: dict[int, list[NetProxy]] = {}
        self._use_zk_proxies = zookeeper_proxies
        self._overrides = {**CLUSTER_TEST_CONFIG, **(overrides or {})}
        self._broker_overrides = {n: dict(o) for n, o in (broker_overrides or {}).items()}
        self._ready_timeout = ready_timeout
        self.broker_ids = list(range(1, brokers + 1))
        self.brokers: dict[int, BrokerProcess] = {}
        self.paused: set[int] = set()
        self._zk: KazooClient | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def _broker_configs(self, broker_id: int) -> dict[str, str]:
        proxies = self._zk_proxies.get(broker_id)
        connect = ",".join(p.address for p in proxies) if proxies else self.zookeeper.connect
        return {
            **self._overrides,
            **self._broker_overrides.get(broker_id, {}),
            "broker.id": str(broker_id),
            "zookeeper.connect": connect + CHROOT,
        }

    def start(self) -> Cluster:
        """Start ZooKeeper and every broker (in parallel); return once each broker listens.

        Whether they formed a cluster is for ``wait_for_registered`` to say."""
        try:
            self.zookeeper.start()
            for n in self.broker_ids:
                if self._use_zk_proxies:
                    self._zk_proxies[n] = [
                        NetProxy(node).start() for node in self.zookeeper.connect.split(",")
                    ]
                host = broker_host(n)
                self.brokers[n] = BrokerProcess(
                    self.folder / f"broker-{n}",
                    host=host,
                    port=free_port(host),
                    overrides=self._broker_configs(n),
                    ready_timeout=self._ready_timeout,
                )
            with ThreadPoolExecutor(len(self.brokers)) as pool:
                for future in [pool.submit(b.start) for b in self.brokers.values()]:
                    future.result()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Tear everything down, whatever state it is in: paused brokers are resumed first (a
        stopped process ignores SIGTERM), brokers get SIGTERM in parallel and SIGKILL if they
        linger, then the proxies and ZooKeeper go."""
        for n in list(self.paused):
            self.resume(n)
        if self._zk is not None:
            with contextlib.suppress(Exception):
                self._zk.stop()
                self._zk.close()
            self._zk = None

        def down(broker: BrokerProcess) -> None:
            if broker.running:
                try:
                    broker.stop(timeout=15)
                except Exception:
                    broker.kill9()  # stop() already killed it; a clean exit is not this test's point

        with ThreadPoolExecutor(max(1, len(self.brokers))) as pool:
            list(pool.map(down, self.brokers.values()))
        for proxies in self._zk_proxies.values():
            for proxy in proxies:
                proxy.stop()
        self.zookeeper.stop()

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- one broker --------------------------------------------------------------------------

    def broker(self, broker_id: int) -> BrokerProcess:
        return self.brokers[broker_id]

    def zk_proxy(self, broker_id: int) -> NetProxy:
        """The proxy on broker ``broker_id``'s link to ZooKeeper (``zookeeper_proxies=True``; with
        an ensemble, its link to the first node)."""
        return self._zk_proxies[broker_id][0]

    def cut_zookeeper(self, broker_id: int) -> None:
        """Blackhole broker ``broker_id``'s links to every ZooKeeper node: a network partition
        between it and ZooKeeper (its session expires after zookeeper.session.timeout.ms)."""
        for proxy in self._zk_proxies[broker_id]:
            proxy.blackhole()

    def heal_zookeeper(self, broker_id: int) -> None:
        for proxy in self._zk_proxies[broker_id]:
            proxy.pass_through()

    def kill(self, broker_id: int) -> None:
        """SIGKILL: a crash. Its ZooKeeper session lives on until it times out."""
        self.paused.discard(broker_id)
        self.brokers[broker_id].kill9()

    def stop_broker(self, broker_id: int, timeout: float = 30.0) -> int:
        """SIGTERM and wait: a clean (controlled) shutdown; returns the exit status."""
        return self.brokers[broker_id].stop(timeout)

    def start_broker(self, broker_id: int) -> None:
        self.brokers[broker_id].start()

    def restart(self, broker_id: int, *, crash: bool = False) -> None:
        """Stop (SIGTERM, or SIGKILL with crash) and start again on the same address and data."""
        self.paused.discard(broker_id)
        self.brokers[broker_id].restart(crash=crash)

    def pause(self, broker_id: int) -> None:
        """SIGSTOP: the process freezes with its connections open, as a long GC pause would."""
        pid = self.brokers[broker_id].pid
        assert pid is not None and self.brokers[broker_id].running
        os.kill(pid, signal.SIGSTOP)
        self.paused.add(broker_id)

    def resume(self, broker_id: int) -> None:
        pid = self.brokers[broker_id].pid
        if pid is not None and broker_id in self.paused:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.paused.discard(broker_id)

    def live_ids(self) -> list[int]:
        """Brokers whose process runs and is not paused."""
        return [n for n, b in self.brokers.items() if b.running and n not in self.paused]

    def ensure_all_running(self) -> None:
        """Undo what an earlier (maybe failed) test left: resume the paused, start the stopped."""
        for n in list(self.paused):
            self.resume(n)
        for proxies in self._zk_proxies.values():
            for proxy in proxies:
                proxy.pass_through()
        for broker in self.brokers.values():
            if not broker.running:
                broker.start()

    @property
    def bootstrap(self) -> str:
        """Every broker's address: clients find the live ones among them."""
        return ",".join(b.bootstrap for b in self.brokers.values())

    def address(self, broker_id: int) -> str:
        return self.brokers[broker_id].bootstrap

    # -- ZooKeeper's view --------------------------------------------------------------------

    @property
    def zk(self) -> KazooClient:
        """A kazoo client on the cluster's chroot (the test's own session, direct, no proxy).
        Its reads go through ``client.retry``: a test that takes ZooKeeper's quorum away can
        outlast this session too, and a read then retries on the new one (up to 30 s)."""
        if self._zk is None:
            client = KazooClient(
                hosts=self.zookeeper.connect + CHROOT,
                timeout=10.0,
                command_retry={"max_tries": -1, "max_delay": 1.0, "deadline": 30.0},
            )
            with warnings.catch_warnings():
                # The brokers create the chroot; until the first one has, kazoo warns at connect.
                warnings.filterwarnings("ignore", "No chroot path exists")
                client.start(timeout=10)
            self._zk = client
        return self._zk

    def _get(self, path: str) -> tuple[bytes, Any] | None:
        try:
            data, stat = self.zk.retry(self.zk.get, path)
        except NoNodeError:
            return None
        return data, stat

    def registered_brokers(self) -> set[int]:
        """Broker ids with a live registration (ephemeral /brokers/ids/N) made by the broker's current
        process: after a SIGKILL the old session's registration lingers until it expires, and the
        restarted broker registers only then."""
        registered = set()
        try:
            children = self.zk.retry(self.zk.get_children, znodes.BROKER_IDS)
        except NoNodeError:
            return registered
        for child in children:
            broker_id = int(child)
            stat = self.zk.retry(self.zk.exists, znodes.broker_path(broker_id))
            broker = self.brokers.get(broker_id)
            # ZooKeeper's ctime and the test's clock are the same machine's wall clock.
            if stat is not None and (broker is None or stat.ctime / 1000 >= broker.started_at - 1):
                registered.add(broker_id)
        return registered

    def broker_epoch(self, broker_id: int) -> int | None:
        """The registration's creation zxid: Kafka's broker epoch, new at every (re)registration."""
        found = self._get(znodes.broker_path(broker_id))
        return found[1].czxid if found is not None else None

    def controller_id(self) -> int | None:
        """The broker holding /controller, if any."""
        found = self._get(znodes.CONTROLLER)
        return znodes.ControllerZNode.decode(found[0]).broker_id if found is not None else None

    def controller_epoch(self) -> tuple[int, int] | None:
        """(/controller_epoch's value, its znode version) — the version fences controller writes."""
        found = self._get(znodes.CONTROLLER_EPOCH)
        if found is None:
            return None
        return znodes.decode_controller_epoch(found[0]), found[1].version

    def partition_state(self, topic: str, partition: int) -> PartitionState | None:
        found = self._get(znodes.partition_state_path(topic, partition))
        if found is None:
            return None
        state = znodes.LeaderAndIsr.decode(found[0])
        return PartitionState(
            state.leader, state.leader_epoch, tuple(state.isr), state.controller_epoch, found[1].version
        )

    def assignment(self, topic: str) -> dict[int, list[int]]:
        """The replica assignment of ``topic`` (partition -> replicas in preference order)."""
        found = self._get(znodes.topic_path(topic))
        return znodes.TopicZNode.decode(found[0]).partitions if found is not None else {}

    def replica_log(self, broker_id: int, topic: str, partition: int = 0) -> dict[int, bytes | None] | None:
        """offset -> value in broker ``broker_id``'s copy of a partition, read from its segment
        files (what ``strom dump-log`` prints); None while a batch is half written."""
        folder = self.brokers[broker_id].data_dir / f"{topic}-{partition}"
        records: dict[int, bytes | None] = {}
        for segment in sorted(folder.glob("*.log")):
            try:
                batches = decode_batches(segment.read_bytes())
            except (InvalidBatchError, FileNotFoundError):  # written or rolled as we read
                return None
            for batch in batches:
                for record in batch.records:
                    records[record.offset] = record.value
        return records

    def wait_for_identical_replicas(self, topic: str, partitions: Iterable[int]) -> None:
        """Until every replica of each partition holds the same records at the same offsets (call
        it with writes stopped): no offset holds two values, none is missing on a replica."""
        for p in partitions:
            replicas = self.assignment(topic).get(p, self.broker_ids)

            def identical(p: int = p, replicas: list[int] = replicas) -> bool:
                logs = [self.replica_log(n, topic, p) for n in replicas]
                return all(log is not None and log == logs[0] for log in logs)

            self.wait_for(identical, f"every replica of {topic}-{p} holding the same records")

    # -- what clients see --------------------------------------------------------------------

    def metadata(self, *topics: str, via: int | None = None, timeout: float = 3.0) -> ClusterMetadata:
        """Metadata v12 (all topics when none is named) from broker ``via``, else from the first
        live broker that answers."""
        candidates = [via] if via is not None else self.live_ids()
        errors: list[str] = []
        for n in candidates:
            broker = self.brokers[n]
            try:
                with KafkaWire(broker.host, broker.port, timeout=timeout) as wire:
                    response = wire.request(
                        metadata12.MetadataRequest(
                            topics=tuple(
                                metadata12.MetadataRequestTopic(topic_id=ZERO_UUID, name=t) for t in topics
                            )
                            if topics
                            else None,
                            allow_auto_topic_creation=False,
                            include_topic_authorized_operations=False,
                        )
                    )
            except OSError as exc:
                errors.append(f"broker {n}: {exc!r}")
                continue
            return _metadata(n, response)
        raise ConnectionError(f"no broker answered Metadata: {'; '.join(errors) or 'none is live'}")

    def create_topic(
        self,
        name: str,
        *,
        partitions: int = 3,
        replication_factor: int = 3,
        configs: Mapping[str, str] | None = None,
        assignments: Mapping[int, list[int]] | None = None,
        timeout: float = 30.0,
        via: int | None = None,
    ) -> None:
        """CreateTopics v7 through broker ``via`` (default: the first live one); returns once
        every partition has a leader whose broker agrees it leads (so clients can produce at once)."""
        topic = create_topics7.CreatableTopic(
            name=name,
            num_partitions=partitions if assignments is None else -1,
            replication_factor=replication_factor if assignments is None else -1,
            assignments=tuple(
                create_topics7.CreatableReplicaAssignment(partition_index=p, broker_ids=tuple(r))
                for p, r in (assignments or {}).items()
            ),
            configs=tuple(
                create_topics7.CreatableTopicConfig(name=k, value=v) for k, v in (configs or {}).items()
            ),
        )
        n = via if via is not None else self.live_ids()[0]
        with KafkaWire(self.brokers[n].host, self.brokers[n].port, timeout=timeout) as wire:
            response = wire.request(
                create_topics7.CreateTopicsRequest(topics=(topic,), timeout=REQUEST_TIMEOUT)
            )
        result = response.topics[0]
        if result.error_code != ErrorCode.none:
            raise ClusterError(f"CreateTopics {name}: error {result.error_code} {result.error_message}")
        for p in range(partitions if assignments is None else len(assignments)):
            self.wait_for_leader(name, p, timeout=timeout)

    # -- waiting -----------------------------------------------------------------------------

    def wait_for(
        self,
        condition: Callable[[], T | None],
        what: str,
        timeout: float = RECOVERY_TIMEOUT,
        interval: float = 0.1,
    ) -> T:
        """Poll ``condition`` until it returns something truthy, and return that. Exceptions
        count as "not yet" (a broker may be between lives, the test's own ZooKeeper session
        expired with a quorum lost); the last one is in the failure."""
        deadline = time.monotonic() + timeout
        last: object = None
        while True:
            try:
                value = condition()
            except (OSError, ConnectionError, AssertionError, KeyError, KazooException) as exc:
                value, last = None, exc
            else:
                last = value
            if value:
                return value
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"{what}: not within {timeout:.1f}s (last seen: {last!r})\n{self.describe()}"
                )
            time.sleep(interval)

    def wait_for_registered(self, broker_ids: Iterable[int] | None = None, timeout: float = 30.0) -> None:
        """Until every named broker (default: all) has registered in ZooKeeper."""
        wanted = set(broker_ids if broker_ids is not None else self.broker_ids)
        self.wait_for(
            lambda: wanted <= self.registered_brokers(), f"brokers {sorted(wanted)} registered", timeout
        )
        # ... and every running broker has seen those registrations (its watch delivers them a
        # moment later): a topic created through any broker may name them.
        self.wait_for(
            lambda: all(wanted <= set(self.metadata(via=n).brokers) for n in self.live_ids()),
            f"brokers {sorted(wanted)} known to every running broker",
            timeout,
        )

    def wait_for_controller(self, exclude: Collection[int] = (), timeout: float = RECOVERY_TIMEOUT) -> int:
        """Until a live broker outside ``exclude`` holds /controller and reports itself as the
        controller in Metadata; its id."""

        def elected() -> int | None:
            controller = self.controller_id()
            if controller is None or controller in exclude or controller not in self.live_ids():
                return None
            return controller if self.metadata(via=controller).controller_id == controller else None

        return self.wait_for(elected, f"a controller outside {sorted(exclude)}", timeout)

    def wait_for_leader(
        self,
        topic: str,
        partition: int,
        *,
        exclude: Collection[int] = (),
        min_epoch: int = 0,
        timeout: float = RECOVERY_TIMEOUT,
    ) -> PartitionInfo:
        """Until ZooKeeper names a live leader outside ``exclude`` with leader epoch >=
        ``min_epoch``, and that broker answers Metadata as leader in the same epoch."""

        def elected() -> PartitionInfo | None:
            state = self.partition_state(topic, partition)
            if state is None or state.leader < 0 or state.leader in exclude or state.leader_epoch < min_epoch:
                return None
            if state.leader not in self.live_ids():
                return None
            info = self.metadata(topic, via=state.leader).partition(topic, partition)
            if info.leader == state.leader and info.leader_epoch == state.leader_epoch:
                return info
            return None

        return self.wait_for(elected, f"a leader of {topic}-{partition} outside {sorted(exclude)}", timeout)

    def wait_for_isr(
        self, topic: str, partition: int, size: int, *, timeout: float = RECOVERY_TIMEOUT
    ) -> PartitionState:
        """Until the partition's ISR in ZooKeeper has exactly ``size`` members."""

        def shrunk_or_grown() -> PartitionState | None:
            state = self.partition_state(topic, partition)
            return state if state is not None and len(state.isr) == size else None

        return self.wait_for(shrunk_or_grown, f"ISR of {topic}-{partition} with {size} members", timeout)

    def wait_for_full_isr(self, topic: str, partitions: Iterable[int], *, timeout: float = 30.0) -> None:
        """Until every named partition's ISR holds all its replicas."""
        for p in partitions:
            replicas = len(self.assignment(topic).get(p, self.broker_ids))
            self.wait_for_isr(topic, p, replicas, timeout=timeout)

    # -- diagnostics -------------------------------------------------------------------------

    def describe(self, lines: int = 25) -> str:
        """Processes, ZooKeeper's view and the tail of every log, for failure messages."""
        parts = []
        for n, broker in self.brokers.items():
            status = (
                "paused"
                if n in self.paused
                else ("running" if broker.running else f"exited {broker.returncode}")
            )
            parts.append(f"broker {n} at {broker.bootstrap}: {status}")
        try:
            parts.append(
                f"registered: {sorted(self.registered_brokers())}; controller: {self.controller_id()}"
            )
        except Exception as exc:
            parts.append(f"ZooKeeper unreadable: {exc!r}")
        for broker in self.brokers.values():
            parts.append(broker.log_tail(lines))
        parts.append(log_tail(self.zookeeper.log_path, 10))
        return "\n".join(parts)


def _metadata(answered_by: int, response: Any) -> ClusterMetadata:
    partitions: dict[tuple[str, int], PartitionInfo] = {}
    topic_errors: dict[str, int] = {}
    for topic in response.topics:
        topic_errors[topic.name] = topic.error_code
        for p in topic.partitions:
            partitions[(topic.name, p.partition_index)] = PartitionInfo(
                topic=topic.name,
                partition=p.partition_index,
                error_code=p.error_code,
                leader=p.leader_id,
                leader_epoch=p.leader_epoch,
                replicas=tuple(p.replica_nodes),
                isr=tuple(p.isr_nodes),
                offline=tuple(p.offline_replicas),
            )
    return ClusterMetadata(
        answered_by=answered_by,
        cluster_id=response.cluster_id,
        controller_id=response.controller_id,
        brokers={b.node_id: f"{b.host}:{b.port}" for b in response.brokers},
        partitions=partitions,
        topic_errors=topic_errors,
    )
