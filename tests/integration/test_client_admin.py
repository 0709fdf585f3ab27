"""Strom's AdminClient and AsyncAdminClient against a real broker: every call, and the broker's
error codes surfacing as KafkaException with that code; calls over several items apply what they
can before raising; default.api.timeout.ms holds while the broker hangs, and late answers to
abandoned requests are not mistaken for later ones. Group state comes from confluent-kafka
consumers, records from confluent-kafka's producer."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import Producer as CKProducer
from confluent_kafka import TopicPartition as CKPartition

from brokerproc import HOST, BrokerProcess, Freezer, free_port
from strom.client.admin import (
    AdminClient,
    AlterConfigOp,
    AsyncAdminClient,
    ConfigResource,
    ConfigResourceType,
    ConfigSource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
)
from strom.client.cluster import TopicPartition
from strom.client.consumer.structs import OffsetAndMetadata
from strom.client.errors import ErrorCode, KafkaException, KafkaTimeoutError
from strom.network.connection import BrokerConnection, UnsupportedVersionError
from strom.protocol.apis import ApiKey

# Groups form at once instead of after Kafka's 3 s initial rebalance delay.
BROKER_CONFIG = {"group.initial.rebalance.delay.ms": "0"}


@pytest.fixture(scope="module")
def admin(bootstrap: str) -> Iterator[AdminClient]:
    with AdminClient({"bootstrap.servers": bootstrap, "default.api.timeout.ms": 10_000}) as client:
        yield client


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def code_of(excinfo: pytest.ExceptionInfo[KafkaException]) -> ErrorCode | None:
    return excinfo.value.error_code


def produce(bootstrap: str, topic: str, records: list[tuple[int, bytes, int]]) -> None:
    """(partition, value, timestamp ms) records through confluent-kafka, all acknowledged."""
    producer = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    failures: list[object] = []
    for partition, value, timestamp in records:
        producer.produce(
            topic,
            value,
            partition=partition,
            timestamp=timestamp,
            on_delivery=lambda err, _msg: failures.append(err) if err else None,
        )
    assert producer.flush(15) == 0 and not failures, failures


def consumer(bootstrap: str, group: str, **extra: object) -> CKConsumer:
    return CKConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 50,
            **extra,
        }
    )


def consume_and_commit(c: CKConsumer, topic: str, count: int) -> None:
    """Subscribe, read ``count`` records, commit them synchronously."""
    c.subscribe([topic])
    got = 0
    deadline = time.monotonic() + 20
    while got < count and time.monotonic() < deadline:
        msg = c.poll(0.1)
        if msg is not None and msg.error() is None:
            got += 1
    assert got == count
    c.commit(asynchronous=False)


# -- cluster and topics ----------------------------------------------------------------------


def test_describe_cluster(admin: AdminClient, bootstrap: str) -> None:
    cluster = admin.describe_cluster()
    assert cluster.cluster_id
    assert [n.address for n in cluster.nodes] == [bootstrap]
    assert cluster.controller == cluster.nodes[0]


def test_topic_lifecycle(admin: AdminClient) -> None:
    name = unique("life")
    admin.create_topics([NewTopic(name, 3, 1, {"retention.ms": "3600000"})])
    assert name in admin.list_topics()
    described = admin.describe_topics([name])[name]
    assert described.name == name and described.topic_id is not None and not described.is_internal
    assert [p.partition for p in described.partitions] == [0, 1, 2]
    node = admin.describe_cluster().nodes[0].node_id
    assert all(p.leader == node and p.replicas == (node,) and p.isr == (node,) for p in described.partitions)

    with pytest.raises(KafkaException) as exists:
        admin.create_topics([NewTopic(name, 1, 1)])
    assert code_of(exists) == ErrorCode.topic_already_exists
    assert name in str(exists.value)

    admin.delete_topics([name])
    assert name not in admin.list_topics()
    with pytest.raises(KafkaException) as gone:
        admin.describe_topics([name])
    assert code_of(gone) == ErrorCode.unknown_topic_or_partition
    with pytest.raises(KafkaException) as again:
        admin.delete_topics([name])
    assert code_of(again) == ErrorCode.unknown_topic_or_partition


def test_create_topics_attempts_every_topic_before_raising_the_first_error(admin: AdminClient) -> None:
    existing, fresh = unique("exists"), unique("fresh")
    admin.create_topics([NewTopic(existing, 1, 1)])
    with pytest.raises(KafkaException) as excinfo:
        admin.create_topics([NewTopic(existing, 1, 1), NewTopic(fresh, 2, 1)])
    assert code_of(excinfo) == ErrorCode.topic_already_exists and existing in str(excinfo.value)
    assert len(admin.describe_topics([fresh])[fresh].partitions) == 2


def test_create_topics_validate_only_and_defaults(admin: AdminClient) -> None:
    name = unique("validate")
    admin.create_topics([NewTopic(name, 4, 1)], validate_only=True)
    assert name not in admin.list_topics()
    admin.create_topics([NewTopic(name)])  # the broker's num.partitions (1 here) and replication factor
    assert len(admin.describe_topics([name])[name].partitions) == 1


def test_create_topics_invalid_config(admin: AdminClient) -> None:
    name = unique("badconfig")
    with pytest.raises(KafkaException) as excinfo:
        admin.create_topics([NewTopic(name, 1, 1, {"cleanup.policy": "shred"})])
    assert code_of(excinfo) == ErrorCode.invalid_config
    assert name not in admin.list_topics()


def test_create_partitions(admin: AdminClient) -> None:
    name = unique("grow")
    admin.create_topics([NewTopic(name, 1, 1)])
    admin.create_partitions({name: 3})
    assert len(admin.describe_topics([name])[name].partitions) == 3
    admin.create_partitions({name: NewPartitions(4)})
    assert len(admin.describe_topics([name])[name].partitions) == 4
    with pytest.raises(KafkaException) as shrink:
        admin.create_partitions({name: 2})
    assert code_of(shrink) == ErrorCode.invalid_partitions
    with pytest.raises(KafkaException) as unknown:
        admin.create_partitions({unique("nosuch"): 2})
    assert code_of(unknown) == ErrorCode.unknown_topic_or_partition


# -- configs ---------------------------------------------------------------------------------


def _overrides(admin: AdminClient, resource: ConfigResource) -> dict[str, str | None]:
    entries = admin.describe_configs([resource])[resource]
    return {n: e.value for n, e in entries.items() if e.source == ConfigSource.DYNAMIC_TOPIC_CONFIG}


def test_describe_and_incremental_alter_topic_configs(admin: AdminClient) -> None:
    name = unique("configs")
    admin.create_topics([NewTopic(name, 1, 1, {"retention.ms": "60000"})])
    resource = ConfigResource("topic", name)
    assert resource == ConfigResource(ConfigResourceType.TOPIC, name)
    entries = admin.describe_configs([resource])[resource]
    assert entries["retention.ms"].value == "60000" and not entries["retention.ms"].is_default
    assert (
        entries["segment.bytes"].is_default and entries["segment.bytes"].source == ConfigSource.DEFAULT_CONFIG
    )

    admin.incremental_alter_configs(
        {
            resource: [
                AlterConfigOp("retention.ms", None, "delete"),
                AlterConfigOp("max.message.bytes", "2097152"),
                AlterConfigOp("cleanup.policy", "compact", "append"),
            ]
        }
    )
    assert _overrides(admin, resource) == {"max.message.bytes": "2097152", "cleanup.policy": "delete,compact"}
    admin.incremental_alter_configs({resource: [AlterConfigOp("cleanup.policy", "delete", "subtract")]})
    assert _overrides(admin, resource)["cleanup.policy"] == "compact"

    with pytest.raises(KafkaException) as invalid:
        admin.incremental_alter_configs({resource: [AlterConfigOp("no.such.config", "1")]})
    assert code_of(invalid) == ErrorCode.invalid_config
    with pytest.raises(KafkaException) as bad_value:
        admin.incremental_alter_configs({resource: [AlterConfigOp("retention.ms", "soon")]})
    assert code_of(bad_value) == ErrorCode.invalid_config
    missing = ConfigResource("topic", unique("nosuch"))
    with pytest.raises(KafkaException) as unknown:
        admin.describe_configs([missing])
    assert code_of(unknown) == ErrorCode.unknown_topic_or_partition


def test_alter_configs_replaces_all_overrides(admin: AdminClient) -> None:
    name = unique("legacy")
    admin.create_topics([NewTopic(name, 1, 1, {"retention.ms": "60000", "segment.ms": "3600000"})])
    resource = ConfigResource("topic", name)
    admin.alter_configs({resource: {"max.message.bytes": "4096"}})
    assert _overrides(admin, resource) == {"max.message.bytes": "4096"}


def test_incremental_alter_falls_back_to_alter_configs(
    admin: AdminClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against a broker without IncrementalAlterConfigs, the current overrides are read and
    written back changed with AlterConfigs: the untouched override survives."""
    name = unique("fallback")
    admin.create_topics([NewTopic(name, 1, 1, {"retention.ms": "60000", "segment.ms": "3600000"})])
    resource = ConfigResource("topic", name)
    real_version = BrokerConnection.version

    def without_incremental(
        self: BrokerConnection, api_key: int, client_max: int, client_min: int = 0
    ) -> int:
        if api_key == ApiKey.INCREMENTAL_ALTER_CONFIGS:
            raise UnsupportedVersionError("this broker has no IncrementalAlterConfigs")
        return real_version(self, api_key, client_max, client_min)

    monkeypatch.setattr(BrokerConnection, "version", without_incremental)
    admin.incremental_alter_configs(
        {
            resource: [
                AlterConfigOp("retention.ms", "120000"),
                AlterConfigOp("segment.ms", None, "delete"),
                AlterConfigOp("cleanup.policy", "compact", "append"),
            ]
        }
    )
    assert _overrides(admin, resource) == {"retention.ms": "120000", "cleanup.policy": "delete,compact"}


def test_describe_broker_configs(admin: AdminClient) -> None:
    node = admin.describe_cluster().nodes[0].node_id
    resource = ConfigResource("broker", str(node))
    entries = admin.describe_configs([resource])[resource]
    assert entries["group.initial.rebalance.delay.ms"].value == "0"
    assert not entries["group.initial.rebalance.delay.ms"].is_default
    assert entries["num.partitions"].value == "1"
    with pytest.raises(KafkaException) as static:
        admin.incremental_alter_configs({resource: [AlterConfigOp("num.partitions", "3")]})
    assert code_of(static) == ErrorCode.invalid_request


# -- offsets and records ---------------------------------------------------------------------


def test_list_offsets_and_delete_records(admin: AdminClient, bootstrap: str) -> None:
    name = unique("offsets")
    admin.create_topics([NewTopic(name, 2, 1)])
    base = int(time.time() * 1000) - 60_000
    produce(bootstrap, name, [(0, f"v{i}".encode(), base + i * 1000) for i in range(5)])
    p0, p1 = TopicPartition(name, 0), TopicPartition(name, 1)

    found = admin.list_offsets(
        {p0: OffsetSpec.latest(), p1: OffsetSpec.latest()}, isolation_level="read_committed"
    )
    assert (found[p0].offset, found[p1].offset) == (5, 0)
    assert admin.list_offsets({p0: OffsetSpec.earliest()})[p0].offset == 0
    at = admin.list_offsets({p0: OffsetSpec.for_timestamp(base + 2500)})[p0]
    assert (at.offset, at.timestamp) == (3, base + 3000)
    assert admin.list_offsets({p0: OffsetSpec.for_timestamp(base + 10_000)})[p0].offset == -1
    newest = admin.list_offsets({p0: OffsetSpec.max_timestamp()})[p0]
    assert (newest.offset, newest.timestamp) == (4, base + 4000)

    assert admin.delete_records({p0: 2}) == {p0: 2}
    assert admin.list_offsets({p0: OffsetSpec.earliest()})[p0].offset == 2
    with pytest.raises(KafkaException) as beyond:
        admin.delete_records({p0: 99})
    assert code_of(beyond) == ErrorCode.offset_out_of_range
    assert admin.delete_records({p0: -1}) == {p0: 5}  # -1: up to the high watermark

    with pytest.raises(KafkaException) as no_partition:
        admin.list_offsets({TopicPartition(name, 7): OffsetSpec.latest()})
    assert code_of(no_partition) == ErrorCode.unknown_topic_or_partition
    with pytest.raises(KafkaException) as no_topic:
        admin.delete_records({TopicPartition(unique("nosuch"), 0): 1})
    assert code_of(no_topic) == ErrorCode.unknown_topic_or_partition


# -- groups ----------------------------------------------------------------------------------


def test_consumer_group_lifecycle(admin: AdminClient, bootstrap: str) -> None:
    topic, group = unique("grouped"), unique("group")
    admin.create_topics([NewTopic(topic, 2, 1)])
    produce(bootstrap, topic, [(i % 2, b"x", int(time.time() * 1000)) for i in range(6)])
    member = consumer(bootstrap, group, **{"client.id": "lifecycle-client"})
    try:
        consume_and_commit(member, topic, 6)
        described = admin.describe_consumer_groups([group])[group]
        assert (described.state, described.protocol_type, described.protocol) == (
            "Stable",
            "consumer",
            "range",
        )
        (only,) = described.members
        assert only.client_id == "lifecycle-client" and only.host.startswith("/127.0.0.1")
        assert only.assignment == {TopicPartition(topic, 0), TopicPartition(topic, 1)}
        assert described.coordinator.address == bootstrap
        listed = {g.group_id: g for g in admin.list_consumer_groups()}
        assert listed[group].state == "Stable" and listed[group].protocol_type == "consumer"
        assert group not in {g.group_id for g in admin.list_consumer_groups(states=["Empty"])}

        with pytest.raises(KafkaException) as busy:
            admin.delete_consumer_groups([group])
        assert code_of(busy) == ErrorCode.non_empty_group
        with pytest.raises(KafkaException) as active:
            admin.alter_consumer_group_offsets(group, {TopicPartition(topic, 0): 0})
        assert code_of(active) == ErrorCode.unknown_member_id
    finally:
        member.close()

    committed = admin.list_consumer_group_offsets(group)
    # librdkafka commits the leader epoch of the last record consumed.
    assert committed == {
        TopicPartition(topic, 0): OffsetAndMetadata(3, "", 0),
        TopicPartition(topic, 1): OffsetAndMetadata(3, "", 0),
    }
    assert admin.describe_consumer_groups([group])[group].state == "Empty"
    assert group in {g.group_id for g in admin.list_consumer_groups(states=["Empty"])}

    admin.alter_consumer_group_offsets(
        group, {TopicPartition(topic, 0): OffsetAndMetadata(1, "note"), TopicPartition(topic, 1): 2}
    )
    assert admin.list_consumer_group_offsets(group, [TopicPartition(topic, 0)]) == {
        TopicPartition(topic, 0): OffsetAndMetadata(1, "note")
    }
    # confluent-kafka reads what the admin client committed.
    check = consumer(bootstrap, group)
    try:
        positions = check.committed([CKPartition(topic, 0), CKPartition(topic, 1)], timeout=10)
        assert [(p.partition, p.offset) for p in positions] == [(0, 1), (1, 2)]
    finally:
        check.close()

    admin.delete_consumer_group_offsets(group, [TopicPartition(topic, 1)])
    assert admin.list_consumer_group_offsets(group) == {
        TopicPartition(topic, 0): OffsetAndMetadata(1, "note")
    }
    admin.delete_consumer_groups([group])
    with pytest.raises(KafkaException) as gone:
        admin.describe_consumer_groups([group])
    assert code_of(gone) == ErrorCode.group_id_not_found
    with pytest.raises(KafkaException) as again:
        admin.delete_consumer_groups([group])
    assert code_of(again) == ErrorCode.group_id_not_found
    assert admin.list_consumer_group_offsets(group) == {}


def test_delete_offsets_of_a_subscribed_topic_is_refused(admin: AdminClient, bootstrap: str) -> None:
    topic, group = unique("subscribed"), unique("group")
    admin.create_topics([NewTopic(topic, 1, 1)])
    produce(bootstrap, topic, [(0, b"x", int(time.time() * 1000))])
    member = consumer(bootstrap, group)
    try:
        consume_and_commit(member, topic, 1)
        with pytest.raises(KafkaException) as excinfo:
            admin.delete_consumer_group_offsets(group, [TopicPartition(topic, 0)])
        assert code_of(excinfo) == ErrorCode.group_subscribed_to_topic
    finally:
        member.close()


# -- the asyncio face and timeouts -----------------------------------------------------------


def test_async_admin_client(bootstrap: str) -> None:
    name = unique("async")

    async def scenario() -> tuple[list[str], int]:
        async with AsyncAdminClient({"bootstrap.servers": bootstrap}) as admin:
            await admin.create_topics([NewTopic(name, 2, 1)])
            topics = await admin.list_topics()
            described = await admin.describe_topics([name])
            return topics, len(described[name].partitions)

    topics, partitions = asyncio.run(scenario())
    assert name in topics and partitions == 2


def test_unreachable_broker_times_out(free_bootstrap: str) -> None:
    started = time.monotonic()
    with (
        AdminClient({"bootstrap.servers": free_bootstrap}) as admin,
        pytest.raises(KafkaTimeoutError) as excinfo,
    ):
        admin.list_topics(timeout=0.5)
    assert time.monotonic() - started < 3
    assert "did not complete within 500 ms" in str(excinfo.value)
    assert free_bootstrap in str(excinfo.value)


def test_calls_retry_across_a_broker_restart(running_broker: BrokerProcess, admin: AdminClient) -> None:
    """Connections die, the broker refuses connections for a while, then comes back with the group
    coordinator reloading: calls made meanwhile retry until they succeed."""
    topic, group = unique("restart"), unique("group")
    admin.create_topics([NewTopic(topic, 1, 1)])
    admin.alter_consumer_group_offsets(group, {TopicPartition(topic, 0): 0})
    running_broker.stop()
    restart = threading.Timer(0.5, running_broker.start)
    restart.start()
    try:
        assert admin.list_consumer_group_offsets(group, timeout=20) == {
            TopicPartition(topic, 0): OffsetAndMetadata(0)
        }
        assert admin.describe_topics([topic], timeout=20)[topic].partitions[0].leader >= 0
    finally:
        restart.join()


@pytest.fixture()
def free_bootstrap() -> str:
    return f"{HOST}:{free_port()}"


# -- partial failures and an unresponsive broker -----------------------------------------------


def test_calls_over_several_items_apply_what_they_can(admin: AdminClient, bootstrap: str) -> None:
    name, empty_group = unique("partial"), unique("empty")
    admin.create_topics([NewTopic(name, 2, 1)])
    produce(bootstrap, name, [(p, b"x", int(time.time() * 1000)) for p in (0, 1) for _ in range(5)])
    p0, p1 = TopicPartition(name, 0), TopicPartition(name, 1)
    with pytest.raises(KafkaException) as beyond:
        admin.delete_records({p0: 3, p1: 99})
    assert code_of(beyond) == ErrorCode.offset_out_of_range and str(p1) in str(beyond.value)
    assert admin.list_offsets({p0: OffsetSpec.earliest()})[p0].offset == 3  # applied despite p1
    assert admin.list_offsets({p1: OffsetSpec.earliest()})[p1].offset == 0

    started = time.monotonic()
    with pytest.raises(KafkaException) as unknown:
        admin.list_offsets({p0: OffsetSpec.latest(), TopicPartition(name, 9): OffsetSpec.latest()})
    assert code_of(unknown) == ErrorCode.unknown_topic_or_partition and f"{name}-9" in str(unknown.value)
    assert time.monotonic() - started < 2  # known to be missing: not retried until the timeout

    admin.alter_consumer_group_offsets(empty_group, {p0: 1})
    missing = unique("missing")
    with pytest.raises(KafkaException) as no_group:
        admin.delete_consumer_groups([missing, empty_group])
    assert code_of(no_group) == ErrorCode.group_id_not_found and missing in str(no_group.value)
    assert admin.list_consumer_group_offsets(empty_group) == {}  # deleted all the same
    assert admin.list_consumer_group_offsets(missing) == {}


@pytest.fixture
def freezer(running_broker: BrokerProcess) -> Iterator[Freezer]:
    freezer = Freezer(running_broker)
    yield freezer
    freezer.thaw()


def test_default_api_timeout_while_the_broker_hangs(bootstrap: str, freezer: Freezer) -> None:
    name, group = unique("frozen"), unique("frozen")
    with AdminClient({"bootstrap.servers": bootstrap, "default.api.timeout.ms": 1000}) as short:
        short.create_topics([NewTopic(name, 1, 1)])
        short.alter_consumer_group_offsets(group, {TopicPartition(name, 0): 0})
        freezer.freeze()
        for call in (
            short.list_topics,
            lambda: short.describe_topics([name]),
            lambda: short.list_consumer_group_offsets(group),
            lambda: short.list_offsets({TopicPartition(name, 0): OffsetSpec.latest()}),
        ):
            started = time.monotonic()
            with pytest.raises(KafkaTimeoutError, match="within 1000 ms"):
                call()
            assert time.monotonic() - started < 2
        started = time.monotonic()
        with pytest.raises(KafkaTimeoutError, match="within 300 ms"):
            short.describe_cluster(timeout=0.3)
        assert time.monotonic() - started < 1
        # The late answers to the abandoned requests must not be taken for the next ones'.
        freezer.thaw()
        assert name in short.list_topics(timeout=10)
        assert short.list_consumer_group_offsets(group, timeout=10) == {
            TopicPartition(name, 0): OffsetAndMetadata(0)
        }
        assert (
            short.list_offsets({TopicPartition(name, 0): OffsetSpec.latest()}, timeout=10)[
                TopicPartition(name, 0)
            ].offset
            == 0
        )
