"""Strom's consumer (strom.client.consumer) against a real broker, with records written by
confluent-kafka and kafka-python.

- Interoperability: what those producers write (keys, null keys and values, headers, explicit
  timestamps, every codec) reads back byte for byte, at the offsets the broker stored.
- The consumer API: positions (seek, seek_to_beginning/end, position, watermarks,
  offsets_for_times), pause/resume, max.poll.records, auto.offset.reset, commits (sync, async,
  metadata, resuming after a restart, auto-commit on close), pattern subscriptions that pick up
  new topics, compacted logs with offset gaps and emptied batches, read_committed, the
  max.poll.interval.ms timeout, unsubscribe, and AsyncConsumer.
- The fetch-path decoder (no broker): control batches and aborted transactions are skipped,
  a fetch offset inside a batch, corruption is reported.

Group membership with several processes is in test_consumer_groups.py (the "strom" member kind).
"""

from __future__ import annotations

import asyncio
import struct
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import kafka
import kafka.codec
import pytest
from confluent_kafka.admin import AdminClient

from brokerproc import BrokerProcess
from integration.clients_util import (
    CODECS,
    Client,
    Consumed,
    Message,
    create_topic,
    now_ms,
    poll_until,
    produce,
    produce_confluent,
    read,
    stored_records,
)
from kafka_wire import GroupWire
from strom.client.cluster import TopicPartition
from strom.client.consumer import (
    AsyncConsumer,
    Consumer,
    ConsumerRebalanceListener,
    ConsumerRecord,
    NoOffsetForPartitionError,
    OffsetAndMetadata,
    OffsetAndTimestamp,
    OffsetOutOfRangeError,
)
from strom.client.errors import CommitFailedError, KafkaException
from strom.records.batch import CompressionType, InvalidBatchError
from strom.records.codec import RecordSpec, encode_batch
from strom.records.control import ControlRecordType, build_control_batch
from strom.records.reader import FetchedRecords, scan_batches

BROKER_CONFIG = {"group.initial.rebalance.delay.ms": "0", "log.cleaner.backoff.ms": "200"}
TIMEOUT = 15.0
KAFKA_PYTHON_CODECS = {
    "snappy": kafka.codec.has_snappy,
    "lz4": kafka.codec.has_lz4,
    "zstd": kafka.codec.has_zstd,
}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def new_topic(bootstrap: str, prefix: str, partitions: int = 1, config: dict[str, str] | None = None) -> str:
    name = unique(prefix)
    create_topic(bootstrap, name, partitions, config)
    return name


def write(bootstrap: str, topic: str, values: Sequence[bytes], partition: int = 0, **extra: Any) -> None:
    messages = [Message(None, v, partition=partition, **extra) for v in values]
    for delivery in produce_confluent(bootstrap, topic, messages, {}):
        assert delivery.error_code is None, delivery


def strom_consumer(bootstrap: str, **config: Any) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "auto.offset.reset": "earliest",
            "fetch.max.wait.ms": 100,
            **{key.replace("_", "."): value for key, value in config.items()},
        }
    )


@pytest.fixture
def open_consumers() -> Iterator[list[Consumer]]:
    """Consumers a test opened; closed even when it fails."""
    consumers: list[Consumer] = []
    yield consumers
    for consumer in consumers:
        consumer.close(timeout=5)


def as_consumed(records: Sequence[ConsumerRecord]) -> list[Consumed]:
    return sorted(Consumed(r.partition, r.offset, r.timestamp, r.key, r.value, r.headers) for r in records)


# ---------------------------------------------------------------- interoperability


def mixed_messages(t0: int) -> list[Message]:
    specs: list[tuple[bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]] = [
        (b"key", b"value", ()),
        (None, b"null key", (("h", b"1"),)),
        (b"tombstone", None, ()),
        (b"", b"", (("empty", b""),)),
        (b"\x00\xff binary", bytes(range(256)), (("dup", b"a"), ("dup", b"b"), ("bin", b"\x00\xff"))),
        (b"null header", b"v", (("nothing", None), ("something", b"x"))),
        ("ключ".encode(), "значение 🐢".encode() * 300, (("ünïcode", b"wert"),)),
    ]
    return [Message(k, v, h, timestamp=t0 + 7 * i, partition=0) for i, (k, v, h) in enumerate(specs)]


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("writer", ["confluent", "kafka-python"])
def test_reads_what_other_producers_wrote_byte_for_byte(writer: Client, codec: str, bootstrap: str) -> None:
    if writer == "kafka-python" and codec in KAFKA_PYTHON_CODECS and not KAFKA_PYTHON_CODECS[codec]():
        pytest.skip(f"kafka-python has no {codec} codec installed")
    topic = new_topic(bootstrap, f"interop-{writer}-{codec}")
    messages = mixed_messages(now_ms() - 60_000)
    if writer == "kafka-python":  # its send() refuses null header values
        messages = [
            Message(m.key, m.value, tuple(h for h in m.headers if h[1] is not None), m.timestamp, 0)
            for m in messages
        ]
    # Two rounds: two batches, so the second fetch starts inside the log.
    half = len(messages) // 2
    for part in (messages[:half], messages[half:]):
        deliveries = produce(writer, bootstrap, topic, part, compression=codec)
        assert deliveries is not None and all(d.error_code is None for d in deliveries)
    expected = [Consumed(0, i, m.timestamp or 0, m.key, m.value, m.headers) for i, m in enumerate(messages)]
    assert stored_records(bootstrap, topic) == expected
    with strom_consumer(bootstrap) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        records = read(consumer, len(messages))
        assert as_consumed(records) == expected
        assert all(r.topic == topic and r.timestamp_type == 0 and r.leader_epoch == 0 for r in records)
        assert consumer.position(TopicPartition(topic, 0)) == len(messages)


# ---------------------------------------------------------------- positions and offsets


@pytest.fixture(scope="module")
def timed_topic(bootstrap: str) -> tuple[str, int]:
    """Two partitions of 20 records each; record i of partition p has timestamp t0 + 10 * i."""
    topic = new_topic(bootstrap, "timed", partitions=2)
    t0 = now_ms() - 100_000
    for partition in (0, 1):
        messages = [Message(b"k", b"p%d-%d" % (partition, i), (), t0 + 10 * i, partition) for i in range(20)]
        for delivery in produce_confluent(bootstrap, topic, messages, {}):
            assert delivery.error_code is None, delivery
    return topic, t0


def test_seek_position_and_watermarks(bootstrap: str, timed_topic: tuple[str, int]) -> None:
    topic, t0 = timed_topic
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    with strom_consumer(bootstrap) as consumer:
        assert consumer.partitions_for(topic) == [0, 1]
        assert consumer.list_topics()[topic] == [0, 1]
        consumer.assign([tp0, tp1])
        assert consumer.assignment() == {tp0, tp1}
        assert consumer.position(tp0) == 0
        assert consumer.beginning_offsets([tp0, tp1]) == {tp0: 0, tp1: 0}
        assert consumer.end_offsets([tp0, tp1]) == {tp0: 20, tp1: 20}

        consumer.seek(tp0, 15)
        consumer.seek_to_end([tp1])
        records = read(consumer, 5)
        assert [(r.partition, r.offset) for r in records] == [(0, o) for o in range(15, 20)]
        assert records[0].value == b"p0-15" and records[0].timestamp == t0 + 150
        assert consumer.position(tp0) == 20 and consumer.position(tp1) == 20

        consumer.seek_to_beginning([tp1])
        assert consumer.position(tp1) == 0
        assert [r.offset for r in read(consumer, 20) if r.partition == 1] == list(range(20))
        with pytest.raises(KafkaException, match="not assigned"):
            consumer.seek(TopicPartition(topic, 7), 0)


def test_offsets_for_times(bootstrap: str, timed_topic: tuple[str, int]) -> None:
    topic, t0 = timed_topic
    tp = TopicPartition(topic, 1)
    with strom_consumer(bootstrap) as consumer:
        found = consumer.offsets_for_times({tp: t0 + 70})
        assert found == {tp: OffsetAndTimestamp(7, t0 + 70, 0)}
        assert consumer.offsets_for_times({tp: t0 + 71})[tp] == OffsetAndTimestamp(8, t0 + 80, 0)
        assert consumer.offsets_for_times({tp: 0})[tp] == OffsetAndTimestamp(0, t0, 0)
        assert consumer.offsets_for_times({tp: t0 + 10_000}) == {tp: None}


def test_max_poll_records_and_pause_resume(bootstrap: str, timed_topic: tuple[str, int]) -> None:
    topic, _ = timed_topic
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    with strom_consumer(bootstrap, **{"max.poll.records": 3}) as consumer:
        consumer.assign([tp0, tp1])
        consumer.pause([tp0])
        assert consumer.paused() == {tp0}
        seen: list[ConsumerRecord] = []
        while len(seen) < 20:
            batch = consumer.poll(1.0)
            assert 0 < len(batch) <= 3
            seen += batch
        assert {r.partition for r in seen} == {1}
        assert consumer.poll(0.3) == []  # only the paused partition has records left
        assert consumer.position(tp0) == 0
        consumer.resume([tp0])
        assert consumer.paused() == set()
        assert [r.offset for r in consumer.poll(5)] == [0, 1, 2]
        # Paused with fetched records waiting: they stay buffered and come after resume().
        consumer.pause([tp0])
        assert consumer.poll(0.3) == []
        consumer.resume([tp0])
        resumed = read(consumer, 17)
        assert [r.offset for r in resumed] == list(range(3, 20)) and {r.partition for r in resumed} == {0}


# ---------------------------------------------------------------- auto.offset.reset


def test_auto_offset_reset(bootstrap: str) -> None:
    topic = new_topic(bootstrap, "reset")
    write(bootstrap, topic, [b"old-%d" % i for i in range(5)])
    tp = TopicPartition(topic, 0)

    with strom_consumer(bootstrap, **{"auto.offset.reset": "latest"}) as latest:
        latest.assign([tp])
        assert latest.position(tp) == 5
        write(bootstrap, topic, [b"new"])
        assert [r.value for r in read(latest, 1)] == [b"new"]

    # A group without committed offsets and no reset strategy: poll() and position() refuse.
    group = unique("reset-none")
    with strom_consumer(bootstrap, **{"auto.offset.reset": "none", "group.id": group}) as none:
        none.assign([tp])
        deadline = time.monotonic() + TIMEOUT
        with pytest.raises(NoOffsetForPartitionError) as raised:
            while time.monotonic() < deadline:
                none.poll(0.2)
        assert raised.value.partitions == {tp}
        with pytest.raises(NoOffsetForPartitionError):
            none.position(tp)
        # A position out of range is an error too, until the application seeks.
        none.seek(tp, 1000)
        with pytest.raises(OffsetOutOfRangeError) as out_of_range:
            while time.monotonic() < deadline:
                none.poll(0.2)
        assert out_of_range.value.offsets == {tp: 1000}
        none.seek(tp, 4)
        assert [r.value for r in read(none, 2)] == [b"old-4", b"new"]

    with strom_consumer(bootstrap) as earliest:
        earliest.assign([tp])
        earliest.seek(tp, 1000)  # out of range: reset to the earliest offset
        assert [r.offset for r in read(earliest, 6)] == list(range(6))


# ---------------------------------------------------------------- commits


class Recorder(ConsumerRebalanceListener):
    def __init__(self, consumer: Consumer | None = None) -> None:
        self.events: list[tuple[str, set[TopicPartition]]] = []
        self.consumer = consumer

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.events.append(("revoked", revoked))
        if self.consumer is not None and revoked:
            self.consumer.commit_sync()  # as Kafka's docs suggest: commit before the partitions go

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.events.append(("assigned", assigned))

    def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        self.events.append(("lost", lost))


def test_commits_with_metadata_resume_after_restart(bootstrap: str, open_consumers: list[Consumer]) -> None:
    topic = new_topic(bootstrap, "commits", partitions=2)
    for partition in (0, 1):
        write(bootstrap, topic, [b"%d-%d" % (partition, i) for i in range(10)], partition)
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    group = unique("commits")
    first = strom_consumer(bootstrap, **{"group.id": group, "enable.auto.commit": False})
    open_consumers.append(first)
    listener = Recorder()
    first.subscribe([topic], listener)
    assert len(read(first, 20)) == 20
    assert listener.events == [("assigned", {tp0, tp1})]  # a new member has nothing to revoke
    assert first.group_metadata()[:2] == (group, 1)

    first.commit_sync({tp0: OffsetAndMetadata(4, "four"), tp1: 7})
    assert first.committed([tp0, tp1]) == {tp0: OffsetAndMetadata(4, "four"), tp1: OffsetAndMetadata(7)}
    done: list[tuple[dict[TopicPartition, OffsetAndMetadata], Exception | None]] = []
    first.commit_async({tp1: OffsetAndMetadata(8, "async")}, lambda offsets, exc: done.append((offsets, exc)))
    poll_until(first, lambda: bool(done), "the commit callback runs in poll()")
    assert done == [({tp1: OffsetAndMetadata(8, "async")}, None)]
    first.close()

    # A new member of the group starts where the commits say.
    second = strom_consumer(bootstrap, **{"group.id": group, "enable.auto.commit": False})
    open_consumers.append(second)
    second.subscribe([topic])
    records = read(second, 8)
    assert sorted((r.partition, r.offset) for r in records) == [(0, o) for o in range(4, 10)] + [
        (1, 8),
        (1, 9),
    ]
    with strom_consumer(bootstrap) as without_group, pytest.raises(KafkaException, match=r"group\.id"):
        without_group.commit_sync({tp0: 1})


def test_auto_commit_on_close_and_in_poll(bootstrap: str, open_consumers: list[Consumer]) -> None:
    topic = new_topic(bootstrap, "autocommit")
    write(bootstrap, topic, [b"%d" % i for i in range(10)])
    tp = TopicPartition(topic, 0)
    group = unique("autocommit")
    config = {"group.id": group, "auto.commit.interval.ms": 200, "max.poll.records": 4}
    first = strom_consumer(bootstrap, **config)
    open_consumers.append(first)
    first.assign([tp])
    assert [r.offset for r in first.poll(5)] == [0, 1, 2, 3]
    time.sleep(0.3)
    # The next poll commits what the previous ones returned (not what it returns itself).
    assert len(read(first, 1)) >= 1
    poll_until(first, lambda: first.committed([tp])[tp] == OffsetAndMetadata(4, "", 0), "the auto-commit")
    poll_until(first, lambda: first.position(tp) == 10, "reading the rest")
    first.close()  # commits the position
    second = strom_consumer(bootstrap, **config)
    open_consumers.append(second)
    assert second.committed([tp])[tp] == OffsetAndMetadata(10, "", 0)


# ---------------------------------------------------------------- subscriptions


def test_pattern_subscription_picks_up_a_topic_created_later(
    bootstrap: str, open_consumers: list[Consumer]
) -> None:
    prefix = unique("rx")
    first = new_topic(bootstrap, prefix)
    write(bootstrap, first, [b"first"])
    consumer = strom_consumer(bootstrap, **{"group.id": unique("rx"), "metadata.max.age.ms": 300})
    open_consumers.append(consumer)
    consumer.subscribe(f"^{prefix}-.*")
    assert [r.value for r in read(consumer, 1)] == [b"first"]
    assert consumer.subscription() == {first}

    second = new_topic(bootstrap, prefix)
    write(bootstrap, second, [b"second"])
    create_topic(bootstrap, unique("rx-other"))  # does not match
    assert [(r.topic, r.value) for r in read(consumer, 1)] == [(second, b"second")]
    assert consumer.subscription() == {first, second}
    assert consumer.assignment() == {TopicPartition(first, 0), TopicPartition(second, 0)}


def test_subscribed_topic_created_after_the_join_is_assigned(
    bootstrap: str, open_consumers: list[Consumer]
) -> None:
    topic = unique("later")
    consumer = strom_consumer(
        bootstrap,
        **{"group.id": unique("later"), "metadata.max.age.ms": 300, "allow.auto.create.topics": False},
    )
    open_consumers.append(consumer)
    consumer.subscribe([topic])
    poll_until(consumer, lambda: consumer.group_metadata()[1] > 0, "the member joins")
    assert consumer.assignment() == set()
    create_topic(bootstrap, topic, 2)
    write(bootstrap, topic, [b"hello"], partition=1)
    # The leader sees the topic appear in metadata and rebalances.
    assert [(r.partition, r.value) for r in read(consumer, 1)] == [(1, b"hello")]
    assert consumer.assignment() == {TopicPartition(topic, 0), TopicPartition(topic, 1)}


def test_unsubscribe_revokes_and_leaves_the_group(bootstrap: str, open_consumers: list[Consumer]) -> None:
    topic = new_topic(bootstrap, "leave")
    write(bootstrap, topic, [b"x"])
    group = unique("leave")
    consumer = strom_consumer(bootstrap, **{"group.id": group})
    open_consumers.append(consumer)
    listener = Recorder(consumer)
    consumer.subscribe([topic], listener)
    read(consumer, 1)
    consumer.unsubscribe()
    assert listener.events[-1] == ("revoked", {TopicPartition(topic, 0)})
    assert consumer.assignment() == set() and consumer.subscription() == set()
    # The listener committed; LeaveGroup left the group empty at once.
    admin = AdminClient({"bootstrap.servers": bootstrap})
    description = admin.describe_consumer_groups([group])[group].result(timeout=10)
    assert description.members == []
    offsets = admin.list_consumer_group_offsets([_group_request(group)])[group].result(timeout=10)
    assert [tp.offset for tp in offsets.topic_partitions] == [1]
    with pytest.raises(KafkaException, match="not subscribed"):
        consumer.poll(0)


def _group_request(group: str) -> Any:
    from confluent_kafka import ConsumerGroupTopicPartitions

    return ConsumerGroupTopicPartitions(group)


def test_member_that_stops_polling_leaves_and_rejoins(bootstrap: str, open_consumers: list[Consumer]) -> None:
    topic = new_topic(bootstrap, "slow")
    write(bootstrap, topic, [b"x"])
    tp = TopicPartition(topic, 0)
    consumer = strom_consumer(
        bootstrap,
        **{
            "group.id": unique("slow"),
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 200,
            "max.poll.interval.ms": 1000,
            "enable.auto.commit": False,
        },
    )
    open_consumers.append(consumer)
    listener = Recorder()
    consumer.subscribe([topic], listener)
    read(consumer, 1)
    generation = consumer.group_metadata()[1]
    time.sleep(2.0)  # no poll() within max.poll.interval.ms: the member leaves the group
    assert consumer.group_metadata()[1] == -1
    with pytest.raises(CommitFailedError):
        consumer.commit_sync({tp: 1})
    poll_until(consumer, lambda: len(listener.events) >= 3, "the member rejoins")
    # Its partitions are lost (another member may own them by now), not revoked.
    assert listener.events == [("assigned", {tp}), ("lost", {tp}), ("assigned", {tp})]
    assert consumer.group_metadata()[1] > generation
    consumer.commit_sync({tp: 1})


def test_close_during_a_pending_join_leaves_the_group_at_once(
    bootstrap: str, open_consumers: list[Consumer]
) -> None:
    """Ctrl-C while the consumer's JoinGroup waits for another member: close() returns at once and
    the group no longer counts the consumer (the waiting JoinGroup and LeaveGroup share a connection,
    and a broker answers a connection's requests in order)."""
    topic = new_topic(bootstrap, "pending-join")
    group = unique("pending-join")
    subscription = struct.pack(">hih", 0, 1, len(topic)) + topic.encode() + struct.pack(">i", -1)
    protocols = [("range", subscription)]
    host, port = bootstrap.split(":")
    with GroupWire(host, int(port), client_id="silent") as silent:
        # A member that never rejoins: the next rebalance waits for its 30 s session.
        member_id = silent.join_group(group, "", protocols, session_timeout_ms=30000).member_id
        joined = silent.join_group(group, member_id, protocols, session_timeout_ms=30000)
        silent.request(silent.sync_group_request(group, joined.generation_id, member_id, {member_id: b""}))
        consumer = strom_consumer(bootstrap, **{"group.id": group})
        open_consumers.append(consumer)
        consumer.subscribe([topic])
        deadline = time.monotonic() + TIMEOUT
        while len(silent.describe_groups(group).groups[0].members) < 2:
            assert time.monotonic() < deadline, "the consumer never joined"
            consumer.poll(0.1)
        started = time.monotonic()
        consumer.close(timeout=10)
        assert time.monotonic() - started < 3
        (described,) = silent.describe_groups(group).groups
        assert [m.member_id for m in described.members] == [member_id]


# ---------------------------------------------------------------- compaction and isolation


COMPACTED = {"cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01"}


def test_compacted_log_with_gaps_and_emptied_batches(broker: BrokerProcess) -> None:
    bootstrap = broker.bootstrap
    topic = new_topic(bootstrap, "compacted", config=COMPACTED)
    # An idempotent producer: the cleaner keeps its emptied last batches as record-less batches.
    for wave in range(6):
        messages = [Message(b"key-%d" % (i % 5), b"w%d-%d" % (wave, i), partition=0) for i in range(20)]
        deliveries = produce("kafka-python", bootstrap, topic, messages)
        assert deliveries is not None and all(d.error_code is None for d in deliveries)
        time.sleep(0.15)  # past segment.ms: the next wave starts a new segment
    for delivery in produce_confluent(bootstrap, topic, [Message(b"sentinel", b"end", partition=0)], {}):
        assert delivery.error_code is None, delivery
    end = 121

    def cleaned() -> bool:
        keys = [r.key for r in stored_records(bootstrap, topic) if r.key is not None]
        return len(keys) == len(set(keys))

    deadline = time.monotonic() + TIMEOUT
    while not cleaned():
        assert time.monotonic() < deadline, "the log was not cleaned"
        time.sleep(0.2)
    stored = stored_records(bootstrap, topic)
    assert len(stored) < end and stored[-1].offset == end - 1
    with strom_consumer(bootstrap, **{"max.poll.records": 2}) as consumer:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        records = read(consumer, len(stored))
        assert as_consumed(records) == stored
        assert consumer.position(tp) == end
        # Starting inside a gap reads from the next record that is left.
        gap = next(o for o in range(end) if o not in {r.offset for r in stored})
        consumer.seek(tp, gap)
        assert read(consumer, 1)[0].offset == min(r.offset for r in stored if r.offset > gap)


def test_read_committed_reads_non_transactional_records(bootstrap: str) -> None:
    topic = new_topic(bootstrap, "committed")
    write(bootstrap, topic, [b"a", b"b", b"c"])
    with strom_consumer(bootstrap, **{"isolation.level": "read_committed"}) as consumer:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        assert [r.value for r in read(consumer, 3)] == [b"a", b"b", b"c"]
        assert consumer.end_offsets([tp]) == {tp: 3}


# ---------------------------------------------------------------- AsyncConsumer


def test_async_consumer_iterates_commits_and_rebalances(bootstrap: str) -> None:
    topic = new_topic(bootstrap, "async", partitions=2)
    for partition in (0, 1):
        write(bootstrap, topic, [b"%d-%d" % (partition, i) for i in range(5)], partition)
    group = unique("async")
    events: list[tuple[str, set[TopicPartition]]] = []

    class AsyncListener(ConsumerRebalanceListener):
        async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
            await asyncio.sleep(0)
            events.append(("revoked", revoked))

        async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
            events.append(("assigned", assigned))

    async def run() -> list[tuple[int, int]]:
        config = {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest"}
        async with AsyncConsumer({**config, "fetch.max.wait.ms": 100}) as consumer:
            consumer.subscribe([topic], AsyncListener())
            got: list[tuple[int, int]] = []
            async with asyncio.timeout(TIMEOUT):
                async for record in consumer:
                    got.append((record.partition, record.offset))
                    if len(got) == 10:
                        break
            await consumer.commit_sync()
            tp = TopicPartition(topic, 0)
            assert await consumer.committed([tp]) == {tp: OffsetAndMetadata(5, "", 0)}
            assert await consumer.position(tp) == 5
            assert await consumer.end_offsets([tp]) == {tp: 5}
            return got

    got = asyncio.run(run())
    assert sorted(got) == [(p, o) for p in (0, 1) for o in range(5)]
    assert events[0] == ("assigned", {TopicPartition(topic, 0), TopicPartition(topic, 1)})
    # close() revoked the partitions (a dynamic member leaves the group).
    assert events[-1] == ("revoked", {TopicPartition(topic, 0), TopicPartition(topic, 1)})


# ---------------------------------------------------------------- failures


def test_group_consumer_rides_out_a_broker_restart(
    running_broker: BrokerProcess, open_consumers: list[Consumer]
) -> None:
    bootstrap = running_broker.bootstrap
    topic = new_topic(bootstrap, "restart")
    write(bootstrap, topic, [b"before-%d" % i for i in range(5)])
    tp = TopicPartition(topic, 0)
    consumer = strom_consumer(
        bootstrap,
        **{
            "group.id": unique("restart"),
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 300,
            "reconnect.backoff.max.ms": 200,
        },
    )
    open_consumers.append(consumer)
    consumer.subscribe([topic])
    assert [r.offset for r in read(consumer, 5)] == list(range(5))
    consumer.commit_sync()
    running_broker.restart()
    write(bootstrap, topic, [b"after-%d" % i for i in range(5)])
    # The fetcher reconnects, the coordinator is found again, and commits work again.
    assert [r.value for r in read(consumer, 5, timeout=30)] == [b"after-%d" % i for i in range(5)]
    deadline = time.monotonic() + 30
    while True:
        try:
            consumer.commit_sync(timeout=5)
            break
        except CommitFailedError:
            assert time.monotonic() < deadline
            consumer.poll(0.2)  # the restarted coordinator lost the member: rejoin first
    assert consumer.committed([tp]) == {tp: OffsetAndMetadata(10, "", 0)}


# ---------------------------------------------------------------- the fetch-path decoder (no broker)


def records_of(data: bytes, fetch_offset: int = 0, **kw: Any) -> tuple[list[ConsumerRecord], int]:
    fetched = FetchedRecords("t", 0, data, fetch_offset, **kw)
    got: list[ConsumerRecord] = []
    while not fetched.exhausted:
        got += fetched.take(2)
    return got, fetched.next_offset


def batch(
    base_offset: int, values: Sequence[bytes], producer_id: int = -1, transactional: bool = False
) -> bytes:
    return encode_batch(
        [RecordSpec(None, v, timestamp=1000 + base_offset) for v in values],
        base_offset=base_offset,
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=0 if producer_id >= 0 else -1,
        is_transactional=transactional,
    )


def marker(offset: int, kind: ControlRecordType, producer_id: int) -> bytes:
    return build_control_batch(
        kind, producer_id=producer_id, producer_epoch=0, coordinator_epoch=0, base_offset=offset, timestamp=1
    )


TRANSACTIONS = b"".join(
    [
        batch(0, [b"plain-0", b"plain-1"]),
        batch(2, [b"aborted-2", b"aborted-3"], producer_id=7, transactional=True),
        batch(4, [b"committed-4", b"committed-5"], producer_id=8, transactional=True),
        marker(6, ControlRecordType.COMMIT, 8),
        marker(7, ControlRecordType.ABORT, 7),
        batch(8, [b"plain-8"]),
        batch(9, [b"late-abort-9"], producer_id=7, transactional=True),  # a new transaction of pid 7
    ]
)


def test_control_batches_are_skipped_and_read_committed_drops_aborted_transactions() -> None:
    got, next_offset = records_of(TRANSACTIONS)
    assert [r.offset for r in got] == [0, 1, 2, 3, 4, 5, 8, 9] and next_offset == 10
    got, next_offset = records_of(TRANSACTIONS, aborted_transactions=[(7, 2)])
    values = [r.value for r in got]
    assert values == [b"plain-0", b"plain-1", b"committed-4", b"committed-5", b"plain-8", b"late-abort-9"]
    assert next_offset == 10
    # Only the transaction the response lists as aborted is dropped; pid 7's next one is not (yet).
    got, _ = records_of(TRANSACTIONS, aborted_transactions=[(7, 2), (7, 9)])
    assert [r.offset for r in got] == [0, 1, 4, 5, 8]


def test_a_fetch_offset_inside_a_batch_and_partial_batches() -> None:
    data = encode_batch(
        [RecordSpec(b"k%d" % i, b"v%d" % i, timestamp=5000 + i) for i in range(6)],
        base_offset=10,
        compression=CompressionType.LZ4,
    ) + batch(16, [b"next"])
    got, next_offset = records_of(data, fetch_offset=13)
    assert [(r.offset, r.key, r.timestamp) for r in got[:3]] == [
        (13, b"k3", 5003),
        (14, b"k4", 5004),
        (15, b"k5", 5005),
    ]
    assert got[-1].value == b"next" and next_offset == 17
    # A response cut inside its last batch: the complete ones are read, the rest fetched again.
    assert scan_batches(data[:-3], 13) == (len(data) - len(batch(16, [b"next"])), 16)
    got, next_offset = records_of(data[:-3], fetch_offset=13)
    assert [r.offset for r in got] == [13, 14, 15] and next_offset == 16


def test_corrupt_batches_are_reported() -> None:
    data = bytearray(batch(0, [b"abc", b"def"]))
    data[-2] ^= 0xFF
    with pytest.raises(InvalidBatchError, match="CRC"):
        records_of(bytes(data))
    got, _ = records_of(bytes(data), check_crcs=False)  # check.crcs=false reads the damaged bytes
    assert [r.value for r in got] == [b"abc", b"de" + bytes([ord("f") ^ 0xFF])]
