"""Issue 17 items 3, 6 and 7 (the broker's side) on a real cluster: three brokers, ZooKeeper, and
what an operator's old tool or typo writes there with kazoo.

- A topic znode without ``topic_id`` (Kafka 2.x's format) deletes nothing: every replica keeps its
  logs, and a broker restarted meanwhile starts and keeps them too.
- An invalid value in ``/config/topics/T`` stops no broker, restarted or running.
- A topic with a legal 249-character name is deleted without taking a log dir offline, and the
  brokers keep serving and restart.
"""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from cluster_harness import Cluster
from strom.broker.zk import znodes

pytestmark = pytest.mark.cluster

RECORDS = 60


def produce(cluster: Cluster, topic: str, partitions: int, records: int = RECORDS) -> None:
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True})
    failures: list[object] = []
    for i in range(records):
        producer.produce(
            topic,
            value=f"{topic}-{i}".encode(),
            partition=i % partitions,
            on_delivery=lambda e, _m: e and failures.append(e),
        )
    assert producer.flush(60) == 0 and failures == []


def consume_all(
    cluster: Cluster, topic: str, partitions: int, expected: int = RECORDS, via: int | None = None
) -> list[bytes]:
    """The ``expected`` records of ``topic`` from the start (fewer if they do not come within a
    minute), through broker ``via`` (default: any)."""
    bootstrap = cluster.address(via) if via is not None else cluster.bootstrap
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{time.monotonic_ns()}"})
    consumer.assign([KafkaTopicPartition(topic, p, 0) for p in range(partitions)])
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while len(values) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value())
    finally:
        consumer.close()
    return values


def logs_on_disk(cluster: Cluster, broker_id: int, topic: str) -> list[str]:
    """The entries of broker ``broker_id``'s log dir that belong to ``topic`` (kept, set aside or
    being deleted)."""
    prefix = topic[:200]
    return sorted(p.name for p in cluster.broker(broker_id).data_dir.iterdir() if p.name.startswith(prefix))


def broker_side_errors(cluster: Cluster, broker_id: int) -> int:
    """How often broker ``broker_id`` failed to take in a znode: a watch callback that raised
    (asyncio's "Exception in callback") or a topic's state it could not apply. (The controller's
    own handling of unreadable znodes is tested with the controller.)"""
    text = cluster.broker(broker_id).log_path.read_text(errors="replace")
    return text.count("Exception in callback") + text.count("applying a topic's state failed")


def test_a_topic_znode_without_topic_id_deletes_no_replica(cluster: Cluster) -> None:
    topic = "kafka2-format"
    cluster.create_topic(topic, partitions=2, replication_factor=3)
    produce(cluster, topic, 2)
    cluster.wait_for_identical_replicas(topic, range(2))
    original, _ = cluster.zk.get(znodes.topic_path(topic))
    assignment = json.loads(original)["partitions"]
    # What Kafka 2.x's kafka-topics --zookeeper writes: no topic_id.
    cluster.zk.set(znodes.topic_path(topic), json.dumps({"version": 2, "partitions": assignment}).encode())
    time.sleep(3)  # every broker's watch has fired by now
    for n in cluster.broker_ids:
        assert logs_on_disk(cluster, n, topic) == [f"{topic}-0", f"{topic}-1"], cluster.broker(n).log_tail()
    # A broker restarted meanwhile starts, and keeps its logs (neither deleted nor moved aside).
    cluster.restart(3)
    cluster.wait_for_registered([3])
    assert logs_on_disk(cluster, 3, topic) == [f"{topic}-0", f"{topic}-1"], cluster.broker(3).log_tail()
    # The topic with its id again (put back by hand, or by the controller): everything is there.
    cluster.zk.set(znodes.topic_path(topic), original)
    cluster.wait_for_full_isr(topic, range(2))
    assert sorted(consume_all(cluster, topic, 2)) == sorted(f"{topic}-{i}".encode() for i in range(RECORDS))
    cluster.wait_for_identical_replicas(topic, range(2))
    assert all(len(cluster.replica_log(n, topic, 0) or {}) == RECORDS // 2 for n in cluster.broker_ids)


def test_an_invalid_topic_config_stops_no_broker(cluster: Cluster) -> None:
    topic = "typo-config"
    cluster.create_topic(topic, partitions=1, replication_factor=3, configs={"retention.ms": "3600000"})
    produce(cluster, topic, 1)
    before = {n: broker_side_errors(cluster, n) for n in cluster.broker_ids}
    path = znodes.topic_config_path(topic)
    cluster.zk.set(path, json.dumps({"version": 1, "config": {"min.insync.replicas": "x"}}).encode())
    cluster.zk.create(
        f"{znodes.CONFIG_CHANGES}/{znodes.CONFIG_CHANGE_PREFIX}",
        znodes.encode_config_change("topics", topic),
        sequence=True,
    )
    cluster.zk.set(path, b"{not json")
    # A broker restarted with the invalid config in ZooKeeper starts (on the old code it exited).
    cluster.restart(2)
    cluster.wait_for_registered([2])
    cluster.wait_for_full_isr(topic, [0])
    produce(cluster, topic, 1)
    assert len(consume_all(cluster, topic, 1, 2 * RECORDS, via=2)) == 2 * RECORDS
    # No broker failed on it; each still applies the last valid config.
    assert {n: broker_side_errors(cluster, n) for n in cluster.broker_ids} == before
    admin = AdminClient({"bootstrap.servers": cluster.address(1)})
    (described,) = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)]).values()
    assert described.result(30)["retention.ms"].value == "3600000"
    cluster.zk.set(path, znodes.EntityConfigZNode({"retention.ms": "7200000"}).encode())


def test_deleting_a_topic_with_a_249_character_name(cluster: Cluster) -> None:
    topic = "long-" + "x" * 244  # the longest legal name
    assert len(topic) == 249
    cluster.create_topic(topic, partitions=2, replication_factor=3)
    produce(cluster, topic, 2)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.delete_topics([topic], operation_timeout=30)[topic].result(60)
    cluster.wait_for(
        lambda: all((topic, 0) not in cluster.metadata(via=n).partitions for n in cluster.broker_ids),
        "every broker sees the topic deleted",
        timeout=30,
    )
    cluster.wait_for(
        lambda: all(logs_on_disk(cluster, n, topic) == [] for n in cluster.broker_ids),
        "every replica's files removed",
        timeout=30,
    )
    # Every broker's log dir is online: an RF 3 topic is created and written on all three.
    cluster.create_topic("after-long", partitions=3, replication_factor=3)
    produce(cluster, "after-long", 3)
    # And each restarts.
    for n in cluster.broker_ids:
        cluster.restart(n)
        cluster.wait_for_registered([n])
    cluster.wait_for_full_isr("after-long", range(3))
    assert len(consume_all(cluster, "after-long", 3)) == RECORDS
