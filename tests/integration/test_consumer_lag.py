"""Consumer lag on the broker's /metrics: committed offset, lag in records and seconds, the
Burrow-style group status as a group's consumers run, pause and leave, and a pipeline stage's
progress from its commits' metadata. A real broker with ``metrics.listener`` set, real clients
(confluent-kafka, Strom's admin), scraped over HTTP."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Iterator
from typing import cast

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from pyspark.sql import SparkSession

from brokerproc import HOST, BrokerProcess, free_port
from metrics_scrape import STATUSES, Metrics
from strom.broker.broker import Broker
from strom.broker.metrics.lag import RemoteHighWatermarks
from strom.broker.partition import TopicPartition as BrokerTopicPartition
from strom.client import AdminClient, NewTopic, OffsetAndMetadata, TopicPartition
from strom.protocol.pipeline_progress import PipelineProgress
from strom.spark.committer import OffsetCommitter, _StromSource
from strom.spark.options import parse_source_options

METRICS_PORT = free_port()
BROKER_CONFIG = {
    "metrics.listener": f"http://{HOST}:{METRICS_PORT}",
    "metrics.lag.sample.interval.ms": "200",
    "metrics.lag.window.samples": "4",
    "group.initial.rebalance.delay.ms": "0",
    "offset.metadata.max.bytes": "512",
}
DEADLINE = 30.0  # seconds a poll waits for a sample to show what the test did
# A new lag sample comes every 200 ms.
METRICS = Metrics(f"http://{HOST}:{METRICS_PORT}/metrics", deadline=DEADLINE)


def lag_labels(group: str, topic: str, partition: int = 0) -> dict[str, str | int]:
    return {"group": group, "topic": topic, "partition": partition, "pipeline": "", "stage": ""}


@pytest.fixture(scope="module")
def admin(broker: BrokerProcess) -> Iterator[AdminClient]:
    with AdminClient({"bootstrap.servers": broker.bootstrap}) as client:
        yield client


def create_topic(admin: AdminClient, name: str, partitions: int = 1) -> None:
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])


def produce(
    bootstrap: str, topic: str, count: int, *, start: int = 0, timestamps: list[int] | None = None
) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(count):
        kwargs = {"timestamp": timestamps[i]} if timestamps is not None else {}
        producer.produce(topic, f"{topic}-{start + i}".encode(), partition=0, **kwargs)
    assert producer.flush(30) == 0


def standalone_commit(bootstrap: str, group: str, topic: str, offset: int) -> None:
    """A commit from outside the group (no membership), as an admin or an assign() consumer makes."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[KafkaTopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        consumer.close()


def test_lag_in_records_and_seconds_and_a_stopped_group(broker: BrokerProcess, admin: AdminClient) -> None:
    topic, group = "lag-standalone", "lag-standalone-group"
    create_topic(admin, topic)
    total, committed = 50, 20
    now_ms = time.time_ns() // 1_000_000
    # Record i was created (100 - i) s ago; record 20 starts its own batch, so its batch header's
    # first timestamp is exactly its own.
    timestamps = [now_ms - (100 - i) * 1000 for i in range(total)]
    produce(broker.bootstrap, topic, committed, timestamps=timestamps[:committed])
    produce(broker.bootstrap, topic, total - committed, start=committed, timestamps=timestamps[committed:])
    committed_at = time.time()
    standalone_commit(broker.bootstrap, group, topic, committed)

    labels = lag_labels(group, topic)
    current = METRICS.until(
        lambda s: s.get("kafka_consumergroup_group_lag", **labels) == total - committed, "lag == N - k"
    )
    scraped_at = time.time()
    assert current.get("kafka_consumergroup_group_offset", **labels) == committed
    assert current.get("kafka_partition_latest_offset", topic=topic, partition=0) == total
    assert (
        current.get("kafka_consumergroup_group_max_lag", group=group, pipeline="", stage="")
        == total - committed
    )
    assert (
        current.get("kafka_consumergroup_group_sum_lag", group=group, pipeline="", stage="")
        == total - committed
    )
    # The age of record 20 (80 s when produced), as of some sample between the commit and the scrape.
    age = current.get("kafka_consumergroup_group_lag_seconds", **labels)
    record_ms = timestamps[committed]
    assert age is not None
    assert committed_at - record_ms / 1000 - 1 <= age <= scraped_at - record_ms / 1000 + 1
    assert current.get("kafka_consumergroup_group_max_lag_seconds", group=group, pipeline="", stage="") == age

    # No members, no commits for longer than the window (4 samples, 0.6 s), lag above 0.
    METRICS.until(
        lambda s: s.status(group) == "STOPPED", "a group without members or commits, lagging, is STOPPED"
    )

    # Caught up: the lag and its age are 0, the status OK at once.
    standalone_commit(broker.bootstrap, group, topic, total)
    current = METRICS.until(
        lambda s: s.get("kafka_consumergroup_group_lag", **labels) == 0, "lag 0 after committing the end"
    )
    assert current.get("kafka_consumergroup_group_lag_seconds", **labels) == 0
    assert current.status(group) == "OK"

    # A committed offset beyond the log end is an error.
    standalone_commit(broker.bootstrap, group, topic, total + 10)
    METRICS.until(lambda s: s.status(group) == "ERROR", "an offset beyond the log end is ERROR")


def test_a_group_runs_stalls_resumes_and_stops(broker: BrokerProcess, admin: AdminClient) -> None:
    topic, group = "lag-members", "lag-members-group"
    create_topic(admin, topic)
    produce(broker.bootstrap, topic, 100)
    labels = lag_labels(group, topic)
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 10000,
        }
    )
    consumed = 0
    try:
        consumer.subscribe([topic])

        def consume(until_offset: int) -> None:
            nonlocal consumed
            deadline = time.monotonic() + DEADLINE
            while consumed < until_offset:
                assert time.monotonic() < deadline, f"consumed {consumed} of {until_offset}"
                for message in consumer.consume(100, timeout=0.5):
                    assert message.error() is None
                    consumed = message.offset() + 1

        # The lag goes to zero as the consumer runs: half-way first, then all of it.
        consume(100)
        consumer.commit(offsets=[KafkaTopicPartition(topic, 0, 50)], asynchronous=False)
        current = METRICS.until(
            lambda s: s.get("kafka_consumergroup_group_lag", **labels) == 50, "lag 50 half-way"
        )
        assert current.get("kafka_consumergroup_group_offset", **labels) == 50
        consumer.commit(asynchronous=False)
        current = METRICS.until(
            lambda s: s.get("kafka_consumergroup_group_lag", **labels) == 0, "lag 0 once consumed"
        )
        assert current.get("kafka_consumergroup_group_offset", **labels) == 100
        assert current.status(group) == "OK"

        # A member that stops consuming while records arrive: its offset stands still with lag.
        consumer.pause(consumer.assignment())
        produce(broker.bootstrap, topic, 30, start=100)
        current = METRICS.until(
            lambda s: s.status(group) == "STALLED", "a member making no progress is STALLED"
        )
        assert current.get("kafka_consumergroup_group_lag", **labels) == 30

        # It resumes: caught up, OK.
        consumer.resume(consumer.assignment())
        consume(130)
        consumer.commit(asynchronous=False)
        METRICS.until(
            lambda s: s.status(group) == "OK" and s.get("kafka_consumergroup_group_lag", **labels) == 0,
            "OK again",
        )
    finally:
        consumer.close()  # leaves the group: no members

    # Records arrive after the group left: STOPPED once its last commit is older than the window.
    produce(broker.bootstrap, topic, 10, start=130)
    current = METRICS.until(lambda s: s.status(group) == "STOPPED", "a group that left, lagging, is STOPPED")
    assert current.get("kafka_consumergroup_group_lag", **labels) == 10


def test_a_pipeline_stage_group_is_labelled_and_carries_its_progress(
    broker: BrokerProcess, admin: AdminClient
) -> None:
    source, sink = "lag-clicks", "lag-sessions"
    create_topic(admin, source)
    produce(broker.bootstrap, source, 40)
    progress = PipelineProgress(
        pipeline="clickstream",
        stage="sessionize",
        batch_id=3,
        rows=25,
        input_rows_per_second=50.0,
        processed_rows_per_second=125.0,
        batch_duration_ms=200,
        batch_end_ms=1_790_000_000_500,
        sources=(source,),
        sinks=(sink,),
    )
    # A stage whose group is not named after it (kafka.group.id): the metadata names it.
    group = "sessionizer"
    admin.alter_consumer_group_offsets(
        group, {TopicPartition(source, 0): OffsetAndMetadata(25, progress.to_metadata())}
    )
    # A stage found by its group's name alone (metadata of another client).
    named = "strom-spark-clickstream.count"
    admin.alter_consumer_group_offsets(named, {TopicPartition(source, 0): OffsetAndMetadata(40, "not ours")})

    stage = {"pipeline": "clickstream", "stage": "sessionize"}
    current = METRICS.until(
        lambda s: (
            s.get("kafka_consumergroup_group_lag", group=group, topic=source, partition=0, **stage) == 15
            and s.get(
                "kafka_consumergroup_group_lag",
                group=named,
                topic=source,
                partition=0,
                pipeline="clickstream",
                stage="count",
            )
            == 0
        ),
        "both stage groups sampled, labelled",
    )
    assert current.get("strom_pipeline_stage_rows_per_second", **stage) == 125.0
    assert current.get("strom_pipeline_stage_input_rows_per_second", **stage) == 50.0
    assert current.get("strom_pipeline_stage_batch_rows", **stage) == 25
    assert current.get("strom_pipeline_stage_batch_duration_seconds", **stage) == 0.2
    assert current.get("strom_pipeline_stage_last_batch_timestamp_seconds", **stage) == 1_790_000_000.5
    assert current.status(group, **stage) in STATUSES
    # No progress in its metadata: labelled, but no stage metrics.
    assert current.get("strom_pipeline_stage_rows_per_second", pipeline="clickstream", stage="count") is None
    # What the console reads: the progress through OffsetFetch.
    fetched = admin.list_consumer_group_offsets(group)
    assert PipelineProgress.from_metadata(fetched[TopicPartition(source, 0)].metadata) == progress


class _Directory:
    """What RemoteHighWatermarks uses of a broker: its id and where the leaders listen."""

    def __init__(self, endpoint: tuple[str, int]) -> None:
        self.node_id = 1
        self.replica_manager = self
        self._endpoint = endpoint

    def peer_endpoint(self, broker_id: int) -> tuple[str, int] | None:
        return self._endpoint if broker_id == 0 else None


def test_high_watermarks_of_partitions_led_elsewhere_come_from_their_leader(
    broker: BrokerProcess, admin: AdminClient
) -> None:
    """The path a cluster member takes for partitions it has no replica of, against a real leader."""
    topic = "lag-remote"
    create_topic(admin, topic, partitions=2)
    produce(broker.bootstrap, topic, 12)
    remote = RemoteHighWatermarks(cast(Broker, _Directory((broker.host, broker.port))))
    p0, p1 = BrokerTopicPartition(topic, 0), BrokerTopicPartition(topic, 1)

    async def ask() -> tuple[dict[BrokerTopicPartition, int], dict[BrokerTopicPartition, int]]:
        try:
            first = await remote.fetch({0: [p0, p1], 7: [p1]})
            again = await remote.fetch({0: [p0]})  # over the kept connection
            return first, again
        finally:
            remote.close()

    first, again = asyncio.run(ask())
    # Broker 7 is not registered: its partitions have no answer; broker 0's are its HWs.
    assert first == {p0: 12, p1: 0}
    assert again == {p0: 12}


def test_the_committer_drops_its_progress_when_the_broker_refuses_the_metadata(
    broker: BrokerProcess, admin: AdminClient
) -> None:
    """A Spark stage's commit path without Spark: progress within offset.metadata.max.bytes (512
    here) goes with the offsets; progress beyond it is dropped and the offsets still committed."""
    topic = "lag-committer"
    create_topic(admin, topic)
    produce(broker.bootstrap, topic, 5)
    committer = OffsetCommitter(cast(SparkSession, None))  # only its commit path runs here
    options = parse_source_options(
        {"kafka.bootstrap.servers": broker.bootstrap, "subscribe": topic}, streaming=True
    )
    end = json.dumps({topic: {"0": 5}})
    progress = PipelineProgress(
        "orders", "enrich", 4, 5, 1.5, 2.5, 30, 1_790_000_000_000, sinks=("enriched",)
    )
    wide = dataclasses.replace(progress, sinks=tuple(f"{i}-" + "x" * 200 for i in range(4)))
    assert 512 < len(wide.to_metadata()) <= 4096
    try:
        committer._commit("orders.enrich", _StromSource(options, "committer-fits"), end, progress)
        committer._commit("orders.enrich", _StromSource(options, "committer-too-wide"), end, wide)
    finally:
        for client in committer._admins.values():
            client.close()
    fits = admin.list_consumer_group_offsets("committer-fits")[TopicPartition(topic, 0)]
    assert fits.offset == 5
    assert PipelineProgress.from_metadata(fits.metadata) == dataclasses.replace(progress, sources=(topic,))
    too_wide = admin.list_consumer_group_offsets("committer-too-wide")[TopicPartition(topic, 0)]
    assert (too_wide.offset, too_wide.metadata) == (5, "")
