"""The producer's record accumulator: batching, readiness, buffer memory, draining, futures, sequences."""

from __future__ import annotations

import asyncio
import functools
import random
import threading
import time
from collections import Counter
from typing import Any

import pytest

from strom.client.cluster import Cluster, PartitionMetadata, TopicMetadata
from strom.client.errors import KafkaException, KafkaTimeoutError
from strom.client.producer.accumulator import (
    FutureRecordMetadata,
    ProducerBatch,
    RecordAccumulator,
    RecordMetadata,
    TopicExpiredError,
    TopicState,
)
from strom.client.producer.idempotence import IdempotenceManager
from strom.client.producer.metadata import ProducerMetadata
from strom.client.producer.partitioner import StickyPartitioner
from strom.client.producer.producer import AsyncFutureRecordMetadata
from strom.network.pool import Node
from strom.protocol.errors import ErrorCode
from strom.records.batch import HEADER_SIZE, CompressionType
from strom.records.codec import decode_batches

LEADER = 1
VALUE = b"v" * 100


def make_accumulator(**overrides: Any) -> RecordAccumulator:
    settings: dict[str, Any] = {
        "batch_size": 1000,
        "buffer_memory": 100_000,
        "linger": 0.05,
        "delivery_timeout": 10.0,
        "retry_backoff": 0.1,
        "retry_backoff_max": 1.0,
    }
    settings.update(overrides)
    return RecordAccumulator(**settings)


def make_topic(accumulator: RecordAccumulator, partitions: int = 1, name: str = "t") -> TopicState:
    state = accumulator.topic_state(name)
    state.update([LEADER] * partitions, [LEADER])
    return state


def append(
    accumulator: RecordAccumulator,
    topic: TopicState,
    partition: int = 0,
    value: bytes | None = VALUE,
    *,
    key: bytes | None = None,
    timestamp: int = 1_700_000_000_000,
    headers: list[tuple[str, bytes | None]] | None = None,
    callback: Any = None,
    max_block: float | None = 0.0,
) -> Any:  # a FutureRecordMetadata, or what the accumulator's future_factory makes
    future = accumulator.append(topic, partition, timestamp, key, value, headers, callback, max_block)
    assert future is not None
    return future


def test_a_batch_waits_for_linger_then_becomes_ready() -> None:
    accumulator = make_accumulator(linger=0.05)
    topic = make_topic(accumulator)
    append(accumulator, topic)
    created = topic.queues[0].batches[0].created
    early = accumulator.ready(created + 0.01)
    assert early.nodes == set()
    assert early.next_ready_check == pytest.approx(0.04)
    assert accumulator.ready(created + 0.051).nodes == {LEADER}


def test_a_full_batch_is_ready_at_once_and_the_next_record_starts_a_new_batch() -> None:
    accumulator = make_accumulator(linger=60.0)
    topic = make_topic(accumulator)
    while len(topic.queues[0].batches) < 2:
        append(accumulator, topic)
    first, second = topic.queues[0].batches
    assert first.size + 107 > first.limit >= first.size  # it took records until the next did not fit
    assert second.record_count == 1
    assert accumulator.ready(time.monotonic()).nodes == {LEADER}


def test_flush_close_and_memory_shortage_make_every_batch_ready() -> None:
    accumulator = make_accumulator(linger=60.0)
    topic = make_topic(accumulator)
    append(accumulator, topic)
    now = time.monotonic()
    assert accumulator.ready(now).nodes == set()
    accumulator.begin_flush()
    assert accumulator.ready(now).nodes == {LEADER}
    accumulator.end_flush()
    assert accumulator.ready(now).nodes == set()
    accumulator.close()
    assert accumulator.ready(now).nodes == {LEADER}
    with pytest.raises(KafkaException, match="closed"):
        append(accumulator, topic)


def test_a_partition_without_leader_is_reported_not_ready() -> None:
    accumulator = make_accumulator(linger=0.0)
    topic = accumulator.topic_state("t")
    topic.update([-1], [LEADER])
    append(accumulator, topic)
    result = accumulator.ready(time.monotonic() + 1)
    assert result.nodes == set()
    assert result.unknown_leader_topics == {"t"}


def test_batches_reserve_batch_size_bytes_of_buffer_memory_until_completed() -> None:
    accumulator = make_accumulator(batch_size=1000, buffer_memory=10_000)
    topic = make_topic(accumulator, partitions=2)
    append(accumulator, topic, 0)
    append(accumulator, topic, 0)  # same batch: no new reservation
    append(accumulator, topic, 1)
    assert accumulator.free_memory == 8000
    big = append(accumulator, topic, 1, b"x" * 3000)  # larger than batch.size: reserves its own size
    assert accumulator.free_memory == 8000 - (HEADER_SIZE + 21 + 3000)
    batches = [batch for queue in topic.queues for batch in queue.batches]
    for batch in batches:
        batch.done(0, -1, None)
        accumulator.deallocate(batch)
    assert accumulator.free_memory == 10_000
    assert accumulator.incomplete == {}
    assert big.get(0).offset == 0


def test_send_blocks_while_buffer_memory_is_exhausted_and_resumes_on_release() -> None:
    accumulator = make_accumulator(batch_size=1000, buffer_memory=2000)
    topic = make_topic(accumulator, partitions=3)
    append(accumulator, topic, 0)
    append(accumulator, topic, 1)
    blocked: dict[str, Any] = {}

    def send() -> None:
        started = time.monotonic()
        blocked["future"] = append(accumulator, topic, 2, max_block=5.0)
        blocked["waited"] = time.monotonic() - started

    thread = threading.Thread(target=send)
    thread.start()
    time.sleep(0.2)
    assert thread.is_alive()
    # A sender that looks now finds every batch ready: someone waits for memory.
    assert accumulator.ready(time.monotonic()).nodes == {LEADER}
    batch = topic.queues[0].batches.popleft()
    batch.done(0, -1, None)
    accumulator.deallocate(batch)
    thread.join(5)
    assert not thread.is_alive()
    assert blocked["waited"] >= 0.2
    assert blocked["future"] is not None


def test_send_raises_kafka_timeout_after_max_block_without_memory() -> None:
    accumulator = make_accumulator(batch_size=1000, buffer_memory=1500)
    topic = make_topic(accumulator, partitions=2)
    append(accumulator, topic, 0)
    started = time.monotonic()
    with pytest.raises(KafkaTimeoutError, match=r"max\.block\.ms"):
        append(accumulator, topic, 1, max_block=0.3)
    assert 0.25 <= time.monotonic() - started < 2.0
    # The async face asks not to wait: None, nothing reserved.
    assert accumulator.append(topic, 1, 0, None, VALUE, None, None, None) is None
    assert accumulator.free_memory == 500


def test_drain_takes_one_batch_per_partition_within_max_request_size_and_rotates() -> None:
    accumulator = make_accumulator(linger=0.0)
    topic = make_topic(accumulator, partitions=3)
    for partition in range(3):
        for _ in range(12):  # two batches per partition
            append(accumulator, topic, partition)
    now = time.monotonic()
    everything = accumulator.drain([LEADER], 1 << 20, now)[LEADER]
    assert [batch.tp.partition for batch in everything] == [0, 1, 2]
    # A request too small for two batches still carries one, and the next drain starts further on.
    assert [b.tp.partition for b in accumulator.drain([LEADER], 100, now)[LEADER]] == [0]
    assert [b.tp.partition for b in accumulator.drain([LEADER], 100, now)[LEADER]] == [1]
    assert [b.tp.partition for b in accumulator.drain([LEADER], 1 << 20, now)[LEADER]] == [2]
    assert accumulator.drain([LEADER], 1 << 20, now) == {}


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_drained_batches_hold_the_records_as_appended(codec: str) -> None:
    accumulator = make_accumulator(linger=0.0, compression=CompressionType.NAMES[codec], batch_size=100_000)
    topic = make_topic(accumulator)
    sent: list[tuple[bytes | None, bytes | None, int, list[tuple[str, bytes | None]] | None]] = [
        (b"k1", b"value-1", 1000, None),
        (None, b"value-2", 999, [("h", b"1"), ("null", None)]),
        (b"k3", None, 5000, None),
        (b"", b"", 1001, [("", b"")]),
    ]
    for key, value, timestamp, headers in sent:
        append(accumulator, topic, key=key, value=value, timestamp=timestamp, headers=headers)
    (batch,) = accumulator.drain([LEADER], 1 << 20, time.monotonic())[LEADER]
    assert batch.built is not None
    (decoded,) = decode_batches(bytes(batch.built))
    assert decoded.header.compression == CompressionType.NAMES[codec]
    assert decoded.header.max_timestamp == 5000
    assert [(r.offset, r.key, r.value, r.timestamp, r.headers) for r in decoded.records] == [
        (i, key, value, timestamp, tuple(headers or ())) for i, (key, value, timestamp, headers) in enumerate(sent)
    ]


def test_futures_share_their_batch_result_and_callbacks_run_in_order() -> None:
    accumulator = make_accumulator()
    topic = make_topic(accumulator)
    calls: list[tuple[RecordMetadata | None, Exception | None]] = []
    futures = [
        append(accumulator, topic, key=b"k" if i == 1 else None, timestamp=100 + i, callback=lambda m, e: calls.append((m, e)))
        for i in range(3)
    ]
    assert all(isinstance(future, FutureRecordMetadata) for future in futures)
    assert not futures[0].done()
    with pytest.raises(KafkaTimeoutError):
        futures[0].get(timeout=0.01)
    (batch,) = topic.queues[0].batches
    assert batch.done(40, -1, None)
    assert not batch.done(41, -1, None)  # a batch completes once
    assert [f.get(0) for f in futures] == [
        RecordMetadata("t", 0, 40, 100, -1, 100),
        RecordMetadata("t", 0, 41, 101, 1, 100),
        RecordMetadata("t", 0, 42, 102, -1, 100),
    ]
    assert calls == [(f.get(0), None) for f in futures]
    late: list[Any] = []
    futures[2].add_callback(lambda m, e: late.append(m.offset if m else e))
    assert late == [42]


def test_a_failed_batch_fails_every_record_and_log_append_time_replaces_the_timestamp() -> None:
    accumulator = make_accumulator()
    topic = make_topic(accumulator, partitions=2)
    failed = append(accumulator, topic, 0)
    stamped = append(accumulator, topic, 1, timestamp=5)
    error = KafkaException.from_code(ErrorCode.message_too_large, "produce")
    topic.queues[0].batches[0].done(-1, -1, error)
    topic.queues[1].batches[0].done(7, 123456, None)
    assert failed.exception(0) is error
    with pytest.raises(KafkaException, match="MESSAGE_TOO_LARGE"):
        failed.get(0)
    assert stamped.get(0).timestamp == 123456


def test_batches_expire_after_delivery_timeout() -> None:
    accumulator = make_accumulator(delivery_timeout=0.5)
    topic = make_topic(accumulator, partitions=2)
    append(accumulator, topic, 0)
    append(accumulator, topic, 1)
    created = topic.queues[0].batches[0].created
    assert accumulator.expired_batches(created + 0.4) == []
    expired = accumulator.expired_batches(created + 0.6)
    assert sorted(batch.tp.partition for batch in expired) == [0, 1]
    assert all(not queue.batches for queue in topic.queues)


def test_keyless_records_spread_evenly_over_partitions_in_batch_size_runs() -> None:
    accumulator = make_accumulator(batch_size=2000, buffer_memory=10**9, linger=60.0)
    topic = accumulator.topic_state("t")
    # A seeded draw: the spread of a random walk must not make the test fail one run in a hundred.
    topic.partitioner = StickyPartitioner(2000, random.Random(20261122))
    topic.update([LEADER] * 4, [LEADER])
    for _ in range(20_000):
        append(accumulator, topic, -1)
    per_partition = Counter({q.tp.partition: sum(b.record_count for b in q.batches) for q in topic.queues})
    assert all(abs(count - 5000) < 750 for count in per_partition.values()), per_partition
    # Switching away leaves a partition's batch open for the next visit: only its last batch is partial.
    for queue in topic.queues:
        assert all(batch.size + 107 > batch.limit for batch in list(queue.batches)[:-1])


# -- idempotence: sequences assigned on drain, kept in order on retry -----------------------


def idempotent_accumulator() -> tuple[RecordAccumulator, TopicState, IdempotenceManager]:
    accumulator = make_accumulator(linger=0.0)
    idempotence = IdempotenceManager()
    accumulator.idempotence = idempotence
    topic = make_topic(accumulator)
    return accumulator, topic, idempotence


def drain_one(accumulator: RecordAccumulator) -> ProducerBatch | None:
    drained = accumulator.drain([LEADER], 1 << 20, time.monotonic() + 10)
    return drained[LEADER][0] if drained else None


def test_nothing_drains_before_the_producer_id_is_known() -> None:
    accumulator, topic, idempotence = idempotent_accumulator()
    append(accumulator, topic)
    assert drain_one(accumulator) is None
    idempotence.set_producer_id_and_epoch(7, 0)
    batch = drain_one(accumulator)
    assert batch is not None and (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (7, 0, 0)
    assert batch.built is not None
    assert decode_batches(bytes(batch.built))[0].header.producer_id == 7


def test_sequences_follow_record_counts_and_retries_go_back_in_sequence_order() -> None:
    accumulator, topic, idempotence = idempotent_accumulator()
    idempotence.set_producer_id_and_epoch(7, 0)
    batches = []
    for records in (3, 2, 4):
        for _ in range(records):
            append(accumulator, topic)
        batch = drain_one(accumulator)
        assert batch is not None
        batches.append(batch)
    assert [b.base_sequence for b in batches] == [0, 3, 5]
    append(accumulator, topic)  # a fresh batch, not yet sequenced
    # The first two fail retriably, their responses arriving in reverse order.
    accumulator.reenqueue(batches[1], time.monotonic())
    accumulator.reenqueue(batches[0], time.monotonic())
    queue = list(topic.queues[0].batches)
    assert [b.base_sequence for b in queue] == [0, 3, -1]
    # Only the first batch in flight may go: one retried batch at a time, in order.
    assert drain_one(accumulator) is batches[0]
    assert drain_one(accumulator) is None  # sequence 3 waits until sequence 0 completes
    idempotence.handle_completed_batch(batches[0])
    assert drain_one(accumulator) is batches[1]


def test_out_of_order_sequence_for_the_next_expected_batch_bumps_the_epoch_and_resets_sequences() -> None:
    accumulator, topic, idempotence = idempotent_accumulator()
    idempotence.set_producer_id_and_epoch(7, 0)
    batches = []
    for _ in range(2):
        append(accumulator, topic)
        batch = drain_one(accumulator)
        assert batch is not None
        batches.append(batch)
    # A later batch rejected because an earlier one is missing: retried, no bump.
    assert idempotence.can_retry(ErrorCode.out_of_order_sequence_number, 0, batches[1])
    assert not idempotence.epoch_bump_required
    # The next batch the broker expects, rejected: a real gap, so the epoch is bumped.
    assert idempotence.can_retry(ErrorCode.out_of_order_sequence_number, 0, batches[0])
    assert idempotence.epoch_bump_required
    idempotence.bump_epoch_if_needed()
    assert idempotence.producer_epoch == 1
    assert [(b.producer_epoch, b.base_sequence, b.sequence_reset) for b in batches] == [(1, 0, True), (1, 1, True)]
    built = batches[0].close(CompressionType.NONE, None)
    header = decode_batches(bytes(built))[0].header
    assert (header.producer_epoch, header.base_sequence) == (1, 0)


def test_duplicate_and_fatal_errors_in_sequence_bookkeeping() -> None:
    accumulator, topic, idempotence = idempotent_accumulator()
    idempotence.set_producer_id_and_epoch(7, 0)
    append(accumulator, topic)
    batch = drain_one(accumulator)
    assert batch is not None
    assert idempotence.can_retry(ErrorCode.not_leader_or_follower, 0, batch)
    assert not idempotence.can_retry(ErrorCode.message_too_large, 0, batch)
    # A batch refused for good after it had a sequence: later sequences restart in a new epoch.
    idempotence.handle_failed_batch(batch, ErrorCode.message_too_large, adjust_sequences=True)
    assert idempotence.epoch_bump_required
    # UNKNOWN_PRODUCER_ID with the log start past what was acknowledged: retried under a new epoch.
    append(accumulator, topic)
    idempotence.bump_epoch_if_needed()
    retried = drain_one(accumulator)
    assert retried is not None and (retried.producer_epoch, retried.base_sequence) == (1, 0)
    assert idempotence.can_retry(ErrorCode.unknown_producer_id, 50, retried)
    assert idempotence.epoch_bump_required


# ---------------------------------------------------------------- completion: metadata built when asked for


def test_callbacks_and_futures_of_split_batch_parts_see_their_own_offsets() -> None:
    accumulator = make_accumulator(batch_size=2000)
    topic = make_topic(accumulator)
    calls: list[tuple[int, RecordMetadata | None, Exception | None]] = []
    futures = [
        append(
            accumulator,
            topic,
            key=b"k" * (i % 3),
            timestamp=1000 + i,
            callback=lambda m, e, i=i: calls.append((i, m, e)),
        )
        for i in range(12)
    ]
    batch = drain_one(accumulator)
    assert batch is not None and batch.record_count == 12
    parts = accumulator.split_and_reenqueue(batch)
    assert len(parts) > 2 and list(topic.queues[0].batches) == parts
    # Each part is sent on its own; the second is refused again and split once more, its
    # records' positions staying relative to the first batch.
    base = 500
    pieces: list[ProducerBatch] = []
    while (piece := drain_one(accumulator)) is not None:
        if piece is parts[1]:
            assert len(accumulator.split_and_reenqueue(piece)) > 1
            continue
        pieces.append(piece)
        piece.done(base, -1, None)
        base += piece.record_count + 10  # a gap: each part's offsets come from its own response
    assert len(pieces) > len(parts) and sum(p.record_count for p in pieces) == 12
    expected: list[RecordMetadata] = []
    base = 500
    for piece in pieces:
        for n in range(piece.record_count):
            i = len(expected)
            expected.append(RecordMetadata("t", 0, base + n, 1000 + i, i % 3, 100))
        base += piece.record_count + 10
    assert [future.get(0) for future in futures] == expected
    assert calls == [(i, metadata, None) for i, metadata in enumerate(expected)]


def test_callbacks_get_log_append_time_unknown_offsets_and_errors() -> None:
    accumulator = make_accumulator()
    topic = make_topic(accumulator, partitions=3)
    calls: list[tuple[int, RecordMetadata | None, Exception | None]] = []

    def record(partition: int) -> Any:
        return lambda m, e: calls.append((partition, m, e))

    futures = [append(accumulator, topic, p, value=None, timestamp=7, callback=record(p)) for p in range(3)]
    error = KafkaException.from_code(ErrorCode.not_leader_or_follower, "produce")
    topic.queues[0].batches[0].done(10, 123, None)  # LogAppendTime
    topic.queues[1].batches[0].done(-1, -1, None)  # acks=0: no offset
    topic.queues[2].batches[0].done(-1, -1, error)
    assert calls == [
        (0, RecordMetadata("t", 0, 10, 123, -1, -1), None),
        (1, RecordMetadata("t", 1, -1, 7, -1, -1), None),
        (2, None, error),
    ]
    assert [f.get(0) for f in futures[:2]] == [calls[0][1], calls[1][1]]
    assert futures[2].exception(0) is error


def test_a_raising_callback_does_not_stop_the_others() -> None:
    accumulator = make_accumulator()
    topic = make_topic(accumulator)
    seen: list[int] = []

    def failing(_m: Any, _e: Any) -> None:
        raise RuntimeError("user code")

    append(accumulator, topic, callback=failing)
    append(accumulator, topic, callback=lambda m, e: seen.append(m.offset))
    topic.queues[0].batches[0].done(3, -1, None)
    assert seen == [4]


def test_the_synchronous_producer_yields_the_gil_once_per_new_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr(time, "sleep", sleeps.append)
    accumulator = make_accumulator(batch_size=1000)
    topic = make_topic(accumulator)
    for _ in range(20):
        append(accumulator, topic)
    assert sleeps == []  # the async face runs on the loop: nobody to yield to
    before = len(topic.queues[0].batches)
    accumulator.yield_gil = True
    for _ in range(20):
        append(accumulator, topic)
    # 8 records fit a 1000-byte batch: records 1, 9, 17, 25 and 33 started one.
    assert (before, len(topic.queues[0].batches)) == (3, 5)
    assert sleeps == [0, 0]


# ---------------------------------------------------------------- the async face's futures


def async_accumulator(loop: asyncio.AbstractEventLoop) -> tuple[RecordAccumulator, TopicState]:
    accumulator = make_accumulator()
    accumulator.future_factory = functools.partial(AsyncFutureRecordMetadata, loop)
    return accumulator, make_topic(accumulator, partitions=2)


def async_append(accumulator: RecordAccumulator, topic: TopicState, partition: int = 0) -> AsyncFutureRecordMetadata:
    future = append(accumulator, topic, partition, timestamp=5)
    assert isinstance(future, AsyncFutureRecordMetadata)
    return future


def test_async_record_futures_follow_the_asyncio_future_protocol() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        accumulator, topic = async_accumulator(loop)
        futures = [async_append(accumulator, topic) for _ in range(3)]
        failed = async_append(accumulator, topic, 1)
        assert asyncio.isfuture(futures[0]) and futures[0].get_loop() is loop
        assert not futures[0].done()
        with pytest.raises(asyncio.InvalidStateError):
            futures[0].result()
        seen: list[Any] = []
        futures[1].add_done_callback(seen.append)
        removed: list[Any] = []
        futures[1].add_done_callback(removed.append)
        assert futures[1].remove_done_callback(removed.append) == 1
        gathered = asyncio.gather(*futures)
        waited = asyncio.ensure_future(asyncio.wait_for(failed, 5))
        await asyncio.sleep(0)
        error = KafkaException.from_code(ErrorCode.message_too_large, "produce")
        topic.queues[0].batches[0].done(20, -1, None)
        topic.queues[1].batches[0].done(-1, -1, error)
        assert futures[0].done() and futures[0].result() == RecordMetadata("t", 0, 20, 5, -1, 100)
        assert [m.offset for m in await gathered] == [20, 21, 22]
        assert seen == [futures[1]] and removed == []  # callbacks get the record's future itself
        with pytest.raises(KafkaException, match="MESSAGE_TOO_LARGE"):
            await waited
        assert failed.exception() is error
        # Awaited (or asked for) after completion: answered at once.
        assert (await futures[2]).offset == 22
        late: list[Any] = []
        futures[0].add_done_callback(late.append)
        await asyncio.sleep(0)
        assert late == [futures[0]]

    asyncio.run(run())


def test_cancelling_an_async_record_future_cancels_only_that_wait() -> None:
    async def run() -> None:
        accumulator, topic = async_accumulator(asyncio.get_running_loop())
        first, second = async_append(accumulator, topic), async_append(accumulator, topic)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(first, 0.01)  # cancels `first` on timeout
        assert first.cancelled() and first.done()
        with pytest.raises(asyncio.CancelledError):
            first.result()
        waiting = asyncio.ensure_future(second)
        await asyncio.sleep(0)
        topic.queues[0].batches[0].done(0, -1, None)
        assert (await waiting).offset == 1  # the batch and its other records are unaffected
        assert not second.cancel()  # a completed record cannot be cancelled

    asyncio.run(run())


# ---------------------------------------------------------------- metadata.max.idle.ms


def test_idle_topics_expire_unless_they_hold_records_or_are_kept() -> None:
    accumulator = make_accumulator()
    idle, queued, in_flight, kept = (make_topic(accumulator, name=name) for name in ("idle", "queued", "flight", "kept"))
    busy = make_topic(accumulator, name="busy")
    append(accumulator, queued)
    append(accumulator, in_flight)
    assert drain_one(accumulator) is not None  # one of the two leaves its queue; the other stays queued
    for state in (idle, queued, in_flight, kept, busy):
        state.last_used -= 10
    append(accumulator, busy)  # a new batch marks the topic used
    drained = accumulator.drain([LEADER], 1 << 20, time.monotonic() + 10)
    assert {batch.tp.topic for batch in drained.get(LEADER, [])} <= {"queued", "flight", "busy"}
    assert accumulator.expire_idle_topics(5.0, keep=["kept"]) == ["idle"]
    assert idle.expired and not kept.expired
    assert set(accumulator.topics) == {"queued", "flight", "kept", "busy"}
    assert accumulator.expire_idle_topics(60.0) == []


def test_an_append_to_an_expired_topic_is_refused_and_a_fresh_state_takes_records() -> None:
    accumulator = make_accumulator()
    topic = make_topic(accumulator)
    topic.last_used -= 10
    assert accumulator.expire_idle_topics(5.0) == ["t"]
    with pytest.raises(TopicExpiredError):
        append(accumulator, topic)
    assert "t" not in accumulator.topics and not accumulator.incomplete
    fresh = make_topic(accumulator)
    assert fresh is not topic
    append(accumulator, fresh)
    assert len(fresh.queues[0].batches) == 1


class FakeMetadataClient:
    """Answers every Metadata request with one single-partition topic per name asked for."""

    retry_backoff = 0.01

    def __init__(self) -> None:
        self.requests: list[list[str]] = []

    async def refresh_metadata(self, topics: list[str], allow_auto_create: bool = True) -> Cluster:
        self.requests.append(sorted(topics))
        partition = functools.partial(PartitionMetadata, leader=LEADER, leader_epoch=0, replicas=(LEADER,))
        return Cluster(
            brokers={LEADER: Node(LEADER, "localhost", 9092, None)},
            topics={
                name: TopicMetadata(
                    name,
                    None,
                    False,
                    ErrorCode.none,
                    {0: partition(topic=name, partition=0, isr=(LEADER,), offline_replicas=(), error=ErrorCode.none)},
                )
                for name in topics
            },
        )


def test_the_producer_stops_asking_for_metadata_of_topics_idle_for_max_idle() -> None:
    async def run() -> None:
        accumulator = make_accumulator()
        client = FakeMetadataClient()
        metadata = ProducerMetadata(
            client,  # type: ignore[arg-type]  # the part of NetworkClient that ProducerMetadata uses
            accumulator,
            max_age=300.0,
            max_idle=5.0,
            allow_auto_create=True,
            on_update=lambda: None,
        )
        used = await metadata.wait_for_topic("used", None, 1.0)
        idle = await metadata.wait_for_topic("idle", None, 1.0)
        assert client.requests == [["used"], ["idle", "used"]]
        idle.last_used -= 10
        used.last_used -= 10
        append(accumulator, used)  # sent to just now
        await metadata.refresh()
        assert client.requests[-1] == ["used"]
        assert idle.expired and "idle" not in accumulator.topics
        # A send to it again waits for its metadata, as for a new topic.
        again = await metadata.wait_for_topic("idle", None, 1.0)
        assert again is not idle and again.num_partitions == 1
        assert client.requests[-1] == ["idle", "used"]

    asyncio.run(run())
