"""Helpers for the Spark tests: topics, producers whose records say who they are, and checks.

Every record a helper produces has key ``<topic>/<seq>`` and value ``<topic>/<seq>/v``, so a
row read back through Spark can be checked against what it claims to be, and every produced
record's position comes from the producer's acknowledgement (RecordMetadata), so "every
record that exists" means exactly the acknowledged ones.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrameReader, Row, SparkSession
from pyspark.sql.streaming.readwriter import DataStreamReader

from strom.client import (
    AdminClient,
    Consumer,
    NewTopic,
    OffsetSpec,
    Producer,
    RecordMetadata,
    TopicPartition,
)
from strom.spark.offsets import StreamOffset

Position = tuple[str, int, int]  # topic, partition, offset


def create_topic(
    bootstrap: str, name: str, partitions: int, configs: Mapping[str, str] | None = None
) -> None:
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1, configs=dict(configs or {}))]
        )


def key_of(topic: str, seq: int) -> bytes:
    return f"{topic}/{seq}".encode()


def value_of(topic: str, seq: int) -> bytes:
    return f"{topic}/{seq}/v".encode()


def produce(
    bootstrap: str,
    topic: str,
    count: int,
    *,
    start: int = 0,
    partition: int | None = None,
    timestamp: int | None = None,
    headers: Sequence[tuple[str, bytes | None]] | None = None,
) -> list[RecordMetadata]:
    """``count`` records numbered from ``start``, acknowledged; their metadata in send order."""
    with Producer({"bootstrap.servers": bootstrap, "linger.ms": 2}) as producer:
        futures = [
            producer.send(
                topic,
                value_of(topic, seq),
                key_of(topic, seq),
                partition=partition if partition is not None else seq % len(producer.partitions_for(topic)),
                timestamp=timestamp,
                headers=headers,
            )
            for seq in range(start, start + count)
        ]
        producer.flush(30)
        return [future.get(30) for future in futures]


class BackgroundProducer:
    """Produces to topics (all their partitions, round robin) from a thread until stopped,
    keeping every acknowledged record's metadata; ``config`` adds to the producer's config."""

    def __init__(
        self,
        bootstrap: str,
        topics: Sequence[str],
        *,
        per_second: float = 200.0,
        config: Mapping[str, object] | None = None,
    ) -> None:
        self._bootstrap = bootstrap
        self._config = dict(config or {})
        self._topics = list(topics)
        self._interval = 1.0 / per_second
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._acked: list[RecordMetadata] = []
        self._errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, name="background-producer", daemon=True)

    def __enter__(self) -> BackgroundProducer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _on_delivery(self, metadata: RecordMetadata | None, error: BaseException | None) -> None:
        with self._lock:
            if error is not None:
                self._errors.append(error)
            elif metadata is not None:
                self._acked.append(metadata)

    def _run(self) -> None:
        with Producer({"bootstrap.servers": self._bootstrap, "linger.ms": 2, **self._config}) as producer:
            counts = {topic: len(producer.partitions_for(topic)) for topic in self._topics}
            seq = 0
            while not self._stopping.is_set():
                for topic in self._topics:
                    producer.send(
                        topic,
                        value_of(topic, seq),
                        key_of(topic, seq),
                        partition=seq % counts[topic],
                        callback=self._on_delivery,
                    )
                seq += 1
                time.sleep(self._interval)
            producer.flush(30)

    def acked(self) -> list[RecordMetadata]:
        with self._lock:
            return list(self._acked)

    def stop(self) -> list[RecordMetadata]:
        """Stop, wait for every send to complete, and return the acknowledged records."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(60)
        assert not self._thread.is_alive(), "the background producer did not stop"
        with self._lock:
            assert not self._errors, f"sends failed: {self._errors[:3]}"
        return self.acked()


def positions(metadata: Iterable[RecordMetadata]) -> list[Position]:
    return sorted((m.topic, m.partition, m.offset) for m in metadata)


def row_positions(rows: Iterable[Row]) -> list[Position]:
    return sorted((r["topic"], r["partition"], r["offset"]) for r in rows)


def duplicates(items: Iterable[Any]) -> list[Any]:
    return sorted(item for item, n in Counter(items).items() if n > 1)


def assert_rows_are_self_consistent(rows: Iterable[Row]) -> None:
    """Each row's key and value are the ones produced for its topic (see the module doc)."""
    for row in rows:
        key = bytes(row["key"]).decode()
        topic, _, seq = key.partition("/")
        assert topic == row["topic"], row
        assert bytes(row["value"]) == value_of(topic, int(seq)), row


def assert_exactly_once(rows: Sequence[Row], acked: Iterable[RecordMetadata]) -> None:
    """The rows are the acknowledged records, each once: none missing, none extra, none twice."""
    got = row_positions(rows)
    expected = positions(acked)
    assert not duplicates(got), f"records read more than once: {duplicates(got)[:10]}"
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    assert not missing, f"{len(missing)} acknowledged records never read, e.g. {missing[:10]}"
    assert not extra, f"{len(extra)} rows that were never acknowledged, e.g. {extra[:10]}"
    assert got == expected


def end_offsets(bootstrap: str, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        found = admin.list_offsets(dict.fromkeys(partitions, OffsetSpec.latest()))
    return {tp: result.offset for tp, result in found.items()}


def earliest_offsets(bootstrap: str, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        found = admin.list_offsets(dict.fromkeys(partitions, OffsetSpec.earliest()))
    return {tp: result.offset for tp, result in found.items()}


def topic_partitions(topic: str, count: int) -> list[TopicPartition]:
    return [TopicPartition(topic, p) for p in range(count)]


def group_offsets(bootstrap: str, group_id: str) -> dict[TopicPartition, int]:
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        return {tp: o.offset for tp, o in admin.list_consumer_group_offsets(group_id).items()}


def consume_all(bootstrap: str, partitions: Sequence[TopicPartition], timeout: float = 30.0) -> list[Any]:
    """Every record of ``partitions`` from the start to the end offsets of now, through Strom's consumer."""
    ends = end_offsets(bootstrap, partitions)
    records: list[Any] = []
    with Consumer({"bootstrap.servers": bootstrap, "enable.auto.commit": "false"}) as consumer:
        consumer.assign(list(partitions))
        consumer.seek_to_beginning(list(partitions))
        deadline = time.monotonic() + timeout
        while any(consumer.position(tp) < end for tp, end in ends.items()):
            assert time.monotonic() < deadline, "timed out reading the topic back"
            records.extend(consumer.poll(0.5))
    return records


def read_topic(bootstrap: str, topic: str, timeout: float = 30.0) -> list[Any]:
    """Every record of every partition of ``topic``, up to the end offsets of now."""
    with Consumer({"bootstrap.servers": bootstrap}) as consumer:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for(topic)]
    return consume_all(bootstrap, partitions, timeout)


def wait_until(
    condition: Callable[[], bool], what: str, timeout: float = 60.0, interval: float = 0.2
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def read_stream(spark: SparkSession, bootstrap: str, **options: str) -> DataStreamReader:
    reader = spark.readStream.format("strom").option("kafka.bootstrap.servers", bootstrap)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader


def read_batch(spark: SparkSession, bootstrap: str, **options: str) -> DataFrameReader:
    reader = spark.read.format("strom").option("kafka.bootstrap.servers", bootstrap)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader


def offsets_json(offsets: Mapping[TopicPartition, int]) -> str:
    """Spark's per-partition offsets option: ``{"topic": {"0": 12}}``."""
    out: dict[str, dict[str, int]] = {}
    for tp, offset in offsets.items():
        out.setdefault(tp.topic, {})[str(tp.partition)] = offset
    return json.dumps(out)


def checkpoint_offsets(checkpoint: Path) -> dict[int, str]:
    """Batch id -> the first source's end offset JSON, as written to ``<checkpoint>/offsets/<id>``
    (a version line, the batch metadata line, then one line per source)."""
    out: dict[int, str] = {}
    for path in (checkpoint / "offsets").iterdir():
        if path.name.isdigit():
            lines = path.read_text().splitlines()
            assert lines[0] == "v1", lines
            out[int(path.name)] = lines[2]
    return out


def parse_offsets(text: str) -> dict[TopicPartition, int]:
    """A checkpointed source offset's positions (without the cluster and topic ids it carries)."""
    return StreamOffset.from_json_dict(text).offsets
