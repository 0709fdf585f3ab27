"""Hostile bytes against one broker of a 3-broker cluster, seeded and bounded in time: the
fuzzed broker and its two peers keep serving, and no acknowledged acks=all record is lost.

The fuzzed broker is the controller. Besides the single-broker test's classes (tests/wire_fuzz.py:
``length`` prefixes, ``mutated`` samples, ``random`` frames) it gets requests that name what
exists in the cluster (``cluster-valid`` as they are, ``cluster-mutated`` with bit flips and
truncations): the fuzz topics (one with a 249-character name) and their ids, partitions,
broker ids 1-3 as replica ids and replica assignments, the brokers' epochs, groups the fuzzed
broker coordinates, valid record batches, short admin timeouts; among them ``replica-fetch``:
Fetch of every version as if sent by a follower (replica id or v15's replica state). ``inter-broker`` frames use the API keys of Kafka's controller-to-broker and
KRaft RPCs, which Strom does not serve (its controller writes ZooKeeper instead).

Throughout, an idempotent acks=all producer writes to a topic of replication factor 3 and
min.insync.replicas 2 that the fuzz never names, and every broker is asked for Metadata twice
a second. At the end every acknowledged record is read back, each broker still answers and is
registered, the canary's ISRs are whole again, and no broker logged a traceback.
"""

from __future__ import annotations

import datetime
import random
import struct
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from cluster_harness import Cluster
from cluster_workload import KeyedProducer, TailingConsumer, check_delivery
from kafka_wire import GroupWire
from strom.broker.zk import znodes
from strom.protocol.apis import SUPPORTED_VERSIONS, ApiKey
from strom.records.codec import RecordSpec, encode_batch
from wire_fuzz import FAILURES, Case, interleave, length_cases, mutated_cases, random_cases, run_case
from wire_requests import Vocabulary

pytestmark = pytest.mark.cluster

CLUSTER = {"brokers": 3}
SEED = 20261127
# How long cases are sent (the cases are many more than fit: a busy machine sends fewer).
FUZZ_SECONDS = 40.0
WORKERS = 6
# A case unanswered this long counts as a wedge (generous: 2 cores, 3 brokers, ZooKeeper).
CASE_TIMEOUT_S = 10.0
HEALTH_INTERVAL_S = 0.5
HEALTH_TIMEOUT_S = 10.0
CANARY_TOPIC = "fuzz-canary"
FUZZ_TOPICS = ("fuzz-target", "fuzz-single")
# The longest legal topic name (249 characters): its partition directories' names are near the
# file system's 255-byte limit.
LONG_NAME = "fuzz-long-".ljust(249, "x")
# Names the fuzz may create and delete; never the canary's.
FUZZ_NAMES = (*FUZZ_TOPICS, "fuzz-new-0", "fuzz-new-1", LONG_NAME)
# Kafka's inter-broker RPCs: LeaderAndIsr, StopReplica, UpdateMetadata, ControlledShutdown,
# AlterPartition, UpdateFeatures, Envelope, BrokerRegistration, BrokerHeartbeat, UnregisterBroker,
# AllocateProducerIds.
INTER_BROKER_APIS = (4, 5, 6, 7, 56, 57, 58, 62, 63, 64, 67)
MIN_CASES = 1_500


def _ms(low: int, high: int) -> Callable[[random.Random], datetime.timedelta]:
    return lambda rng: datetime.timedelta(milliseconds=rng.randint(low, high))


def _one_of(*values: Any) -> Callable[[random.Random], Any]:
    return lambda rng: rng.choice(values)


def coordinated_groups(cluster: Cluster, broker_id: int, wanted: int = 2) -> list[str]:
    """Group ids whose coordinator is broker ``broker_id``, and one whose coordinator is not
    (polled: the first FindCoordinator creates the offsets topic)."""
    broker = cluster.broker(broker_id)

    def find() -> list[str] | None:
        mine: list[str] = []
        other: list[str] = []
        with GroupWire(broker.host, broker.port) as wire:
            for i in range(100):
                group = f"fuzz-group-{i}"
                (coordinator,) = wire.find_coordinator(group).coordinators
                if coordinator.error_code != ErrorCode.none:
                    return None
                (mine if coordinator.node_id == broker_id else other).append(group)
                if len(mine) >= wanted and other:
                    return [*mine, other[0]]
        return None

    return cluster.wait_for(find, f"groups coordinated by broker {broker_id}", timeout=30)


def cluster_vocabulary(cluster: Cluster, target: int) -> Vocabulary:
    """Field values that name the cluster's fuzz topics (never the canary), its brokers,
    partitions and groups coordinated by the ``target`` broker, so that requests get past
    validation into the handlers, the coordinator and ZooKeeper writes."""
    topic_ids: list[uuid.UUID] = []
    for topic in FUZZ_TOPICS:
        data, _ = cluster.zk.get(znodes.topic_path(topic))
        topic_id = znodes.TopicZNode.decode(data).topic_id
        assert topic_id is not None
        topic_ids.append(topic_id)
    epochs = [cluster.broker_epoch(n) or -1 for n in cluster.broker_ids]
    batch = encode_batch([RecordSpec(b"k", b"fuzz"), RecordSpec(None, b"fuzz-2")])
    # Weighted towards what exists, so that valid requests get past the lookups.
    topic = _one_of("fuzz-target", "fuzz-target", *FUZZ_NAMES)
    broker = _one_of(1, 2, 3, 1, 2, 3, -1, 4)
    partition = _one_of(0, 1, 2, 0, 1, 2, 0, 1, 2, 3, -1)
    epoch = _one_of(-1, 0, 1, 2, 7)
    offset = _one_of(0, 1, 2, 5, 40, -1, 1 << 40)
    group = _one_of(*coordinated_groups(cluster, target))
    return {
        "topic": topic,
        "name": topic,
        "topic_name": topic,
        # DeleteTopics v1-5 (v6 names topics in "name"): fuzz-target mostly stays, the rest churn.
        "topic_names": _one_of(*(name for name in FUZZ_NAMES if name != "fuzz-target")),
        "topic_id": _one_of(*topic_ids, uuid.uuid4()),
        "resource_name": _one_of(*FUZZ_NAMES, "1", "2", "3", ""),
        "resource_type": _one_of(2, 4, 8),
        "partition": partition,
        "partition_index": partition,
        "index": partition,
        "partitions": partition,
        "partition_indexes": partition,
        "replica_id": _one_of(-1, -1, -1, *cluster.broker_ids, 4),  # a consumer, or a follower
        "broker_ids": broker,
        "replicas": broker,
        "replica_epoch": _one_of(-1, *epochs),
        "leader_epoch": epoch,
        "current_leader_epoch": epoch,
        "last_fetched_epoch": epoch,
        "committed_leader_epoch": epoch,
        "fetch_offset": offset,
        "log_start_offset": offset,
        "offset": offset,
        "committed_offset": offset,
        "timestamp": _one_of(-1, -2, -3, 0, 1 << 41),
        "records": _one_of(batch),
        "acks": _one_of(-1, 0, 1),
        "num_partitions": _one_of(1, 2, 3, -1),
        "replication_factor": _one_of(1, 2, 3, -1),
        "count": _one_of(2, 3, 4),
        "group_id": group,
        "key": group,
        "coordinator_keys": group,
        "groups": group,
        "groups_names": group,
        "max_bytes": _one_of(1, 1024, 1 << 20),
        "partition_max_bytes": _one_of(1, 1024, 1 << 20),
        "min_bytes": _one_of(0, 1, 1 << 20),
        "max_wait": _ms(0, 200),
        "timeout": _ms(0, 1000),
        "session_id": _one_of(0, 0, 1, 2),
        "session_epoch": _one_of(-1, 0, 0, 1),
        "election_type": _one_of(0, 1),
        "isolation_level": _one_of(0, 1),
        "transactional_id": _one_of(None, None, None, "fuzz-tx"),
        "protocol_type": _one_of("consumer", "consumer", "other"),
        # JoinGroup waits for the rebalance (up to the rebalance timeout: short); members leave
        # after the session timeout (the broker's minimum is 6 s).
        "session_timeout": _ms(6000, 7000),
        "rebalance_timeout": _ms(0, 1000),
        "member_id": _one_of("", "", "fuzz-member"),
        "group_instance_id": _one_of(None, None, "fuzz-static"),
        "generation_id": _one_of(-1, 0, 1, 2),
        "key_type": _one_of(0, 0, 1),
    }


def inter_broker_cases(rng: random.Random, count: int) -> Iterator[Case]:
    """Frames of API keys Strom does not serve (kio knows some of them only): a request header,
    v1 or v2 (flexible), and a random body."""
    for _ in range(count):
        api_key = rng.choice(INTER_BROKER_APIS)
        version = rng.randint(0, 8)
        header = (
            struct.pack(">hhih", api_key, version, 1, 4) + b"fuzz" + (b"\0" if rng.random() < 0.5 else b"")
        )
        payload = header + rng.randbytes(rng.randint(0, 80))
        yield Case("inter-broker", struct.pack(">i", len(payload)) + payload, api_key, version)


class HealthCheck:
    """Asks every broker for the canary topic's Metadata every HEALTH_INTERVAL_S; keeps each
    failure and the slowest answer."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.failures: list[str] = []
        self.slowest = 0.0
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health-check", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(HEALTH_INTERVAL_S):
            for n in self.cluster.broker_ids:
                started = time.monotonic()
                try:
                    answer = self.cluster.metadata(CANARY_TOPIC, via=n, timeout=HEALTH_TIMEOUT_S)
                    if answer.topic_errors.get(CANARY_TOPIC) != ErrorCode.none:
                        self.failures.append(f"broker {n}: {answer.topic_errors}")
                except Exception as exc:
                    self.failures.append(f"broker {n}: {exc!r}")
                self.slowest = max(self.slowest, time.monotonic() - started)
            self.rounds += 1

    def __enter__(self) -> HealthCheck:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(HEALTH_TIMEOUT_S * 4)


def fuzz(host: str, port: int, cases: Iterator[Case], seconds: float) -> list[tuple[Case, str]]:
    """Send cases in order (made as they are taken) from WORKERS threads until they run out or
    ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    lock = threading.Lock()
    results: list[tuple[Case, str]] = []

    def worker() -> None:
        while time.monotonic() < deadline:
            with lock:
                case = next(cases, None)
            if case is None:
                return
            outcome = run_case(host, port, case, CASE_TIMEOUT_S)
            with lock:
                results.append((case, outcome))

    with ThreadPoolExecutor(WORKERS) as pool:
        for future in [pool.submit(worker) for _ in range(WORKERS)]:
            future.result()
    return results


def api_name(api_key: int) -> str:
    try:
        return ApiKey(api_key).name
    except ValueError:
        return f"api-{api_key}"


def report(results: list[tuple[Case, str]]) -> str:
    """Per API: cases sent and their outcomes (errors by name), most frequent first."""
    per_api: dict[str, Counter[str]] = {}
    per_kind: dict[str, Counter[str]] = {}
    for case, outcome in results:
        per_api.setdefault(api_name(case.api_key), Counter())[outcome] += 1
        per_kind.setdefault(case.kind, Counter())[outcome] += 1
    lines = []
    for title, table in (("kind", per_kind), ("api", per_api)):
        for name, counter in sorted(table.items(), key=lambda item: -sum(item[1].values())):
            outcomes = ", ".join(f"{k}={v}" for k, v in counter.most_common(6))
            lines.append(f"  {title} {name:28} {sum(counter.values()):6}  {outcomes}")
    return "\n".join(lines)


def test_a_fuzzed_broker_keeps_the_cluster_whole(cluster: Cluster) -> None:
    target = cluster.wait_for_controller()
    broker = cluster.broker(target)
    cluster.create_topic(
        CANARY_TOPIC, partitions=3, replication_factor=3, configs={"min.insync.replicas": "2"}
    )
    # The fuzzed broker leads every partition of the fuzz topics: their produce, fetch and
    # follower paths are all its own.
    peers = [n for n in cluster.broker_ids if n != target]
    cluster.create_topic("fuzz-target", assignments={p: [target, *peers] for p in range(3)})
    cluster.create_topic("fuzz-single", partitions=1, replication_factor=1, assignments={0: [target]})
    vocabulary = cluster_vocabulary(cluster, target)
    replica_vocabulary = {**vocabulary, "replica_id": _one_of(1, 2, 3)}

    rng = random.Random(SEED)
    cases = interleave(
        mutated_cases(rng, 9_000, kind="cluster-mutated", vocabulary=vocabulary),
        mutated_cases(rng, 5_000, kind="cluster-valid", vocabulary=vocabulary, intact=1.0),
        mutated_cases(rng, 2_500, kind="replica-fetch", vocabulary=replica_vocabulary, intact=0.5, apis={1}),
        length_cases(rng, per_version=8),
        mutated_cases(rng, 2_000),
        random_cases(rng, 2_000),
        inter_broker_cases(rng, 400),
    )

    with KeyedProducer("confluent", cluster.bootstrap, CANARY_TOPIC, rate=50) as producer:
        producer.wait_for_progress(cluster, timeout=30)
        with HealthCheck(cluster) as health:
            started = time.monotonic()
            results = fuzz(broker.host, broker.port, cases, FUZZ_SECONDS)
            elapsed = time.monotonic() - started
            # Still acknowledging after the fuzz: nothing it did wedged the canary's partitions.
            producer.wait_for_progress(cluster, timeout=30)
    topics = len(cluster.metadata(via=target, timeout=HEALTH_TIMEOUT_S).topic_errors)
    print(
        f"\n{len(results)} cases sent to broker {target} "
        f"in {elapsed:.1f}s; canary: {producer.count()} acknowledged, {len(producer.failed)} failed; "
        f"health: {health.rounds} rounds, slowest Metadata {health.slowest * 1000:.0f} ms; "
        f"{topics} topics after the fuzz"
    )
    print(report(results))

    failed = [
        (case.kind, api_name(case.api_key), case.version, case.frame[:64].hex(), outcome)
        for case, outcome in results
        if outcome.startswith(FAILURES)
    ]
    assert not failed, failed[:10]
    assert not health.failures, health.failures[:10]
    assert not producer.failed, producer.failed[:5]
    assert len(results) >= MIN_CASES
    sent_apis = {case.api_key for case, _ in results if case.kind == "cluster-valid"}
    assert set(SUPPORTED_VERSIONS) <= sent_apis, set(SUPPORTED_VERSIONS) - sent_apis
    # Replica-shaped fetches from a client are answered as Kafka answers them, not only closed.
    replica_fetches = Counter(outcome for case, outcome in results if case.kind == "replica-fetch")
    assert sum(replica_fetches.values()) > replica_fetches["closed"], replica_fetches

    assert all(b.running for b in cluster.brokers.values()), cluster.describe()
    cluster.wait_for_registered(timeout=30)
    cluster.wait_for_full_isr(CANARY_TOPIC, range(3), timeout=30)
    with TailingConsumer(cluster.bootstrap, CANARY_TOPIC) as consumer:
        consumer.wait_for(cluster, producer.acked, timeout=60)
    check_delivery(producer.acked, consumer.records)
    for n, b in cluster.brokers.items():
        log = b.log_path.read_text(errors="replace")
        where = log.find("Traceback")
        assert where < 0, f"broker {n} logged a traceback:\n{log[max(0, where - 2000) : where + 3000]}"
