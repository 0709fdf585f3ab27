"""Committed offsets through real clients: durable across restarts and kill -9, visible to admin tools,
and stored in ``__consumer_offsets`` exactly as Kafka stores them.

The module's broker is restarted (SIGTERM, then SIGKILL) on the same port and data dir; a broker
left down by a failed test is started again for the next one. Consumers use confluent-kafka
(librdkafka) unless a test needs an API only kafka-python has (OffsetDelete).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import kafka
import kafka.errors
import pytest
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import (
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from kio.schema.errors import ErrorCode

from brokerproc import BrokerProcess
from kafka_wire import GroupWire
from strom.broker.coordinator.records import (
    GroupMetadataKey,
    OffsetCommitKey,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
)
from strom.records.codec import Record, RecordSpec, decode_batches, encode_batch

pytestmark = pytest.mark.usefixtures("running_broker")

BROKER_CONFIG = {
    "group.initial.rebalance.delay.ms": "0",
    "offsets.retention.check.interval.ms": "200",
}
OFFSETS_TOPIC = "__consumer_offsets"
OFFSETS_PARTITIONS = 50  # offsets.topic.num.partitions' default
TIMEOUT = 20.0


@pytest.fixture()
def admin(broker: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


@pytest.fixture()
def wire(broker: BrokerProcess) -> Iterator[GroupWire]:
    host, port = broker.bootstrap.split(":")
    with GroupWire(host, int(port)) as conn:
        yield conn


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def consumer(bootstrap: str, group: str, **extra: Any) -> CKConsumer:
    return CKConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "client.id": f"{group}-client",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            "max.poll.interval.ms": 10000,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 500,
            **extra,
        }
    )


def produce(bootstrap: str, topic: str, counts: dict[int, int]) -> None:
    """counts[p] records to partition p, valued "<p>-<n>"."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for partition, count in counts.items():
        for n in range(count):
            producer.produce(topic, value=f"{partition}-{n}".encode(), partition=partition)
    assert producer.flush(TIMEOUT) == 0


def create_topic(admin: AdminClient, topic: str, partitions: int) -> None:
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(TIMEOUT)


def consume_exactly(c: CKConsumer, count: int) -> list[Message]:
    messages: list[Message] = []
    deadline = time.monotonic() + TIMEOUT
    while len(messages) < count:
        assert time.monotonic() < deadline, f"consumed {len(messages)} of {count}"
        msg = c.poll(0.2)
        if msg is None:
            continue
        assert msg.error() is None, msg.error()
        messages.append(msg)
    return messages


def wait_for_assignment(c: CKConsumer) -> list[TopicPartition]:
    deadline = time.monotonic() + TIMEOUT
    while not c.assignment():
        assert time.monotonic() < deadline, "no assignment"
        msg = c.poll(0.1)
        assert msg is None or msg.error() is None or msg.error().code() == KafkaError._PARTITION_EOF
    return list(c.assignment())


def positions_after(messages: list[Message]) -> dict[int, int]:
    """Per partition, the offset after the last consumed record: what a consumer commits."""
    after: dict[int, int] = {}
    for msg in messages:
        after[msg.partition()] = max(after.get(msg.partition(), 0), msg.offset() + 1)
    return after


def group_offsets(admin: AdminClient, group: str) -> dict[tuple[str, int], tuple[int, str]]:
    """The group's committed offsets and metadata through OffsetFetch (list_consumer_group_offsets)."""
    result = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(TIMEOUT)
    return {(tp.topic, tp.partition): (tp.offset, tp.metadata or "") for tp in result.topic_partitions}


def raw_offsets(wire: GroupWire, group: str) -> dict[tuple[str, int], tuple[int, str]]:
    """The group's committed offsets and metadata exactly as OffsetFetch v9 returns them."""
    (result,) = wire.offset_fetch({group: None}).groups
    assert result.error_code == ErrorCode.none
    return {
        (t.name, p.partition_index): (p.committed_offset, p.metadata)
        for t in result.topics
        for p in t.partitions
    }


def error_code(exc: BaseException) -> int:
    assert isinstance(exc, KafkaException), exc
    code: int = exc.args[0].code()
    return code


# --- 1: the group resumes from its offsets after a restart and a crash ------------------


def test_a_group_resumes_exactly_from_its_committed_offsets_after_restart_and_kill9(
    broker: BrokerProcess, admin: AdminClient
) -> None:
    # Metadata strings round-trip through confluent-kafka, which sends them with a trailing NUL and reads
    # them back as C strings (librdkafka issue 4649): the broker stores and returns the bytes it was sent.
    topic, group = unique("resume"), unique("resume-group")
    create_topic(admin, topic, 3)
    counts = {0: 40, 1: 40, 2: 40}
    produce(broker.bootstrap, topic, counts)
    consumed: list[tuple[int, int]] = []
    committed: dict[int, int] = {}
    labels: dict[int, str] = {}  # the phase that committed each partition last

    def run_phase(count: int, label: str) -> None:
        c = consumer(broker.bootstrap, group)
        c.subscribe([topic])
        messages = consume_exactly(c, count)
        # Each partition restarts exactly where the group's commit left it (or at 0, never committed).
        first: dict[int, int] = {}
        for msg in messages:
            first.setdefault(msg.partition(), msg.offset())
        assert all(first[p] == committed.get(p, 0) for p in first), (first, committed)
        consumed.extend((m.partition(), m.offset()) for m in messages)
        after = positions_after(messages)
        c.commit(
            offsets=[TopicPartition(topic, p, o, metadata=f"{label}:p{p}@{o} ünï") for p, o in after.items()],
            asynchronous=False,
        )
        committed.update(after)
        labels.update(dict.fromkeys(after, label))
        c.close()

    def assert_committed() -> None:
        expected = {(topic, p): (o, f"{labels[p]}:p{p}@{o} ünï") for p, o in committed.items()}
        # A new AdminClient: librdkafka's old one may drop its coordinator lookup across a broker restart.
        assert group_offsets(AdminClient({"bootstrap.servers": broker.bootstrap}), group) == expected
        host, port = broker.bootstrap.split(":")
        with GroupWire(host, int(port)) as raw:
            assert raw_offsets(raw, group) == {k: (o, m + "\0") for k, (o, m) in expected.items()}
        # And through a consumer's committed(), as an application reads them at startup.
        c = consumer(broker.bootstrap, group)
        try:
            got = c.committed([TopicPartition(topic, p) for p in committed], timeout=TIMEOUT)
            assert {(tp.partition, tp.offset, tp.metadata) for tp in got} == {
                (p, o, f"{labels[p]}:p{p}@{o} ünï") for p, o in committed.items()
            }
        finally:
            c.close()

    run_phase(50, "first")
    broker.restart()
    assert_committed()

    run_phase(40, "second")
    assert broker.kill9() == -9
    broker.start()
    assert_committed()

    run_phase(30, "third")  # exactly what is left
    assert sorted(consumed) == sorted((p, o) for p, n in counts.items() for o in range(n))
    assert len(consumed) == len(set(consumed)), "a record was consumed twice"
    assert committed == counts


def test_leave_is_durable_before_it_is_answered(broker: BrokerProcess) -> None:
    # Kafka writes the group's Empty state in the same operation as the LeaveGroup of its last member
    # (prepareRebalance -> maybeCompleteJoinElseSchedule), so a crash right after the answer cannot bring
    # the member back from the dead.
    host, port = broker.bootstrap.split(":")
    topic = unique("leave-topic")
    with GroupWire(host, int(port)) as wire:
        assert wire.create_topic(topic) == ErrorCode.none
    for attempt in range(3):
        group = unique(f"leave-then-crash-{attempt}")
        with GroupWire(host, int(port)) as wire:
            member = wire.join_group(group, "", [("range", b"")]).member_id
            joined = wire.join_group(group, member, [("range", b"")])
            wire.request(wire.sync_group_request(group, joined.generation_id, member, {member: b""}))
            # An offset keeps the emptied group alive: the expiry job (every 200 ms here) removes
            # an empty group that has none, as Kafka's does.
            committed = wire.offset_commit(
                group, {(topic, 0): (0, None)}, generation_id=joined.generation_id, member_id=member
            )
            assert committed == {(topic, 0): ErrorCode.none}
            assert wire.leave_group(group, (member, None)).members[0].error_code == ErrorCode.none
            assert broker.kill9() == -9
        broker.start()
        with GroupWire(host, int(port)) as wire:
            (state,) = wire.describe_groups(group).groups
            assert (state.group_state, state.members) == ("Empty", ()), attempt


# --- 2: admin ----------------------------------------------------------------------------


def test_admin_lists_describes_deletes_groups_and_computes_lag(
    broker: BrokerProcess, admin: AdminClient
) -> None:
    topic, group = unique("lag"), unique("admin-group")
    create_topic(admin, topic, 2)
    counts = {0: 30, 1: 20}
    produce(broker.bootstrap, topic, counts)

    c = consumer(broker.bootstrap, group)
    c.subscribe([topic])
    messages = consume_exactly(c, 25)
    c.commit(asynchronous=False)
    consumed = {p: sum(1 for m in messages if m.partition() == p) for p in counts}

    def listed(states: set[ConsumerGroupState]) -> set[str]:
        result = admin.list_consumer_groups(states=states).result(TIMEOUT)
        assert result.errors == []
        return {g.group_id for g in result.valid}

    assert group in listed({ConsumerGroupState.STABLE})
    assert group not in listed({ConsumerGroupState.EMPTY})

    description = admin.describe_consumer_groups([group])[group].result(TIMEOUT)
    assert description.group_id == group
    assert description.state == ConsumerGroupState.STABLE
    assert description.is_simple_consumer_group is False
    assert description.partition_assignor == "range"
    assert (description.coordinator.host, description.coordinator.port) == ("127.0.0.1", broker.port)
    (member,) = description.members
    assert member.client_id == f"{group}-client"
    assert member.host == "/127.0.0.1"
    assert sorted((tp.topic, tp.partition) for tp in member.assignment.topic_partitions) == [
        (topic, 0),
        (topic, 1),
    ]

    # Lag as tools compute it: high watermark minus committed offset, per partition.
    committed = group_offsets(admin, group)
    lag = {}
    for p in counts:
        low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=TIMEOUT)
        assert (low, high) == (0, counts[p])
        if consumed[p] == 0:
            # The fetcher may have served all 25 records from one partition: nothing to commit here.
            assert (topic, p) not in committed
            continue
        lag[p] = high - committed[(topic, p)][0]
    assert lag == {p: counts[p] - consumed[p] for p in counts if consumed[p]}
    assert lag

    # A group with members can be neither deleted nor have its offsets altered by an admin.
    with pytest.raises(KafkaException) as refused:
        admin.delete_consumer_groups([group])[group].result(TIMEOUT)
    assert error_code(refused.value) == KafkaError.NON_EMPTY_GROUP
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0, 3)])
    (refused_tp,) = admin.alter_consumer_group_offsets([request])[group].result(TIMEOUT).topic_partitions
    assert refused_tp.error is not None and refused_tp.error.code() == KafkaError.UNKNOWN_MEMBER_ID
    # Nor may offsets of a topic its members subscribe to be deleted.
    kp_admin = kafka.KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        result = kp_admin.delete_group_offsets(group, [kafka.TopicPartition(topic, 0)])
        assert result == {kafka.TopicPartition(topic, 0): kafka.errors.GroupSubscribedToTopicError}

        c.close()
        assert group in listed({ConsumerGroupState.EMPTY})
        assert group not in listed({ConsumerGroupState.STABLE})
        description = admin.describe_consumer_groups([group])[group].result(TIMEOUT)
        assert (description.state, description.members) == (ConsumerGroupState.EMPTY, [])

        altered = admin.alter_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0, 5), TopicPartition(topic, 1, 7)])]
        )[group].result(TIMEOUT)
        assert all(tp.error is None for tp in altered.topic_partitions)
        assert {k: v[0] for k, v in group_offsets(admin, group).items()} == {(topic, 0): 5, (topic, 1): 7}

        result = kp_admin.delete_group_offsets(group, [kafka.TopicPartition(topic, 1)])
        assert result == {kafka.TopicPartition(topic, 1): kafka.errors.NoError}
        assert {k: v[0] for k, v in group_offsets(admin, group).items()} == {(topic, 0): 5}
    finally:
        kp_admin.close()

    admin.delete_consumer_groups([group])[group].result(TIMEOUT)
    assert group not in listed(set())
    assert group_offsets(admin, group) == {}
    with pytest.raises(KafkaException) as missing:
        admin.delete_consumer_groups([group])[group].result(TIMEOUT)
    assert error_code(missing.value) == KafkaError.GROUP_ID_NOT_FOUND


# --- 3: __consumer_offsets ---------------------------------------------------------------


def reference_partition(group: str, partitions: int = OFFSETS_PARTITIONS) -> int:
    """Kafka's Utils.abs(group.hashCode()) % partitions, from Java's String.hashCode definition."""
    h = 0
    for unit in range(0, len(encoded := group.encode("utf-16-be")), 2):
        h = (h * 31 + int.from_bytes(encoded[unit : unit + 2], "big")) % 2**32
    signed = h - 2**32 if h >= 2**31 else h
    return 0 if signed == -(2**31) else abs(signed) % partitions


def read_partition(wire: GroupWire, topic: str, partition: int) -> list[Record]:
    records: list[Record] = []
    end = wire.list_offset(topic, -1, partition=partition)
    position = wire.list_offset(topic, -2, partition=partition)
    while position < end:
        data = wire.fetch(topic, position, partition=partition)
        assert data.error_code == ErrorCode.none
        batches = decode_batches(data.records)
        assert batches, f"empty fetch at {position} below the end {end}"
        records += [r for b in batches for r in b.records if r.offset >= position]
        position = batches[-1].header.last_offset + 1
    return records


def test_consumer_offsets_is_an_internal_compacted_topic_holding_kafkas_records(
    broker: BrokerProcess, admin: AdminClient, wire: GroupWire
) -> None:
    topic = unique("offsets-layout")
    create_topic(admin, topic, 2)
    # Group ids whose partitions are known: 22, 0, 12 and 0 (hashCode = Integer.MIN_VALUE).
    standalone = {"hello": 22, "Hello": 0, "zzzzzzzz": 12, "polygenelubricants": 0}
    for group, partition in standalone.items():
        assert reference_partition(group) == partition
        errors = wire.offset_commit(group, {(topic, 0): (len(group), f"meta-{group}"), (topic, 1): (3, "")})
        assert set(errors.values()) == {ErrorCode.none}
    joined = unique("joined-group-ü")
    subscription = (
        b"\x00\x00\x00\x00\x00\x01" + len(topic).to_bytes(2, "big") + topic.encode() + b"\xff\xff\xff\xff"
    )
    first = wire.join_group(joined, "", [("range", subscription)], session_timeout_ms=30000)
    member = first.member_id
    join = wire.join_group(joined, member, [("range", subscription)], session_timeout_ms=30000)
    sync = wire.request(
        wire.sync_group_request(joined, join.generation_id, member, {member: b"the-assignment"})
    )
    assert sync.error_code == ErrorCode.none
    assert wire.delete_groups("Hello") == {"Hello": ErrorCode.none}

    metadata = wire.metadata(OFFSETS_TOPIC)
    (info,) = metadata.topics
    assert (info.error_code, info.name, info.is_internal) == (ErrorCode.none, OFFSETS_TOPIC, True)
    assert len(info.partitions) == OFFSETS_PARTITIONS
    resource = ConfigResource(ConfigResource.Type.TOPIC, OFFSETS_TOPIC)
    configs = admin.describe_configs([resource])[resource].result(TIMEOUT)
    assert configs["cleanup.policy"].value == "compact"

    # Clients may not write it (Kafka's ReplicaManager: InvalidTopicException for internal topics).
    result = wire.produce(OFFSETS_TOPIC, _one_record_batch(), partition=reference_partition("hello"))
    assert result.error_code == ErrorCode.invalid_topic_exception

    mine = {*standalone, joined}
    seen: dict[str, set[int]] = {}
    offsets: dict[tuple[str, str, int], list[tuple[int, str] | None]] = {}
    group_values: dict[str, list[Any]] = {}
    for partition in range(OFFSETS_PARTITIONS):
        for record in read_partition(wire, OFFSETS_TOPIC, partition):
            assert record.key is not None
            key = decode_key(record.key)
            if key is None or key.group not in mine:
                continue
            seen.setdefault(key.group, set()).add(partition)
            if isinstance(key, OffsetCommitKey):
                value = None if record.value is None else decode_offset_commit_value(record.value)
                offsets.setdefault((key.group, key.topic, key.partition), []).append(
                    None if value is None else (value.offset, value.metadata)
                )
                if value is not None:
                    assert abs(value.commit_timestamp - time.time() * 1000) < 120_000
            else:
                assert isinstance(key, GroupMetadataKey)
                group_values.setdefault(key.group, []).append(
                    None if record.value is None else decode_group_metadata_value(record.value)
                )
    # Every record of a group is in the partition Kafka's formula names.
    assert seen == {g: {reference_partition(g)} for g in mine}
    for group in standalone:
        history = [offsets[(group, topic, 0)], offsets[(group, topic, 1)]]
        expected = [[(len(group), f"meta-{group}")], [(3, "")]]
        if group == "Hello":  # deleted: each offset is followed by a tombstone, and so is the group
            expected = [[*e, None] for e in expected]
            assert group_values["Hello"][-1] is None
        assert history == expected
    # The joined group's metadata: the generation, protocol, leader, and the member with its assignment.
    stable = group_values[joined][-1]
    assert (stable.protocol_type, stable.generation, stable.protocol, stable.leader) == (
        "consumer",
        1,
        "range",
        member,
    )
    (m,) = stable.members
    assert (m.member_id, m.client_id, m.client_host, m.session_timeout) == (
        member,
        "strom-tests",
        "/127.0.0.1",
        30000,
    )
    assert (m.subscription, m.assignment) == (subscription, b"the-assignment")
    wire.leave_group(joined, (member, None))


def _one_record_batch() -> bytes:
    return encode_batch([RecordSpec(b"key", b"value")])


# --- 4: standalone commits ---------------------------------------------------------------


def test_standalone_commits_are_accepted_only_while_the_group_has_no_members(
    broker: BrokerProcess, admin: AdminClient, wire: GroupWire
) -> None:
    topic, group = unique("standalone"), unique("standalone-group")
    create_topic(admin, topic, 1)
    produce(broker.bootstrap, topic, {0: 10})

    # confluent-kafka: assign() and commit, no membership (generation -1, no member id).
    solo = consumer(broker.bootstrap, group)
    solo.assign([TopicPartition(topic, 0, 0)])
    solo.commit(offsets=[TopicPartition(topic, 0, 4, metadata="solo")], asynchronous=False)
    assert group_offsets(admin, group) == {(topic, 0): (4, "solo")}
    # kafka-python likewise.
    kp = kafka.KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=group, enable_auto_commit=False)
    try:
        tp = kafka.TopicPartition(topic, 0)
        kp.assign([tp])
        kp.commit({tp: kafka.OffsetAndMetadata(6, "kafka-python", -1)})
        assert raw_offsets(wire, group) == {(topic, 0): (6, "kafka-python")}
    finally:
        kp.close()

    member = consumer(broker.bootstrap, group)
    member.subscribe([topic])
    try:
        wait_for_assignment(member)
        # ClassicGroup.validateOffsetCommit: no generation and no member id while the group is not
        # Empty is UNKNOWN_MEMBER_ID.
        with pytest.raises(KafkaException) as refused:
            solo.commit(offsets=[TopicPartition(topic, 0, 8, metadata="late")], asynchronous=False)
        assert error_code(refused.value) == KafkaError.UNKNOWN_MEMBER_ID
        for version in (2, 8, 9):
            errors = wire.offset_commit(group, {(topic, 0): (8, None)}, version=version)
            assert errors == {(topic, 0): ErrorCode.unknown_member_id}
        assert raw_offsets(wire, group) == {(topic, 0): (6, "kafka-python")}
    finally:
        member.close()
    solo.commit(offsets=[TopicPartition(topic, 0, 9, metadata="after")], asynchronous=False)
    assert group_offsets(admin, group) == {(topic, 0): (9, "after")}
    solo.close()


# --- 5: retention ------------------------------------------------------------------------


def test_an_offset_committed_with_a_retention_time_expires(wire: GroupWire, admin: AdminClient) -> None:
    topic = unique("retention")
    create_topic(admin, topic, 1)
    short, kept = unique("short-lived"), unique("kept")
    # OffsetCommit v2-v4 carry retention_time; the broker checks every offsets.retention.check.interval.ms.
    assert wire.offset_commit(short, {(topic, 0): (11, "brief")}, version=2, retention_time_ms=1000) == {
        (topic, 0): ErrorCode.none
    }
    assert wire.offset_commit(kept, {(topic, 0): (12, "kept")}, version=4, retention_time_ms=-1) == {
        (topic, 0): ErrorCode.none
    }
    assert raw_offsets(wire, short) == {(topic, 0): (11, "brief")}
    deadline = time.monotonic() + 10
    while raw_offsets(wire, short):
        assert time.monotonic() < deadline, "the offset did not expire"
        time.sleep(0.2)
    # The group had nothing but that offset: it is gone too. The other group keeps its offset.
    listed = {g.group_id for g in admin.list_consumer_groups().result(TIMEOUT).valid}
    assert short not in listed and kept in listed
    assert raw_offsets(wire, kept) == {(topic, 0): (12, "kept")}
