"""Streaming reads across leader failovers, on a real cluster (tests/cluster_harness.py) and Spark in local mode.

Three brokers, a topic of three partitions with replication factor 3 and min.insync.replicas 2,
and an idempotent acks=all producer writing numbered records all along. While a streaming query
reads the topic, partition leaders are SIGKILLed and later restarted: the sink ends up holding
every acknowledged record exactly once, each partition's offsets contiguous from 0, and the query
never fails (local mode retries no task: one failed read would end it). A query stopped during an
outage and started again from its checkpoint once the leader has moved is exactly once too.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from cluster_harness import RECOVERY_TIMEOUT, Cluster
from spark.spark_util import (
    BackgroundProducer,
    assert_exactly_once,
    assert_rows_are_self_consistent,
    read_stream,
    wait_until,
)
from strom.cli.local_cluster import java_available
from strom.client import RecordMetadata, TopicPartition
from strom.spark.offset_reader import OffsetReader
from strom.spark.options import parse_source_options

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(not java_available(), reason="ZooKeeper needs java and Debian's zookeeper package"),
]

PARTITIONS = 3
TRIGGER = "200 milliseconds"
COLUMNS = ("key", "value", "topic", "partition", "offset")
# An idempotent acks=all producer that notices a dead leader within seconds and never gives up
# on a record within the test's time: every record it sends is acknowledged.
PRODUCER = {
    "acks": "all",
    "enable.idempotence": True,
    "retry.backoff.ms": 50,
    "retry.backoff.max.ms": 500,
    "reconnect.backoff.max.ms": 500,
    "request.timeout.ms": 5_000,
    "delivery.timeout.ms": 60_000,
}
RATE = 100  # records per second, spread over the partitions
# Records the producer and the query must get through on a new leader before the old one returns.
AFTER_FAILOVER = 100


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("cluster"), brokers=3) as cluster:
        cluster.wait_for_registered()
        cluster.wait_for_controller()
        yield cluster


@pytest.fixture()
def healthy(cluster: Cluster) -> Cluster:
    """Every broker running (a failed test may have left one down), a controller elected."""
    cluster.ensure_all_running()
    cluster.wait_for_registered()
    cluster.wait_for_controller()
    return cluster


def create(cluster: Cluster, topic: str) -> None:
    cluster.create_topic(topic, partitions=PARTITIONS, replication_factor=3)
    cluster.wait_for_full_isr(topic, range(PARTITIONS))


def source(spark: SparkSession, cluster: Cluster, topic: str) -> DataFrame:
    return read_stream(spark, cluster.bootstrap, subscribe=topic, startingOffsets="earliest").load()


def running(query: StreamingQuery) -> None:
    """Fail at once, with the query's error, if it has stopped."""
    error = query.exception()
    assert error is None and query.isActive, f"the query failed: {error}"


def fail_over(
    cluster: Cluster, topic: str, partition: int, acked: Callable[[], int], read: Callable[[], int]
) -> None:
    """SIGKILL the partition's leader; once another broker leads it, the producer and the query
    go on through the new leader while the old one is down; then the old leader comes back and
    catches up."""
    before = cluster.wait_for_leader(topic, partition)
    cluster.kill(before.leader)
    cluster.wait_for_leader(
        topic, partition, exclude={before.leader}, min_epoch=before.leader_epoch + 1, timeout=RECOVERY_TIMEOUT
    )
    target = acked() + AFTER_FAILOVER
    wait_until(lambda: acked() >= target, "records acknowledged by the new leader", timeout=RECOVERY_TIMEOUT)
    wait_until(lambda: read() >= target, "the query to read past the failover", timeout=60, interval=0.5)
    cluster.start_broker(before.leader)
    cluster.wait_for_full_isr(topic, range(PARTITIONS))


def assert_contiguous(rows: Sequence[Row]) -> None:
    """Each partition's offsets run from 0 without a gap (no transactions, no compaction here)."""
    by_partition: dict[int, list[int]] = defaultdict(list)
    for row in rows:
        by_partition[row["partition"]].append(row["offset"])
    assert sorted(by_partition) == list(range(PARTITIONS))
    for partition, offsets in by_partition.items():
        assert sorted(offsets) == list(range(len(offsets))), f"partition {partition}: offsets not contiguous"


def assert_read_exactly_once(rows: Sequence[Row], acked: Sequence[RecordMetadata]) -> None:
    assert_exactly_once(rows, acked)
    assert_contiguous(rows)
    assert_rows_are_self_consistent(rows)


def test_exactly_once_while_partition_leaders_are_killed(
    healthy: Cluster, spark: SparkSession, tmp_path: Path
) -> None:
    cluster, topic, name = healthy, "spark-failover", "spark_failover"
    create(cluster, topic)

    def read() -> int:
        running(query)
        return spark.table(name).count()

    with BackgroundProducer(cluster.bootstrap, [topic], per_second=RATE, config=PRODUCER) as producer:
        wait_until(lambda: len(producer.acked()) >= 100, "the producer to get going", timeout=30)
        query = (
            source(spark, cluster, topic)
            .select(*COLUMNS)
            .writeStream.format("memory")
            .queryName(name)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(processingTime=TRIGGER)
            .start()
        )
        try:
            wait_until(lambda: read() >= 100, "the query to read", timeout=60, interval=0.5)
            # Partition 0's leader, then (once it is back) partition 1's, whoever that is then.
            for partition in (0, 1):
                fail_over(cluster, topic, partition, lambda: len(producer.acked()), read)
            acked = producer.stop()
            wait_until(
                lambda: read() >= len(acked), "the query to read every acknowledged record", interval=0.5
            )
            running(query)
        finally:
            query.stop()
    assert query.exception() is None
    assert_read_exactly_once(spark.table(name).collect(), acked)


def test_a_query_stopped_during_an_outage_restarts_exactly_once(
    healthy: Cluster, spark: SparkSession, tmp_path: Path
) -> None:
    """Stopped while partition 0 has no leader, started again from its checkpoint once another
    broker leads it: the file sink holds every record once."""
    cluster, topic, name = healthy, "spark-failover-restart", "spark_failover_restart"
    create(cluster, topic)
    output = tmp_path / "output"
    schema = source(spark, cluster, topic).select(*COLUMNS).schema

    def start() -> StreamingQuery:
        return (
            source(spark, cluster, topic)
            .select(*COLUMNS)
            .writeStream.format("parquet")
            .queryName(name)
            .option("path", str(output))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(processingTime=TRIGGER)
            .start()
        )

    def written() -> int:
        # Through the sink's metadata log: only what committed batches wrote (maybe nothing yet).
        return spark.read.schema(schema).parquet(str(output)).count() if output.exists() else 0

    with BackgroundProducer(cluster.bootstrap, [topic], per_second=RATE, config=PRODUCER) as producer:
        wait_until(lambda: len(producer.acked()) >= 100, "the producer to get going", timeout=30)
        first = start()
        try:
            wait_until(lambda: (running(first), written())[1] >= 100, "the first run to write", interval=0.5)
            before = cluster.wait_for_leader(topic, 0)
            cluster.kill(before.leader)
        finally:
            first.stop()  # during the outage: partition 0 may have no leader yet
        assert first.exception() is None
        cluster.wait_for_leader(topic, 0, exclude={before.leader}, min_epoch=before.leader_epoch + 1)

        second = start()
        try:
            target = len(producer.acked()) + AFTER_FAILOVER
            wait_until(lambda: len(producer.acked()) >= target, "records acknowledged by the new leader")
            wait_until(
                lambda: (running(second), written())[1] >= target, "the restarted query to read", interval=0.5
            )
            cluster.start_broker(before.leader)
            acked = producer.stop()
            wait_until(
                lambda: (running(second), written())[1] >= len(acked),
                "the restarted query to read every acknowledged record",
                interval=0.5,
            )
        finally:
            second.stop()
    assert second.exception() is None
    assert_read_exactly_once(spark.read.parquet(str(output)).collect(), acked)


def test_end_offsets_never_go_back_across_a_failover(healthy: Cluster) -> None:
    """The driver plans each micro-batch up to the end offsets it lists (OffsetReader.latest), and
    an end below a batch's start is data loss to the source. A new leader's high watermark is the
    one it had as a follower, which may be below the old leader's: here a follower is down first,
    so the new leader is alone in its ISR and its HW stays there until a broker returns. Its
    ListOffsets must not answer with that HW (Kafka answers OFFSET_NOT_AVAILABLE, and clients retry)."""
    cluster, topic = healthy, "spark-failover-ends"
    create(cluster, topic)
    options = {
        "kafka.bootstrap.servers": cluster.bootstrap,
        "subscribe": topic,
        # Ask again at once: the driver must not miss the new leader's first answers.
        "kafka.retry.backoff.ms": "5",
        "kafka.retry.backoff.max.ms": "20",
        "kafka.reconnect.backoff.ms": "5",
        "kafka.reconnect.backoff.max.ms": "20",
    }
    reader = OffsetReader(parse_source_options(options, streaming=True))
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    seen: list[dict[TopicPartition, int]] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def poll() -> None:
        try:
            while not stop.is_set():
                seen.append(reader.latest(tps))
        except BaseException as exc:  # reported below
            errors.append(exc)

    try:
        with BackgroundProducer(cluster.bootstrap, [topic], per_second=300, config=PRODUCER) as producer:
            wait_until(lambda: len(producer.acked()) >= 100, "the producer to get going", timeout=30)
            thread = threading.Thread(target=poll)
            thread.start()
            try:
                before = cluster.wait_for_leader(topic, 0)
                follower = next(b for b in cluster.broker_ids if b != before.leader)
                cluster.kill(follower)
                cluster.wait_for_isr(topic, 0, 2)
                time.sleep(0.5)  # the end offsets move on with an ISR of two
                cluster.kill(before.leader)
                cluster.wait_for_leader(topic, 0, exclude={before.leader}, min_epoch=before.leader_epoch + 1)
                time.sleep(1)  # the driver asks the new leader, alone in its ISR
                listed = len(seen)
                cluster.start_broker(follower)
                cluster.start_broker(before.leader)
                cluster.wait_for_full_isr(topic, range(PARTITIONS))
                wait_until(
                    lambda: len(seen) > listed + 10,
                    "end offsets listed once the brokers are back",
                    timeout=30,
                )
            finally:
                stop.set()
                thread.join(60)
            acked = producer.stop()
        assert not errors, errors
        for earlier, later in itertools.pairwise(seen):
            for tp in tps:
                assert later[tp] >= earlier[tp], f"{tp}: end offset {earlier[tp]} then {later[tp]}"
        # In the end they reach every acknowledged record.
        last = reader.latest(tps)
        for tp in tps:
            assert last[tp] == 1 + max(m.offset for m in acked if m.partition == tp.partition)
    finally:
        reader.close()
