"""KIP-227 incremental fetch sessions over the wire (Fetch v13: topics by id)."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import request as fetch12
from kio.schema.fetch.v13 import request as fetch13

from brokerproc import BrokerProcess
from kafka_wire import KafkaWire
from strom.records.codec import RecordSpec, encode_batch

TOPIC = "sessions"
# Two slots: the eviction test fills them.
BROKER_CONFIG = {"max.incremental.fetch.session.cache.slots": "2"}


@pytest.fixture()
def wire(broker: BrokerProcess) -> Iterator[KafkaWire]:
    with KafkaWire.connect(broker.bootstrap) as conn:
        yield conn


def fetch(
    wire: KafkaWire,
    topic_id: uuid.UUID,
    offsets: dict[int, int],
    *,
    session_id: int = 0,
    epoch: int = 0,
    forgotten: tuple[int, ...] = (),
) -> Any:
    """A consumer's Fetch v13 of ``offsets`` (partition -> fetch offset), without waiting."""
    return wire.request(
        fetch13.FetchRequest(
            replica_id=-1,
            max_wait=datetime.timedelta(milliseconds=0),
            min_bytes=0,
            max_bytes=1 << 20,
            isolation_level=0,
            session_id=session_id,
            session_epoch=epoch,
            topics=(
                fetch13.FetchTopic(
                    topic_id=topic_id,
                    partitions=tuple(
                        fetch13.FetchPartition(
                            partition=p,
                            current_leader_epoch=-1,
                            fetch_offset=offset,
                            last_fetched_epoch=-1,
                            log_start_offset=-1,
                            partition_max_bytes=1 << 20,
                        )
                        for p, offset in offsets.items()
                    ),
                ),
            )
            if offsets
            else (),
            forgotten_topics_data=(fetch13.ForgottenTopic(topic_id=topic_id, partitions=forgotten),)
            if forgotten
            else (),
            rack_id="",
        )
    )


def answered(response: Any) -> dict[int, Any]:
    return {p.partition_index: p for topic in response.responses for p in topic.partitions}


def produce(wire: KafkaWire, partition: int, value: bytes) -> None:
    wire.produce_ok(TOPIC, encode_batch([RecordSpec(key=None, value=value)]), partition=partition)


@pytest.fixture(scope="module")
def topic_id(broker: BrokerProcess) -> uuid.UUID:
    with KafkaWire.connect(broker.bootstrap) as wire:
        assert wire.create_topic(TOPIC, partitions=3) == ErrorCode.none
        topic_id: uuid.UUID = wire.metadata(TOPIC).topics[0].topic_id
        for p in range(3):
            produce(wire, p, b"first")
        return topic_id


def test_a_session_answers_only_what_changed(wire: KafkaWire, topic_id: uuid.UUID) -> None:
    # A full fetch with epoch 0 opens a session and answers every partition.
    full = fetch(wire, topic_id, {0: 0, 1: 0, 2: 0})
    session_id = full.session_id
    assert full.error_code == ErrorCode.none and session_id != 0
    assert sorted(answered(full)) == [0, 1, 2]
    assert all(p.high_watermark == 1 and p.records for p in answered(full).values())

    # Incremental: the fetcher moves on; nothing new anywhere.
    quiet = fetch(wire, topic_id, {0: 1, 1: 1, 2: 1}, session_id=session_id, epoch=1)
    assert (quiet.error_code, quiet.session_id, answered(quiet)) == (ErrorCode.none, session_id, {})

    # A record on partition 1: only partition 1 comes back, though nothing was listed.
    produce(wire, 1, b"second")
    changed = answered(fetch(wire, topic_id, {}, session_id=session_id, epoch=2))
    assert list(changed) == [1] and changed[1].high_watermark == 2 and changed[1].records

    # Partition 2 is forgotten: records there no longer come.
    forgot = fetch(wire, topic_id, {1: 2}, session_id=session_id, epoch=3, forgotten=(2,))
    assert answered(forgot) == {}
    produce(wire, 2, b"unseen")
    produce(wire, 0, b"seen")
    after = answered(fetch(wire, topic_id, {}, session_id=session_id, epoch=4))
    assert list(after) == [0]

    # A session error answers nothing and keeps the session.
    stale = fetch(wire, topic_id, {}, session_id=session_id, epoch=4)
    assert (stale.error_code, answered(stale)) == (ErrorCode.invalid_fetch_session_epoch, {})
    unknown = fetch(wire, topic_id, {}, session_id=session_id + 1, epoch=1)
    assert (unknown.error_code, unknown.session_id) == (ErrorCode.fetch_session_id_not_found, 0)
    assert fetch(wire, topic_id, {}, session_id=session_id, epoch=5).error_code == ErrorCode.none

    # The session outlives its connection.
    with KafkaWire(*wire.sock.getpeername()) as other:
        assert fetch(other, topic_id, {}, session_id=session_id, epoch=6).error_code == ErrorCode.none

    # A sessionless full fetch (epoch -1) naming the session closes it and answers everything.
    closing = fetch(wire, topic_id, {0: 0, 1: 0, 2: 0}, session_id=session_id, epoch=-1)
    assert (closing.session_id, sorted(answered(closing))) == (0, [0, 1, 2])
    gone = fetch(wire, topic_id, {}, session_id=session_id, epoch=7)
    assert gone.error_code == ErrorCode.fetch_session_id_not_found


def test_sessionless_fetches_are_answered_in_full_every_time(wire: KafkaWire, topic_id: uuid.UUID) -> None:
    for _ in range(2):
        response = fetch(wire, topic_id, {0: 100, 1: 100}, epoch=-1)
        assert response.session_id == 0
        assert sorted(answered(response)) == [0, 1]


def test_full_cache_gives_no_session_to_a_consumer(wire: KafkaWire, topic_id: uuid.UUID) -> None:
    first = fetch(wire, topic_id, {0: 0}).session_id
    second = fetch(wire, topic_id, {0: 0}).session_id
    assert first != 0 and second != 0
    # Two slots, both young consumer sessions of one partition: a third is answered without one.
    third = fetch(wire, topic_id, {0: 0})
    assert third.session_id == 0 and list(answered(third)) == [0]
    for session_id in (first, second):
        assert fetch(wire, topic_id, {0: 0}, session_id=session_id, epoch=-1).session_id == 0


def test_a_session_by_topic_id_refuses_fetches_by_name(wire: KafkaWire, topic_id: uuid.UUID) -> None:
    session_id = fetch(wire, topic_id, {0: 0}).session_id
    assert session_id != 0
    by_name = wire.request(
        fetch12.FetchRequest(
            replica_id=-1,
            max_wait=datetime.timedelta(milliseconds=0),
            min_bytes=0,
            max_bytes=1 << 20,
            isolation_level=0,
            session_id=session_id,
            session_epoch=1,
            topics=(),
            forgotten_topics_data=(),
            rack_id="",
        )
    )
    assert (by_name.error_code, by_name.responses) == (ErrorCode.fetch_session_topic_id_error, ())
    # The session itself goes on.
    assert fetch(wire, topic_id, {}, session_id=session_id, epoch=1).error_code == ErrorCode.none
    fetch(wire, topic_id, {}, session_id=session_id, epoch=-1)
