"""KIP-227 fetch sessions: the broker's cache and contexts, and the fetcher's session handler."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

from strom.broker.fetch_session import (
    EVICTION_MS,
    FINAL_EPOCH,
    INITIAL_EPOCH,
    INVALID_SESSION_ID,
    FetchSessionCache,
    PartitionKey,
    RequestedPartition,
    next_epoch,
)
from strom.broker.partition import TopicPartition
from strom.broker.replica_manager import FetchResult
from strom.network.fetch_session_handler import FetchSessionHandler
from strom.protocol.errors import ErrorCode

FOO = uuid.uuid4()


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def req(partition: int, offset: int = 0, topic: uuid.UUID | str = FOO) -> RequestedPartition:
    return RequestedPartition((topic, partition), offset, 1 << 20)


def answer(hw: int = 10, records: bytes = b"", error: ErrorCode = ErrorCode.none) -> FetchResult:
    return FetchResult(error, high_watermark=hw, last_stable_offset=hw, log_start_offset=0, records=records)


def open_session(
    cache: FetchSessionCache, partitions: list[RequestedPartition], privileged: bool = False
) -> int:
    context = cache.new_context(
        INVALID_SESSION_ID, INITIAL_EPOCH, partitions, [], uses_topic_ids=True, privileged=privileged
    )
    error, session_id, keys = context.respond({p.key: answer() for p in partitions})
    assert error == ErrorCode.none and keys == [p.key for p in partitions]
    return session_id


def test_epochs_wrap_to_one_and_final_stays_final() -> None:
    assert next_epoch(INITIAL_EPOCH) == 1
    assert next_epoch(0x7FFFFFFF) == 1
    assert next_epoch(FINAL_EPOCH) == FINAL_EPOCH


def test_a_sessionless_fetch_answers_every_partition_and_makes_no_session() -> None:
    cache = FetchSessionCache(10)
    partitions = [req(0), req(1)]
    context = cache.new_context(
        INVALID_SESSION_ID, FINAL_EPOCH, partitions, [], uses_topic_ids=True, privileged=False
    )
    assert context.respond({p.key: answer() for p in partitions}) == (
        ErrorCode.none,
        INVALID_SESSION_ID,
        [(FOO, 0), (FOO, 1)],
    )
    assert len(cache) == 0


def test_incremental_fetches_answer_only_changed_partitions() -> None:
    cache = FetchSessionCache(10)
    session_id = open_session(cache, [req(0), req(1), req(2)])
    assert session_id != INVALID_SESSION_ID

    # Epoch 1 lists nothing: the session's partitions are read; nothing changed.
    context = cache.new_context(session_id, 1, [], [], uses_topic_ids=True, privileged=False)
    assert [p.key for p in context.partitions] == [(FOO, 0), (FOO, 1), (FOO, 2)]
    results: dict[PartitionKey, FetchResult] = {p.key: answer() for p in context.partitions}
    assert context.respond(results) == (ErrorCode.none, session_id, [])

    # Records on 1, a new high watermark on 2: those two, and they move to the end of the session.
    context = cache.new_context(session_id, 2, [], [], uses_topic_ids=True, privileged=False)
    results = {(FOO, 0): answer(), (FOO, 1): answer(records=b"x"), (FOO, 2): answer(hw=11)}
    assert context.respond(results) == (ErrorCode.none, session_id, [(FOO, 1), (FOO, 2)])
    context = cache.new_context(session_id, 3, [], [], uses_topic_ids=True, privileged=False)
    assert [p.key for p in context.partitions] == [(FOO, 0), (FOO, 1), (FOO, 2)]
    # The new high watermark was delivered: not again. An error is always answered, and once it
    # clears the partition comes back even with the old high watermark.
    results = {
        (FOO, 0): answer(error=ErrorCode.not_leader_or_follower),
        (FOO, 1): answer(),
        (FOO, 2): answer(hw=11),
    }
    assert context.respond(results)[2] == [(FOO, 0)]
    context = cache.new_context(session_id, 4, [], [], uses_topic_ids=True, privileged=False)
    results = {(FOO, 0): answer(), (FOO, 1): answer(), (FOO, 2): answer(hw=11)}
    assert context.respond(results)[2] == [(FOO, 0)]


def test_incremental_fetches_update_add_and_forget_partitions() -> None:
    cache = FetchSessionCache(10)
    session_id = open_session(cache, [req(0), req(1)])
    context = cache.new_context(
        session_id, 1, [req(1, offset=7), req(5)], [(FOO, 0)], uses_topic_ids=True, privileged=False
    )
    assert [(p.key, p.fetch_offset) for p in context.partitions] == [((FOO, 1), 7), ((FOO, 5), 0)]
    # A new partition has no answer yet: it is answered.
    results = {(FOO, 1): answer(), (FOO, 5): answer()}
    assert context.respond(results)[2] == [(FOO, 5)]
    # Forgetting the last partitions ends the session: the fetch is answered without one.
    context = cache.new_context(
        session_id, 2, [], [(FOO, 1), (FOO, 5)], uses_topic_ids=True, privileged=False
    )
    assert context.respond({}) == (ErrorCode.none, INVALID_SESSION_ID, [])
    assert cache.get(session_id) is None


def test_session_errors() -> None:
    cache = FetchSessionCache(10)
    session_id = open_session(cache, [req(0)])
    unknown = cache.new_context(session_id + 1, 1, [], [], uses_topic_ids=True, privileged=False)
    assert unknown.respond({}) == (ErrorCode.fetch_session_id_not_found, INVALID_SESSION_ID, [])
    stale = cache.new_context(session_id, 2, [], [], uses_topic_ids=True, privileged=False)
    assert stale.respond({})[0] == ErrorCode.invalid_fetch_session_epoch
    by_name = cache.new_context(session_id, 1, [], [], uses_topic_ids=False, privileged=False)
    assert by_name.respond({})[0] == ErrorCode.fetch_session_topic_id_error
    # Two fetches of one epoch: the one answered second lost its epoch to the first.
    first = cache.new_context(session_id, 1, [], [], uses_topic_ids=True, privileged=False)
    second = cache.new_context(session_id, 2, [], [], uses_topic_ids=True, privileged=False)
    assert second.respond({(FOO, 0): answer()})[0] == ErrorCode.none
    assert first.respond({(FOO, 0): answer()}) == (ErrorCode.invalid_fetch_session_epoch, session_id, [])


def test_a_full_fetch_closes_the_session_it_names() -> None:
    cache = FetchSessionCache(10)
    session_id = open_session(cache, [req(0)])
    context = cache.new_context(
        session_id, INITIAL_EPOCH, [req(0)], [], uses_topic_ids=True, privileged=False
    )
    new_id = context.respond({(FOO, 0): answer()})[1]
    assert cache.get(session_id) is None and cache.get(new_id) is not None
    context = cache.new_context(new_id, FINAL_EPOCH, [req(0)], [], uses_topic_ids=True, privileged=False)
    assert context.respond({(FOO, 0): answer()})[1] == INVALID_SESSION_ID
    assert len(cache) == 0


def test_no_slots_no_sessions() -> None:
    assert open_session(FetchSessionCache(0), [req(0)]) == INVALID_SESSION_ID


def test_eviction_follows_kafka() -> None:
    clock = Clock()
    cache = FetchSessionCache(2, clock=clock)
    small = open_session(cache, [req(0)])
    clock.now += 1
    large = open_session(cache, [req(0), req(1), req(2)])
    clock.now += 1
    # Full, nothing stale, both young: a consumer's session cannot take a slot...
    assert open_session(cache, [req(0), req(1), req(2), req(3)]) == INVALID_SESSION_ID
    # ...a follower's can, from the smallest consumer session.
    follower = open_session(cache, [req(0)], privileged=True)
    assert follower != INVALID_SESSION_ID and cache.get(small) is None and cache.get(large) is not None
    second = open_session(cache, [req(0)], privileged=True)
    assert cache.get(large) is None
    # Young followers' sessions are safe from consumers and from followers with as many partitions.
    assert open_session(cache, [req(0)], privileged=True) == INVALID_SESSION_ID
    assert open_session(cache, [req(p) for p in range(9)]) == INVALID_SESSION_ID
    # Used after two minutes of life, a session is evictable by a larger one of its kind or above.
    clock.now += EVICTION_MS + 1
    for session_id in (follower, second):
        context = cache.new_context(session_id, 1, [], [], uses_topic_ids=True, privileged=True)
        context.respond({(FOO, 0): answer()})
    assert open_session(cache, [req(p) for p in range(9)]) == INVALID_SESSION_ID
    bigger = open_session(cache, [req(0), req(1)], privileged=True)
    assert cache.get(bigger) is not None and len(cache) == 2
    # Unused for two minutes: stale, evictable by anyone.
    clock.now += EVICTION_MS + 1
    assert open_session(cache, [req(0)]) != INVALID_SESSION_ID
    assert cache.evictions == 4


def test_handler_sends_everything_first_then_only_changes() -> None:
    handler: FetchSessionHandler[str, int] = FetchSessionHandler()
    first = handler.build({"a": 0, "b": 0})
    assert (first.session_id, first.epoch, first.to_send, first.to_forget) == (0, 0, {"a": 0, "b": 0}, [])
    assert handler.handle_response(first, ErrorCode.none, 42)
    second = handler.build({"a": 5, "b": 0, "c": 0})
    assert (second.session_id, second.epoch, second.to_send, second.to_forget) == (
        42,
        1,
        {"a": 5, "c": 0},
        [],
    )
    assert handler.handle_response(second, ErrorCode.none, 42)
    third = handler.build({"a": 5})
    assert (third.epoch, third.to_send, third.to_forget) == (2, {}, ["b", "c"])
    # A wrong epoch: the next fetch is full and closes the session; then a new one.
    assert not handler.handle_response(third, ErrorCode.invalid_fetch_session_epoch, 0)
    fourth = handler.build({"a": 6})
    assert (fourth.session_id, fourth.epoch, fourth.to_send) == (42, 0, {"a": 6})
    assert handler.handle_response(fourth, ErrorCode.none, 43)
    # An unknown session: a full fetch that names none.
    fifth = handler.build({"a": 6})
    assert (fifth.session_id, fifth.epoch) == (43, 1)
    assert not handler.handle_response(fifth, ErrorCode.fetch_session_id_not_found, 0)
    sixth = handler.build({"a": 6})
    assert (sixth.session_id, sixth.epoch, sixth.to_send) == (0, 0, {"a": 6})
    # No session given (no slot): every fetch stays full.
    assert handler.handle_response(sixth, ErrorCode.none, 0)
    assert handler.build({"a": 6}).epoch == INITIAL_EPOCH
    # A lost connection: the next fetch is full.
    handler.handle_error()
    assert handler.build({"a": 6}).epoch == INITIAL_EPOCH


class Connection:
    """A session owner: calls its close callbacks when closed (at once once it is closed)."""

    def __init__(self) -> None:
        self.callbacks: dict[object, Callable[[], None]] = {}
        self.closed = False

    def on_close(self, key: object, callback: Callable[[], None]) -> None:
        if self.closed:
            callback()
        else:
            self.callbacks[key] = callback

    def close(self) -> None:
        self.closed = True
        for callback in self.callbacks.values():
            callback()


def open_owned_session(
    cache: FetchSessionCache, partitions: list[RequestedPartition], owner: Connection
) -> int:
    context = cache.new_context(
        INVALID_SESSION_ID, INITIAL_EPOCH, partitions, [], uses_topic_ids=True, privileged=False, owner=owner
    )
    return context.respond({p.key: answer() for p in partitions})[1]


def test_sessions_end_with_the_connection_that_opened_them() -> None:
    cache = FetchSessionCache(10)
    first, second = Connection(), Connection()
    ids = [open_owned_session(cache, [req(0), req(1)], first) for _ in range(2)]
    kept = open_owned_session(cache, [req(0)], second)
    assert len(cache) == 3 and cache.cached_partitions == 5
    first.close()
    assert [cache.get(i) for i in ids] == [None, None]
    assert cache.get(kept) is not None and cache.cached_partitions == 1


def test_the_cache_holds_a_bounded_number_of_partitions() -> None:
    clock = Clock()
    cache = FetchSessionCache(10, clock=clock, max_partitions=5)
    assert open_session(cache, [req(i) for i in range(6)]) == INVALID_SESSION_ID
    small = open_session(cache, [req(i) for i in range(3)])
    assert small != INVALID_SESSION_ID
    # Three more would pass the bound, and the small session is neither stale nor old enough.
    assert open_session(cache, [req(i) for i in range(3)]) == INVALID_SESSION_ID
    # An incremental fetch that grows the session past the bound ends it: answered in full.
    context = cache.new_context(
        small, 1, [req(i) for i in range(3, 6)], [], uses_topic_ids=True, privileged=False
    )
    assert context.session is None and len(context.partitions) == 6
    assert cache.get(small) is None and cache.cached_partitions == 0
    # A stale session makes room.
    stale = open_session(cache, [req(i) for i in range(4)])
    clock.now += EVICTION_MS + 1
    assert open_session(cache, [req(i) for i in range(4)]) != INVALID_SESSION_ID
    assert cache.get(stale) is None and cache.cached_partitions == 4


def test_a_session_opened_for_a_connection_already_closed_ends_at_once() -> None:
    cache = FetchSessionCache(10)
    gone = Connection()
    gone.close()  # while its fetch waited
    session_id = open_owned_session(cache, [req(0)], gone)
    assert session_id != INVALID_SESSION_ID  # the answer names it, but nothing is kept
    assert cache.get(session_id) is None and len(cache) == 0 and cache.cached_partitions == 0


def test_handler_given_what_changed_compares_only_that() -> None:
    """The follower names the partitions whose request may have changed: only those are compared
    (an incremental fetch of a few thousand idle partitions costs nothing), with the same answer
    as comparing every partition."""
    handler: FetchSessionHandler[str, int] = FetchSessionHandler()
    wanted = {f"p{i}": 0 for i in range(1000)}
    assert handler.handle_response(handler.build(wanted, None), ErrorCode.none, 42)
    wanted["p7"] = 5  # appended
    del wanted["p9"]  # delayed or removed
    wanted["new"] = 0  # added
    unchanged_but_named = "p11"
    second = handler.build(wanted, ["p7", "p9", "new", unchanged_but_named])
    assert (second.epoch, second.to_send, second.to_forget) == (1, {"p7": 5, "new": 0}, ["p9"])
    assert handler.handle_response(second, ErrorCode.none, 42)
    # The session's view is what was sent: a full comparison now finds nothing to send.
    third = handler.build(wanted)
    assert (third.to_send, third.to_forget) == ({}, [])


def test_a_high_watermark_move_wakes_a_waiting_consumer_fetch_but_not_a_followers() -> None:
    """Kafka's DelayedFetch completes a follower's fetch for bytes, not for a HW: the follower's
    session carries the new HW on its next answer, and only the consumer's waiting fetch wakes."""

    async def scenario() -> None:
        cache = FetchSessionCache(10)
        tp = TopicPartition("foo", 0)
        requested = [req(0)]
        sessions = {}
        for replica_id in (1, -1):
            session_id = cache.maybe_create_session(
                replica_id >= 0, True, requested, {}, tps={req(0).key: tp}, replica_id=replica_id
            )
            session = cache.get(session_id)
            assert session is not None
            session.take()  # the first fetch read it; now the session waits
            session.settle([req(0).key], [])
            sessions[replica_id] = session
        waits = {r: asyncio.ensure_future(s.wait_for_change(5)) for r, s in sessions.items()}
        await asyncio.sleep(0)
        cache.partition_changed(tp, wake_followers=False)
        await asyncio.wait_for(waits[-1], 1)
        assert not waits[1].done()
        assert all(req(0).key in s.ready for s in sessions.values())  # read at the next fetch
        cache.partition_changed(tp)  # an append wakes both
        await asyncio.wait_for(waits[1], 1)

    asyncio.run(scenario())
