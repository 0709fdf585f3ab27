"""Issue 17 item 6 on a single broker: a topic with the longest legal name (249 characters) is
created, written, deleted and created again while the broker keeps serving every other topic,
and the broker restarts afterwards (the deletion's rename once took the log dir offline)."""

from __future__ import annotations

from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from brokerproc import BrokerProcess

LONG = "x" * 240 + "-249-char"  # 249 characters: Kafka's longest legal topic name
RECORDS = 50


def produce(bootstrap: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    failures: list[object] = []
    for i in range(RECORDS):
        producer.produce(
            topic, value=b"%d" % i, partition=i % 2, on_delivery=lambda e, _m: e and failures.append(e)
        )
    assert producer.flush(30) == 0 and failures == []


def count(bootstrap: str, topic: str, expected: int) -> int:
    """The records of ``topic`` read from the start (stops at ``expected``, or after 30 s)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"count-{topic[:20]}", "enable.auto.commit": False}
    )
    consumer.assign([KafkaTopicPartition(topic, p, 0) for p in range(2)])
    got = 0
    try:
        for _ in range(60):
            got += len(consumer.consume(expected, timeout=0.5))
            if got >= expected:
                break
    finally:
        consumer.close()
    return got


def test_a_249_character_topic_is_deleted_and_the_broker_keeps_serving(running_broker: BrokerProcess) -> None:
    bootstrap = running_broker.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    assert len(LONG) == 249
    for topic in (LONG, "bystander"):
        admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(30)
        produce(bootstrap, topic)
    admin.delete_topics([LONG], operation_timeout=30)[LONG].result(30)
    assert LONG not in admin.list_topics(timeout=10).topics
    assert not [p for p in running_broker.data_dir.iterdir() if p.name.startswith(LONG[:200])]
    # The log dir is online: the other topic is served and written, the long one created again.
    produce(bootstrap, "bystander")
    assert count(bootstrap, "bystander", 2 * RECORDS) == 2 * RECORDS
    admin.create_topics([NewTopic(LONG, num_partitions=2, replication_factor=1)])[LONG].result(30)
    produce(bootstrap, LONG)
    running_broker.restart()
    assert count(bootstrap, LONG, RECORDS) == RECORDS
    assert count(bootstrap, "bystander", 2 * RECORDS) == 2 * RECORDS
