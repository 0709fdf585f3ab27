"""Strom's consumer at the edges, against a real broker: what Kafka's Java consumer guarantees
when fetches, seeks, commits and rebalances overlap, when topics change under a subscription,
and when the broker stops answering or restarts.

- Fetching: no partition starves while another has a backlog larger than fetch.max.bytes, nor
  while a paused one has its records buffered; a batch larger than max.partition.fetch.bytes
  comes through; a stale fetch (in flight across a seek, or buffered across pause/seek/resume or
  an assign change) is never returned; DeleteRecords past the position resets it (earliest,
  latest) or fails poll() (none).
- Groups: commits while the group rebalances; the commit before a rebalance covers what earlier
  polls returned, never the poll in progress; asynchronous commits in order; listeners that seek
  or commit inside their callbacks; auto-commit and ``async for`` count only records handed out;
  a subscription changed and restored between polls; topics deleted or added under a
  subscription, partitions added to a subscribed topic; a fenced static member.
- Failures: commit_sync, committed, end_offsets, offsets_for_times and close(timeout) keep their
  timeouts while the broker hangs (SIGSTOP) and work again after; a consumer started before its
  broker waits for it; a restart redelivers at most the records after the last commit.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

import pytest

from brokerproc import BrokerProcess, Freezer
from integration.clients_util import Message, create_topic, poll_until, produce_confluent, read
from strom.client.admin import AdminClient, NewPartitions
from strom.client.cluster import TopicPartition
from strom.client.consumer import (
    AsyncConsumer,
    Consumer,
    ConsumerRebalanceListener,
    ConsumerRecord,
    OffsetAndMetadata,
    OffsetOutOfRangeError,
)
from strom.client.errors import CommitFailedError, ErrorCode, KafkaException, KafkaTimeoutError

BROKER_CONFIG = {"group.initial.rebalance.delay.ms": "0", "auto.create.topics.enable": "false"}
TIMEOUT = 15.0


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def new_topic(bootstrap: str, prefix: str, partitions: int = 1) -> str:
    name = unique(prefix)
    create_topic(bootstrap, name, partitions)
    return name


def write(bootstrap: str, topic: str, values: Sequence[bytes], partition: int = 0, **producer: Any) -> None:
    messages = [Message(None, v, partition=partition) for v in values]
    for delivery in produce_confluent(bootstrap, topic, messages, producer):
        assert delivery.error_code is None, delivery


def strom_consumer(bootstrap: str, **config: Any) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "auto.offset.reset": "earliest",
            "fetch.max.wait.ms": 100,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 200,
            "allow.auto.create.topics": False,
            **config,
        }
    )


@pytest.fixture
def consumers() -> Iterator[list[Consumer]]:
    """Consumers a test opened; closed even when it fails."""
    opened: list[Consumer] = []
    yield opened
    for consumer in opened:
        consumer.close(timeout=5)


@pytest.fixture(scope="module")
def admin(bootstrap: str) -> Iterator[AdminClient]:
    with AdminClient({"bootstrap.servers": bootstrap, "default.api.timeout.ms": 10_000}) as client:
        yield client


# ---------------------------------------------------------------- fetching


def test_a_partition_with_a_backlog_does_not_starve_the_others(bootstrap: str) -> None:
    topic = new_topic(bootstrap, "fair", partitions=2)
    # Many small batches in partition 0, far more than one fetch carries; a few records in 1.
    write(bootstrap, topic, [b"%05d" % i + b"x" * 200 for i in range(3000)], 0, **{"batch.size": 8192})
    write(bootstrap, topic, [b"p1-%d" % i + b"z" * 3000 for i in range(5)], 1)  # one 15 KB batch
    limits = {"fetch.max.bytes": 16384, "max.partition.fetch.bytes": 16384, "max.poll.records": 50}
    with strom_consumer(bootstrap, **limits) as consumer:
        consumer.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        before_p1 = 0
        deadline = time.monotonic() + TIMEOUT
        while True:
            assert time.monotonic() < deadline, f"partition 1 starved: {before_p1} records of 0 first"
            records = consumer.poll(0.2)
            if any(r.partition == 1 for r in records):
                break
            before_p1 += len(records)
        # Kafka's consumer fetches partition 1 once 0 has data buffered: within a fetch or two.
        assert before_p1 < 500, f"{before_p1} records of partition 0 came before partition 1's first"


def test_records_buffered_for_a_paused_partition_do_not_stop_the_others(bootstrap: str) -> None:
    topic = new_topic(bootstrap, "paused-backlog", partitions=2)
    write(bootstrap, topic, [b"%05d" % i + b"x" * 200 for i in range(3000)], 0, **{"batch.size": 8192})
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    limits = {"fetch.max.bytes": 16384, "max.partition.fetch.bytes": 16384, "max.poll.records": 10}
    with strom_consumer(bootstrap, **limits) as consumer:
        consumer.assign([tp0, tp1])
        assert {r.partition for r in read(consumer, 1)} == {0}
        time.sleep(0.3)  # the fetcher buffers partition 0's backlog up to its limit meanwhile
        consumer.pause([tp0])  # as an application does while partition 0's records wait elsewhere
        write(bootstrap, topic, [b"p1-%d" % i for i in range(3)], 1)
        got = read(consumer, 3, timeout=5)
        assert [(r.partition, r.value) for r in got] == [(1, b"p1-%d" % i) for i in range(3)]
        consumer.resume([tp0])
        assert {r.partition for r in read(consumer, 1)} == {0}


def test_a_batch_larger_than_the_partition_fetch_limit_is_returned(bootstrap: str) -> None:
    topic = new_topic(bootstrap, "big", partitions=2)
    # One 64 KiB batch per partition, four times max.partition.fetch.bytes.
    for partition in (0, 1):
        write(bootstrap, topic, [b"%d-%d" % (partition, i) + b"y" * 4000 for i in range(16)], partition)
    with strom_consumer(bootstrap, **{"max.partition.fetch.bytes": 16384}) as consumer:
        consumer.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        records = read(consumer, 32)
        assert sorted((r.partition, r.offset) for r in records) == [(p, o) for p in (0, 1) for o in range(16)]


def test_a_fetch_in_flight_across_a_seek_is_discarded(bootstrap: str) -> None:
    topic = new_topic(bootstrap, "inflight")
    write(bootstrap, topic, [b"old-%d" % i for i in range(5)])
    tp = TopicPartition(topic, 0)
    # The broker holds a fetch at the log end for up to 2 s (nothing to return).
    with strom_consumer(bootstrap, **{"fetch.max.wait.ms": 2000, "fetch.min.bytes": 1}) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 5)
        assert consumer.poll(0.3) == []  # the fetch at 5 is now parked in the broker
        consumer.seek(tp, 1)
        write(bootstrap, topic, [b"new-5"])  # answers the parked fetch: stale, from before the seek
        records = read(consumer, 5)
        assert [(r.offset, r.value) for r in records[:5]] == [
            (1, b"old-1"),
            (2, b"old-2"),
            (3, b"old-3"),
            (4, b"old-4"),
            (5, b"new-5"),
        ]
        assert consumer.position(tp) == 6


def test_pause_seek_resume_and_assign_changes_drop_buffered_records(bootstrap: str) -> None:
    topic = new_topic(bootstrap, "pause-seek", partitions=2)
    for partition in (0, 1):
        write(bootstrap, topic, [b"%d-%d" % (partition, i) for i in range(30)], partition)
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    with strom_consumer(bootstrap, **{"max.poll.records": 5}) as consumer:
        consumer.assign([tp0])
        assert [r.offset for r in consumer.poll(5)] == [0, 1, 2, 3, 4]  # 5..29 are buffered now
        consumer.pause([tp0])
        assert consumer.poll(0.2) == []
        consumer.seek(tp0, 20)
        consumer.resume([tp0])
        assert [r.offset for r in read(consumer, 10)][:10] == list(range(20, 30))

        consumer.seek(tp0, 0)
        assert [r.offset for r in consumer.poll(5)] == [0, 1, 2, 3, 4]
        consumer.assign([tp1])  # tp0's buffered records must never come out now
        got = read(consumer, 30)
        assert {r.partition for r in got} == {1}
        assert [r.offset for r in got] == list(range(30))
        consumer.assign([tp0, tp1])  # tp0 comes back without a position kept: starts over
        again = read(consumer, 30)
        assert [r.offset for r in again if r.partition == 0] == list(range(30))


def test_delete_records_past_the_position_resets_or_fails(bootstrap: str, admin: AdminClient) -> None:
    topic = new_topic(bootstrap, "trimmed")
    write(bootstrap, topic, [b"r%d" % i for i in range(10)])
    tp = TopicPartition(topic, 0)
    assert admin.delete_records({tp: 6}) == {tp: 6}
    with strom_consumer(bootstrap) as earliest:
        earliest.assign([tp])
        earliest.seek(tp, 2)
        assert [r.offset for r in read(earliest, 4)] == [6, 7, 8, 9]
    with strom_consumer(bootstrap, **{"auto.offset.reset": "latest"}) as latest:
        latest.assign([tp])
        latest.seek(tp, 2)
        poll_until(latest, lambda: latest.position(tp) == 10, "reset to the log end")
        write(bootstrap, topic, [b"r10"])
        assert [r.offset for r in read(latest, 1)] == [10]
    with strom_consumer(bootstrap, **{"auto.offset.reset": "none"}) as none:
        none.assign([tp])
        none.seek(tp, 2)
        with pytest.raises(OffsetOutOfRangeError) as raised:
            deadline = time.monotonic() + TIMEOUT
            while time.monotonic() < deadline:
                none.poll(0.2)
        assert raised.value.offsets == {tp: 2}
        assert raised.value.error_code == ErrorCode.offset_out_of_range
        none.seek(tp, 7)
        assert [r.offset for r in read(none, 4)] == [7, 8, 9, 10]


# ---------------------------------------------------------------- groups


class Recorder(ConsumerRebalanceListener):
    def __init__(self) -> None:
        self.events: list[tuple[str, set[TopicPartition]]] = []

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.events.append(("revoked", revoked))

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.events.append(("assigned", assigned))

    def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        self.events.append(("lost", lost))


def test_commit_while_the_group_rebalances(bootstrap: str, consumers: list[Consumer]) -> None:
    topic = new_topic(bootstrap, "commit-race", partitions=2)
    for partition in (0, 1):
        write(bootstrap, topic, [b"%d" % i for i in range(10)], partition)
    tp0 = TopicPartition(topic, 0)
    group = unique("commit-race")
    config = {"group.id": group, "enable.auto.commit": False, "partition.assignment.strategy": ["range"]}
    first = strom_consumer(bootstrap, **config)
    consumers.append(first)
    first.subscribe([topic])
    read(first, 20)
    generation = first.group_metadata()[1]
    second = strom_consumer(bootstrap, **config)
    consumers.append(second)
    second.subscribe([topic])
    second.poll(0.5)  # joins: the coordinator prepares a rebalance, first learns it by heartbeat
    time.sleep(0.5)
    # Until first rejoins, the coordinator takes its commits with the old generation (as Kafka's does).
    first.commit_sync({tp0: 3}, timeout=5)
    assert first.committed([tp0]) == {tp0: OffsetAndMetadata(3)}
    # poll() rejoins; meanwhile a commit is refused as retriable, never sent with a stale generation.
    refused: list[CommitFailedError] = []
    deadline = time.monotonic() + TIMEOUT
    while len(first.assignment()) != 1 or len(second.assignment()) != 1:
        assert time.monotonic() < deadline, "the group did not stabilize"
        first.poll(0.05)
        try:
            first.commit_sync({tp0: 3}, timeout=5)
        except CommitFailedError as exc:
            refused.append(exc)
        second.poll(0.05)
    assert all(exc.error_code == ErrorCode.rebalance_in_progress for exc in refused), refused
    assert first.group_metadata()[1] > generation
    (owned,) = first.assignment()
    first.commit_sync({owned: 4})
    assert first.committed([owned]) == {owned: OffsetAndMetadata(4)}


def test_the_commit_before_a_rebalance_covers_only_records_of_earlier_polls(
    bootstrap: str, admin: AdminClient, consumers: list[Consumer]
) -> None:
    topic = new_topic(bootstrap, "prepare")
    write(bootstrap, topic, [b"%d" % i for i in range(50)])
    tp = TopicPartition(topic, 0)
    group = unique("prepare")
    config = {
        "group.id": group,
        "auto.commit.interval.ms": 60_000,  # only the commit before the rebalance happens
        "max.poll.records": 5,
        "partition.assignment.strategy": ["range"],
    }
    first = strom_consumer(bootstrap, **config)
    consumers.append(first)
    first.subscribe([topic])
    assert [r.offset for r in read(first, 5)] == [0, 1, 2, 3, 4]
    time.sleep(0.3)  # the rest of the log is buffered
    second = strom_consumer(bootstrap, **config)
    consumers.append(second)
    second.subscribe([topic])
    second.poll(0.3)  # joins; first hears of the rebalance with its next heartbeat
    time.sleep(0.5)
    # This poll starts first's part of the rebalance. Whatever it returns is being processed
    # while the rebalance goes on: the commit before the revocation must not cover it...
    returned = [r.offset for r in first.poll(1.0)]
    time.sleep(0.5)
    committed = admin.list_consumer_group_offsets(group).get(tp)
    assert committed is None or committed.offset == 5, (returned, committed)
    # ...and once first polls again (done with them), the commit covers them and nothing more
    # comes out of first before the revocation: the next owner starts where first stopped.
    after: list[int] = []
    deadline = time.monotonic() + TIMEOUT
    while 49 not in after:
        assert time.monotonic() < deadline, after
        after += [r.offset for r in first.poll(0.1) + second.poll(0.1)]
    assert returned + sorted(after) == list(range(returned[0], 50)), (returned, after)


def test_asynchronous_commits_complete_in_order_before_a_synchronous_one(
    bootstrap: str, consumers: list[Consumer]
) -> None:
    topic = new_topic(bootstrap, "async-order")
    write(bootstrap, topic, [b"x"] * 5)
    tp = TopicPartition(topic, 0)
    consumer = strom_consumer(bootstrap, **{"group.id": unique("async-order"), "enable.auto.commit": False})
    consumers.append(consumer)
    consumer.subscribe([topic])
    read(consumer, 5)
    done: list[int] = []
    for offset in (1, 2, 3, 4):
        consumer.commit_async(
            {tp: offset}, lambda offsets, exc: done.append(-1 if exc else offsets[tp].offset)
        )
    consumer.commit_sync({tp: 5})  # waits for them, and runs their callbacks before it returns
    assert done == [1, 2, 3, 4]
    assert consumer.committed([tp]) == {tp: OffsetAndMetadata(5)}
    # close() too finishes the asynchronous commits and runs their callbacks.
    consumer.commit_async({tp: 6}, lambda offsets, exc: done.append(-1 if exc else offsets[tp].offset))
    consumer.close()
    assert done == [1, 2, 3, 4, 6]


def test_listener_seeks_and_commits_inside_its_callbacks(bootstrap: str, consumers: list[Consumer]) -> None:
    topic = new_topic(bootstrap, "listener", partitions=2)
    for partition in (0, 1):
        write(bootstrap, topic, [b"%d-%d" % (partition, i) for i in range(10)], partition)
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    group = unique("listener")
    config = {"group.id": group, "enable.auto.commit": False, "partition.assignment.strategy": ["range"]}
    first = strom_consumer(bootstrap, **config)
    consumers.append(first)
    first.commit_sync({tp0: 2, tp1: 2})  # committed offsets the listener's seek must win over

    class Seeker(Recorder):
        def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
            super().on_partitions_assigned(assigned)
            for tp in assigned:
                first.seek(tp, 7)
            first.commit_sync()  # positions of the new partitions are 7 now

        def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
            super().on_partitions_revoked(revoked)
            first.commit_sync({tp: OffsetAndMetadata(9, "revoked") for tp in revoked})

    listener = Seeker()
    first.subscribe([topic], listener)
    records = read(first, 6)
    assert sorted((r.partition, r.offset) for r in records) == [(p, o) for p in (0, 1) for o in (7, 8, 9)]
    assert first.committed([tp0, tp1]) == {tp0: OffsetAndMetadata(7), tp1: OffsetAndMetadata(7)}
    # A second member: first's eager revocation commits inside the rebalance, with its generation.
    second = strom_consumer(bootstrap, **config)
    consumers.append(second)
    second.subscribe([topic])
    deadline = time.monotonic() + TIMEOUT
    while len(first.assignment()) != 1 or len(second.assignment()) != 1:
        assert time.monotonic() < deadline, "the partitions were not split"
        first.poll(0.1)
        second.poll(0.1)
    assert ("revoked", {tp0, tp1}) in listener.events
    (mine,) = first.assignment()
    (other,) = {tp0, tp1} - {mine}
    # The revocation committed 9 for both; the assignment callback then committed 7 for its partition.
    assert second.committed([tp0, tp1]) == {
        mine: OffsetAndMetadata(7),
        other: OffsetAndMetadata(9, "revoked"),
    }


def test_poll_shows_an_assignment_only_after_its_listener_ran(bootstrap: str, consumers: list[Consumer]) -> None:
    """As in Kafka, where poll() runs the whole rebalance: after any poll(), the listener has seen the
    assignment the consumer reports (on_partitions_assigned), and nothing is left of what it revoked."""
    topic = new_topic(bootstrap, "listener-turn", partitions=2)
    config = {"group.id": unique("listener-turn"), "partition.assignment.strategy": ["range"]}
    first = strom_consumer(bootstrap, **config)
    consumers.append(first)
    listener = Recorder()
    first.subscribe([topic], listener)
    checked = 0

    def poll_first() -> None:
        nonlocal checked
        first.poll(0.001)  # short polls: many chances to return in the middle of a rebalance
        assignment = first.assignment()
        last = listener.events[-1] if listener.events else None
        if assignment:
            assert last == ("assigned", assignment), listener.events
        else:
            assert last is None or last[0] != "assigned" or not last[1], listener.events
        checked += 1

    def poll_until_split(second: Consumer) -> None:
        deadline = time.monotonic() + TIMEOUT
        while len(first.assignment()) != 1 or len(second.assignment()) != 1:
            assert time.monotonic() < deadline, "the partitions were not split"
            poll_first()
            second.poll(0.01)

    deadline = time.monotonic() + TIMEOUT
    while len(first.assignment()) != 2:
        assert time.monotonic() < deadline, "first was not assigned both partitions"
        poll_first()
    for _ in range(2):  # a member joins (first revokes both, gets one) and leaves (first gets both)
        second = strom_consumer(bootstrap, **config)
        consumers.append(second)
        second.subscribe([topic])
        poll_until_split(second)
        second.close()
        deadline = time.monotonic() + TIMEOUT
        while len(first.assignment()) != 2:
            assert time.monotonic() < deadline, "first did not get both partitions back"
            poll_first()
    assert [kind for kind, _ in listener.events] == ["assigned", *["revoked", "assigned"] * 4]
    assert checked > 10


def test_auto_commit_covers_only_records_poll_returned(bootstrap: str, consumers: list[Consumer]) -> None:
    topic = new_topic(bootstrap, "returned")
    write(bootstrap, topic, [b"%d" % i for i in range(50)])
    tp = TopicPartition(topic, 0)
    group = unique("returned")
    consumer = strom_consumer(
        bootstrap, **{"group.id": group, "auto.commit.interval.ms": 0, "max.poll.records": 3}
    )
    consumers.append(consumer)
    consumer.subscribe([topic])
    got = read(consumer, 3)
    assert [r.offset for r in got] == [0, 1, 2]
    time.sleep(0.3)  # the whole log is prefetched and buffered by now
    assert [r.offset for r in consumer.poll(1.0)] == [3, 4, 5]  # commits 3 before returning these
    poll_until(consumer, lambda: consumer.committed([tp])[tp] is not None, "the auto-commit", 5)
    committed = consumer.committed([tp])[tp]
    assert committed is not None and committed.offset in (3, 6)
    consumer.close()
    with strom_consumer(bootstrap, **{"group.id": group}) as after:
        assert after.committed([tp])[tp] == OffsetAndMetadata(6, "", 0)


def test_async_iteration_stopped_early_commits_and_seeks_from_the_last_record_it_gave(bootstrap: str) -> None:
    topic = new_topic(bootstrap, "async-iter")
    write(bootstrap, topic, [b"%d" % i for i in range(10)])
    tp = TopicPartition(topic, 0)
    group = unique("async-iter")
    config = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "fetch.max.wait.ms": 100,
        "allow.auto.create.topics": False,
    }

    async def scenario() -> tuple[list[int], list[int], int]:
        async with AsyncConsumer(config) as consumer:
            consumer.subscribe([topic])
            seen: list[int] = []
            async with asyncio.timeout(TIMEOUT):
                async for record in consumer:  # one poll() takes all ten records
                    seen.append(record.offset)
                    if record.offset == 2:
                        break
            at = await consumer.position(tp)
            consumer.seek(tp, 0)  # records the iterator holds from before the seek are stale now
            again: list[int] = []
            async with asyncio.timeout(TIMEOUT):
                async for record in consumer:
                    again.append(record.offset)
                    if record.offset == 4:
                        break
            return seen, again, at
        # close() commits (enable.auto.commit): the records the iterator gave out, no more

    seen, again, position = asyncio.run(scenario())
    assert seen == [0, 1, 2] and position == 3
    assert again == [0, 1, 2, 3, 4]
    with strom_consumer(bootstrap, **{"group.id": group}) as check:
        assert check.committed([tp]) == {tp: OffsetAndMetadata(5, "", 0)}


def test_a_subscription_changed_and_restored_between_polls_keeps_reading(
    bootstrap: str, consumers: list[Consumer]
) -> None:
    first, second = new_topic(bootstrap, "sub-a"), new_topic(bootstrap, "sub-b")
    write(bootstrap, first, [b"a%d" % i for i in range(20)])
    write(bootstrap, second, [b"b%d" % i for i in range(20)])
    consumer = strom_consumer(bootstrap, **{"group.id": unique("resub"), "max.poll.records": 4})
    consumers.append(consumer)
    consumer.subscribe([first, second])
    got = read(consumer, 8)
    time.sleep(0.3)  # both logs are buffered by now, ahead of the positions
    consumer.subscribe([first])  # drops second's buffered records...
    consumer.subscribe([first, second])  # ...and takes it back before any rebalance
    got += read(consumer, 40 - len(got))
    for topic in (first, second):
        assert sorted(r.offset for r in got if r.topic == topic) == list(range(20)), topic


def _assigned(consumer: Consumer, count: int) -> bool:
    return len(consumer.assignment()) == count


def test_topics_deleted_and_added_under_subscriptions(
    bootstrap: str, admin: AdminClient, consumers: list[Consumer]
) -> None:
    prefix = unique("rx")
    keep, gone = f"{prefix}-keep", f"{prefix}-gone"
    create_topic(bootstrap, keep)
    create_topic(bootstrap, gone)
    write(bootstrap, keep, [b"k0"])
    write(bootstrap, gone, [b"g0"])
    listed = strom_consumer(bootstrap, **{"group.id": unique("listed"), "metadata.max.age.ms": 300})
    pattern = strom_consumer(bootstrap, **{"group.id": unique("pattern"), "metadata.max.age.ms": 300})
    consumers += [listed, pattern]
    listed.subscribe([keep, gone])
    pattern.subscribe(f"^{prefix}-.*")
    for consumer in (listed, pattern):
        assert sorted((r.topic, r.value) for r in read(consumer, 2)) == [(gone, b"g0"), (keep, b"k0")]
    admin.delete_topics([gone])
    for consumer in (listed, pattern):
        poll_until(consumer, partial(_assigned, consumer, 1), "the deleted topic goes")
        assert consumer.assignment() == {TopicPartition(keep, 0)}
    write(bootstrap, keep, [b"k1"])
    for consumer in (listed, pattern):
        assert [r.value for r in read(consumer, 1)] == [b"k1"]
    assert pattern.subscription() == {keep}
    # Partitions added to a subscribed topic: the leader notices in metadata and rebalances.
    admin.create_partitions({keep: NewPartitions(3)})
    write(bootstrap, keep, [b"k-p2"], partition=2)
    for consumer in (listed, pattern):
        poll_until(consumer, partial(_assigned, consumer, 3), "the new partitions are assigned")
        records = read(consumer, 1)
        assert [(r.partition, r.value) for r in records] == [(2, b"k-p2")]


def test_a_second_static_member_with_the_same_instance_id_fences_the_first(
    bootstrap: str, consumers: list[Consumer]
) -> None:
    topic = new_topic(bootstrap, "static")
    write(bootstrap, topic, [b"x"])
    tp = TopicPartition(topic, 0)
    config = {"group.id": unique("static"), "group.instance.id": "instance-1", "enable.auto.commit": False}
    old = strom_consumer(bootstrap, **config)
    consumers.append(old)
    old.subscribe([topic])
    read(old, 1)
    new = strom_consumer(bootstrap, **config)
    consumers.append(new)
    new.subscribe([topic])
    assert [r.value for r in read(new, 1)] == [b"x"]  # it takes over the partition at once
    assert new.assignment() == {tp}
    with pytest.raises(KafkaException) as fenced:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            old.poll(0.1)
            old.commit_sync({tp: 1})
    assert fenced.value.error_code == ErrorCode.fenced_instance_id
    new.commit_sync({tp: 1})
    assert new.committed([tp]) == {tp: OffsetAndMetadata(1)}


# ---------------------------------------------------------------- an unresponsive or restarted broker


@pytest.fixture
def freezer(broker: BrokerProcess) -> Iterator[Freezer]:
    freezer = Freezer(broker)
    yield freezer
    freezer.thaw()


def test_calls_keep_their_timeouts_while_the_broker_hangs(bootstrap: str, freezer: Freezer) -> None:
    topic = new_topic(bootstrap, "hang")
    write(bootstrap, topic, [b"x"])
    tp = TopicPartition(topic, 0)
    group = unique("hang")
    consumer = strom_consumer(bootstrap, **{"group.id": group, "enable.auto.commit": True})
    try:
        consumer.subscribe([topic])
        read(consumer, 1)
        freezer.freeze()
        for call in (
            lambda: consumer.commit_sync(timeout=1.0),
            lambda: consumer.committed([tp], timeout=1.0),
            lambda: consumer.end_offsets([tp], timeout=1.0),
            lambda: consumer.offsets_for_times({tp: 0}, timeout=1.0),
        ):
            started = time.monotonic()
            with pytest.raises(KafkaTimeoutError):
                call()
            assert time.monotonic() - started < 2.5
        # Answers to the requests given up on arrive now: they must not be taken for later ones.
        freezer.thaw()
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                consumer.commit_sync({tp: 1}, timeout=5)
                break
            except CommitFailedError:  # the session may have expired meanwhile: rejoin
                assert time.monotonic() < deadline
                consumer.poll(0.1)
        assert consumer.committed([tp]) == {tp: OffsetAndMetadata(1)}
        assert consumer.end_offsets([tp]) == {tp: 1}
        freezer.freeze()
    finally:
        started = time.monotonic()
        consumer.close(timeout=1.0)  # auto-commit and LeaveGroup cannot finish: give up in time
        assert time.monotonic() - started < 2.5


def test_async_consumer_close_keeps_its_timeout_while_the_broker_hangs(
    bootstrap: str, freezer: Freezer
) -> None:
    topic = new_topic(bootstrap, "async-hang")
    write(bootstrap, topic, [b"x"])
    tp = TopicPartition(topic, 0)

    async def scenario() -> float:
        consumer = AsyncConsumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": unique("async-hang"),
                "auto.offset.reset": "earliest",
                "fetch.max.wait.ms": 100,
                "allow.auto.create.topics": False,
            }
        )
        consumer.subscribe([topic])
        async with asyncio.timeout(TIMEOUT):
            while not await consumer.poll(0.2):
                pass
        freezer.freeze()
        with pytest.raises(KafkaTimeoutError):
            await consumer.committed([tp], timeout=0.5)
        started = time.monotonic()
        await consumer.close(timeout=1.0)
        return time.monotonic() - started

    assert asyncio.run(scenario()) < 2.5


def test_a_consumer_started_before_its_broker_waits_for_it(
    running_broker: BrokerProcess, consumers: list[Consumer]
) -> None:
    bootstrap = running_broker.bootstrap
    topic = new_topic(bootstrap, "early")
    write(bootstrap, topic, [b"a", b"b"])
    running_broker.stop()
    consumer = strom_consumer(bootstrap, **{"group.id": unique("early"), "reconnect.backoff.max.ms": 200})
    consumers.append(consumer)
    consumer.subscribe([topic])
    assert consumer.poll(0.5) == []
    running_broker.start()
    assert [r.value for r in read(consumer, 2)] == [b"a", b"b"]


def test_a_broker_restart_redelivers_at_most_the_uncommitted_records(
    running_broker: BrokerProcess, consumers: list[Consumer]
) -> None:
    bootstrap = running_broker.bootstrap
    topic = new_topic(bootstrap, "restart", partitions=2)
    for partition in (0, 1):
        write(bootstrap, topic, [b"%d-%d" % (partition, i) for i in range(10)], partition)
    consumer = strom_consumer(
        bootstrap,
        **{"group.id": unique("restart"), "enable.auto.commit": False, "reconnect.backoff.max.ms": 200},
    )
    consumers.append(consumer)
    consumer.subscribe([topic])
    read(consumer, 20)
    tps = [TopicPartition(topic, p) for p in (0, 1)]
    consumer.commit_sync({tps[0]: 5, tps[1]: 7})
    running_broker.restart()
    for partition in (0, 1):
        write(bootstrap, topic, [b"%d-%d" % (partition, i) for i in range(10, 15)], partition)
    after: list[ConsumerRecord] = []
    deadline = time.monotonic() + 30
    while not {(0, 14), (1, 14)} <= {(r.partition, r.offset) for r in after}:
        assert time.monotonic() < deadline, sorted((r.partition, r.offset) for r in after)
        after += consumer.poll(0.2)
    for partition, committed in ((0, 5), (1, 7)):
        offsets = [r.offset for r in after if r.partition == partition]
        # Either the member kept its positions, or it rejoined and went back to the commit:
        # never further back, and nothing skipped.
        assert offsets in (list(range(10, 15)), list(range(committed, 15))), (partition, offsets)
