"""Transactions in a 3-broker cluster: ``__transaction_state`` replicated (factor 3, min ISR 2),
markers sent to partition leaders on other brokers, and the coordinator moving when its broker
is killed with SIGKILL. Every transaction ends the same way on all its partitions; a
read_committed consumer sees each committed record exactly once and no aborted one."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer, TopicPartition

from cluster_harness import RECOVERY_TIMEOUT, Cluster
from integration.clients_util import confluent_consumer, poll_confluent
from integration.test_eos_copy import SUFFIX, Copier, committed, fill, read_committed_output
from kafka_wire import KafkaWire, kio_request
from strom.protocol.errors import ErrorCode

pytestmark = pytest.mark.cluster

CLUSTER = {
    "overrides": {
        "transaction.state.log.num.partitions": "3",
        "offsets.topic.num.partitions": "3",
    }
}
PARTITIONS = 3


def _producer(cluster: Cluster, transactional_id: str) -> Producer:
    return Producer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "transactional.id": transactional_id,
            "linger.ms": 2,
            "topic.metadata.refresh.interval.ms": 1000,
            "transaction.timeout.ms": 30000,
        }
    )


def _coordinator(cluster: Cluster, transactional_id: str) -> int | None:
    find = kio_request("find_coordinator", 3)
    for broker_id in cluster.live_ids():
        try:
            with KafkaWire.connect(cluster.address(broker_id)) as wire:
                response = wire.request(find.FindCoordinatorRequest(key=transactional_id, key_type=1))
        except OSError:
            continue
        if response.error_code == ErrorCode.none:
            return int(response.node_id)
    return None


def _read_committed(cluster: Cluster, topic: str, count: int, timeout: float) -> list[bytes]:
    consumer = confluent_consumer(
        cluster.bootstrap, **{"isolation.level": "read_committed", "group.id": uuid.uuid4().hex}
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        return sorted(c.value for c in poll_confluent(consumer, count, timeout) if c.value is not None)
    finally:
        consumer.close()


def _send(producer: Producer, topic: str, values: list[bytes]) -> None:
    for i, value in enumerate(values):
        producer.produce(topic, value=value, partition=i % PARTITIONS)
    producer.flush(15)


def test_markers_reach_partition_leaders_on_other_brokers(cluster: Cluster) -> None:
    topic = f"txn-cluster-{uuid.uuid4().hex[:6]}"
    cluster.create_topic(topic, partitions=PARTITIONS)
    producer = _producer(cluster, f"spread-{uuid.uuid4().hex[:6]}")
    producer.init_transactions(30)
    committed: list[bytes] = []
    for n in range(4):
        values = [f"t{n}-{i}".encode() for i in range(30)]
        producer.begin_transaction()
        _send(producer, topic, values)
        if n == 2:
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
            committed += values
    leaders = {cluster.metadata(topic).partition(topic, p).leader for p in range(PARTITIONS)}
    assert len(leaders) > 1  # the markers went to more than one broker
    assert _read_committed(cluster, topic, len(committed) + 1, timeout=5) == sorted(committed)


def test_the_coordinator_moves_when_its_broker_is_killed(cluster: Cluster) -> None:
    topic = f"txn-failover-{uuid.uuid4().hex[:6]}"
    cluster.create_topic(topic, partitions=PARTITIONS)
    transactional_id = f"failover-{uuid.uuid4().hex[:6]}"
    producer = _producer(cluster, transactional_id)
    producer.init_transactions(30)
    first = [f"first-{i}".encode() for i in range(30)]
    producer.begin_transaction()
    _send(producer, topic, first)
    coordinator = _coordinator(cluster, transactional_id)
    assert coordinator is not None
    cluster.kill(coordinator)
    # librdkafka finds the new coordinator, which loaded the Ongoing transaction from the
    # replicated log, and commits there.
    producer.commit_transaction(RECOVERY_TIMEOUT + 30)
    deadline = time.monotonic() + RECOVERY_TIMEOUT
    while (moved := _coordinator(cluster, transactional_id)) in (None, coordinator) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert moved not in (None, coordinator)
    second = [f"second-{i}".encode() for i in range(30)]
    producer.begin_transaction()
    _send(producer, topic, second)
    producer.commit_transaction(30)
    assert _read_committed(cluster, topic, 61, timeout=10) == sorted(first + second)
    cluster.start_broker(coordinator)


def test_exactly_once_copy_through_a_leader_and_a_coordinator_crash(cluster: Cluster, tmp_path: Path) -> None:
    """Kafka's transactions_test on the cluster: the copier (tests/eos_copier.py, librdkafka) is
    killed with SIGKILL, then an output partition's leader and then the transaction coordinator
    are killed and started again; a read_committed consumer sees every input record once, in order."""
    run = uuid.uuid4().hex[:6]
    source, sink, group = f"eos-in-{run}", f"eos-out-{run}", f"eos-{run}"
    cluster.create_topic(source, partitions=PARTITIONS)
    cluster.create_topic(sink, partitions=PARTITIONS)
    records = 30_000
    values = fill(cluster.bootstrap, source, records, PARTITIONS)
    copier = Copier("confluent", cluster.bootstrap, source, sink, group, tmp_path / "copier.log")
    copier.start()
    deadline = time.monotonic() + 240

    def wait_until(target: int) -> int:
        while (done := committed(cluster.bootstrap, group, source, PARTITIONS)) < target:
            assert time.monotonic() < deadline, (done, copier.log.read_text()[-3000:])
            copier.ensure_running()
            time.sleep(0.2)
        return done

    try:
        copier.wait_for_transactions(10, deadline)  # 5,000 of 30,000 records copied
        copier.kill9()
        copier.start()
        copier.wait_for_transactions(copier.transactions() + 2, deadline)
        leader = cluster.metadata(sink).partition(sink, 0).leader
        cluster.restart(leader, crash=True)
        coordinator = _coordinator(cluster, f"copier-{group}")
        copier.wait_for_transactions(copier.transactions() + 2, deadline)
        if coordinator is not None:
            cluster.restart(coordinator, crash=True)
        wait_until(records)
    finally:
        copier.stop()
    got = read_committed_output(cluster.bootstrap, sink, PARTITIONS)
    for p in range(PARTITIONS):
        assert got[p] == [v + SUFFIX for v in values[p]], p
