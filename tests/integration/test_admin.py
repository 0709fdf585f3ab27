"""Admin APIs through confluent-kafka's AdminClient, and their error paths through the raw protocol."""

from __future__ import annotations

import datetime
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
)
from kio.schema.create_topics.v7 import request as create_topics7
from kio.schema.delete_topics.v6 import request as delete_topics6
from kio.schema.errors import ErrorCode
from kio.schema.list_offsets.v7 import request as list_offsets7
from kio.schema.offset_for_leader_epoch.v4 import request as ofle4

from brokerproc import BrokerProcess
from kafka_wire import KafkaWire
from strom.records.batch import TimestampType
from strom.records.codec import RecordSpec, decode_batches, encode_batch
from strom.storage.log_config import TOPIC_CONFIGS

TIMEOUT = datetime.timedelta(seconds=5)


@pytest.fixture(scope="module")
def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


@pytest.fixture()
def wire(broker: BrokerProcess) -> Iterator[KafkaWire]:
    with KafkaWire.connect(broker.bootstrap) as conn:
        yield conn


def create(admin: AdminClient, *topics: NewTopic, validate_only: bool = False) -> dict[str, Exception | None]:
    futures = admin.create_topics(list(topics), validate_only=validate_only, operation_timeout=5)
    results: dict[str, Exception | None] = {}
    for name, future in futures.items():
        try:
            future.result()
            results[name] = None
        except KafkaException as exc:
            results[name] = exc
    return results


def error_code(exc: Exception | None) -> int | None:
    assert isinstance(exc, KafkaException), exc
    return exc.args[0].code()


def produce_values(bootstrap: str, topic: str, values: list[bytes], **config: object) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, **config})
    for value in values:
        producer.produce(topic, value=value)
    assert producer.flush(10) == 0


# -- CreateTopics ---------------------------------------------------------------------------------


def test_create_topic_with_configs(admin: AdminClient) -> None:
    results = create(admin, NewTopic("created", num_partitions=4, config={"retention.ms": "12345"}))
    assert results == {"created": None}
    metadata = admin.list_topics(timeout=5)
    assert len(metadata.topics["created"].partitions) == 4


def test_create_topic_validate_only_creates_nothing(admin: AdminClient) -> None:
    assert create(admin, NewTopic("validated", num_partitions=2), validate_only=True) == {"validated": None}
    assert "validated" not in admin.list_topics(timeout=5).topics


@pytest.mark.parametrize(
    ("topic", "expected"),
    [
        (NewTopic("bad partitions", num_partitions=1), KafkaError.TOPIC_EXCEPTION),
        (NewTopic("zero-partitions", num_partitions=0), KafkaError.INVALID_PARTITIONS),
        (NewTopic("rf3", num_partitions=1, replication_factor=3), KafkaError.INVALID_REPLICATION_FACTOR),
        (
            NewTopic("bad-config", num_partitions=1, config={"retention.ms": "soon"}),
            KafkaError.INVALID_CONFIG,
        ),
        (
            NewTopic("unknown-config", num_partitions=1, config={"no.such.config": "1"}),
            KafkaError.INVALID_CONFIG,
        ),
    ],
)
def test_create_topic_errors(admin: AdminClient, topic: NewTopic, expected: int) -> None:
    results = create(admin, topic)
    assert error_code(results[topic.topic]) == expected
    assert topic.topic not in admin.list_topics(timeout=5).topics


def test_create_topic_with_an_assignment_to_an_unknown_broker(wire: KafkaWire) -> None:
    # confluent-kafka refuses replica assignments client-side; the raw request reaches the broker.
    response = wire.request(
        create_topics7.CreateTopicsRequest(
            topics=(
                create_topics7.CreatableTopic(
                    name="bad-assignment",
                    num_partitions=-1,
                    replication_factor=-1,
                    assignments=(
                        create_topics7.CreatableReplicaAssignment(partition_index=0, broker_ids=(7,)),
                    ),
                    configs=(),
                ),
            ),
            timeout=TIMEOUT,
            validate_only=False,
        )
    )
    assert response.topics[0].error_code == ErrorCode.invalid_replica_assignment


def test_create_existing_topic(admin: AdminClient) -> None:
    assert create(admin, NewTopic("twice", num_partitions=1)) == {"twice": None}
    assert (
        error_code(create(admin, NewTopic("twice", num_partitions=1))["twice"])
        == KafkaError.TOPIC_ALREADY_EXISTS
    )


# -- DeleteTopics -----------------------------------------------------------------------------------


def test_delete_topic_by_name_and_by_id(admin: AdminClient, wire: KafkaWire) -> None:
    create(admin, NewTopic("doomed", num_partitions=1), NewTopic("doomed-by-id", num_partitions=1))
    admin.delete_topics(["doomed"], operation_timeout=5)["doomed"].result()
    with pytest.raises(KafkaException) as excinfo:
        admin.delete_topics(["doomed"], operation_timeout=5)["doomed"].result()
    assert excinfo.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART

    described = admin.describe_topics(TopicCollection(["doomed-by-id"]))["doomed-by-id"].result()
    msb, lsb = described.topic_id.get_most_significant_bits(), described.topic_id.get_least_significant_bits()
    topic_id = uuid.UUID(int=((msb % 2**64) << 64) | (lsb % 2**64))
    response = wire.request(
        delete_topics6.DeleteTopicsRequest(
            topics=(
                delete_topics6.DeleteTopicState(name=None, topic_id=topic_id),
                delete_topics6.DeleteTopicState(name=None, topic_id=uuid.uuid4()),
            ),
            timeout=TIMEOUT,
        )
    )
    errors = [r.error_code for r in response.responses]
    assert errors == [ErrorCode.none, ErrorCode.unknown_topic_id]
    assert response.responses[0].name == "doomed-by-id"
    topics = admin.list_topics(timeout=5).topics
    assert "doomed" not in topics and "doomed-by-id" not in topics


# -- CreatePartitions -------------------------------------------------------------------------------


def test_create_partitions(admin: AdminClient) -> None:
    create(admin, NewTopic("growing", num_partitions=2))
    admin.create_partitions([NewPartitions("growing", 5)], operation_timeout=5)["growing"].result()
    assert len(admin.list_topics(timeout=5).topics["growing"].partitions) == 5
    with pytest.raises(KafkaException) as excinfo:
        admin.create_partitions([NewPartitions("growing", 3)], operation_timeout=5)["growing"].result()
    assert excinfo.value.args[0].code() == KafkaError.INVALID_PARTITIONS
    with pytest.raises(KafkaException) as excinfo:
        admin.create_partitions([NewPartitions("no-such-topic", 3)], operation_timeout=5)[
            "no-such-topic"
        ].result()
    assert excinfo.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART


# -- Configs ----------------------------------------------------------------------------------------


def describe_topic(admin: AdminClient, topic: str) -> dict[str, ConfigEntry]:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return admin.describe_configs([resource])[resource].result()


def test_describe_configs_lists_every_topic_config_with_defaults(admin: AdminClient) -> None:
    create(
        admin,
        NewTopic("described", num_partitions=1, config={"cleanup.policy": "delete", "retention.ms": "1000"}),
    )
    configs = describe_topic(admin, "described")
    assert set(configs) == set(TOPIC_CONFIGS)
    assert configs["retention.ms"].value == "1000"
    assert configs["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["segment.bytes"].value == "1073741824"
    assert configs["segment.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    assert configs["max.message.bytes"].value == "1048588"
    assert configs["compression.type"].value == "producer"
    assert not any(entry.is_sensitive for entry in configs.values())


def test_describe_broker_configs(admin: AdminClient) -> None:
    resource = ConfigResource(ConfigResource.Type.BROKER, "0")
    configs = admin.describe_configs([resource])[resource].result()
    assert configs["num.partitions"].value == "1"
    assert configs["log.retention.check.interval.ms"].value == "300"
    assert configs["log.retention.check.interval.ms"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert configs["message.max.bytes"].source == ConfigSource.DEFAULT_CONFIG.value


def test_incremental_alter_configs(admin: AdminClient) -> None:
    create(admin, NewTopic("altered", num_partitions=1))
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        "altered",
        incremental_configs=[
            ConfigEntry("retention.ms", "60000", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND),
        ],
    )
    admin.incremental_alter_configs([resource])[resource].result()
    configs = describe_topic(admin, "altered")
    assert configs["retention.ms"].value == "60000"
    assert configs["cleanup.policy"].value == "delete,compact"

    delete = ConfigResource(
        ConfigResource.Type.TOPIC,
        "altered",
        incremental_configs=[
            ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE)
        ],
    )
    admin.incremental_alter_configs([delete])[delete].result()
    assert describe_topic(admin, "altered")["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value

    bad = ConfigResource(
        ConfigResource.Type.TOPIC,
        "altered",
        incremental_configs=[
            ConfigEntry("segment.bytes", "tiny", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    with pytest.raises(KafkaException) as excinfo:
        admin.incremental_alter_configs([bad])[bad].result()
    assert excinfo.value.args[0].code() == KafkaError.INVALID_CONFIG


def test_alter_configs_replaces_the_overrides(admin: AdminClient) -> None:
    create(
        admin, NewTopic("replaced", num_partitions=1, config={"retention.ms": "5000", "segment.ms": "100000"})
    )
    resource = ConfigResource(
        ConfigResource.Type.TOPIC, "replaced", set_config={"retention.bytes": "1048576"}
    )
    admin.alter_configs([resource])[resource].result()
    configs = describe_topic(admin, "replaced")
    assert configs["retention.bytes"].value == "1048576"
    assert configs["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    assert configs["segment.ms"].source == ConfigSource.DEFAULT_CONFIG.value


def test_a_static_broker_config_cannot_be_altered(admin: AdminClient) -> None:
    resource = ConfigResource(ConfigResource.Type.BROKER, "0", set_config={"num.partitions": "3"})
    with pytest.raises(KafkaException):
        admin.alter_configs([resource])[resource].result()


# -- Topic configs that change what the log stores --------------------------------------------------


def test_topic_compression_type_recompresses(admin: AdminClient, bootstrap: str, wire: KafkaWire) -> None:
    create(admin, NewTopic("gzipped", num_partitions=1, config={"compression.type": "gzip"}))
    produce_values(bootstrap, "gzipped", [b"a" * 100, b"b" * 100], **{"compression.type": "lz4"})
    data = wire.fetch("gzipped", 0, max_wait_ms=10)
    batches = decode_batches(data.records)
    assert {b.header.compression for b in batches} == {1}  # gzip
    assert [r.value for b in batches for r in b.records] == [b"a" * 100, b"b" * 100]


def test_log_append_time(admin: AdminClient, bootstrap: str, wire: KafkaWire) -> None:
    create(admin, NewTopic("appended", num_partitions=1, config={"message.timestamp.type": "LogAppendTime"}))
    before = int(time.time() * 1000)
    old = before - 86_400_000
    produced = wire.produce(
        "appended", encode_batch([RecordSpec(key=None, value=b"x", timestamp=old)]), acks=-1
    )
    assert produced.error_code == ErrorCode.none
    appended_at = int(produced.log_append_time.timestamp() * 1000)
    assert before - 1000 <= appended_at <= int(time.time() * 1000) + 1000
    batch = decode_batches(wire.fetch("appended", 0, max_wait_ms=10).records)[0]
    assert batch.header.timestamp_type == TimestampType.LOG_APPEND_TIME
    assert batch.records[0].timestamp == appended_at


def test_max_message_bytes_per_topic(admin: AdminClient, wire: KafkaWire) -> None:
    create(admin, NewTopic("small-messages", num_partitions=1, config={"max.message.bytes": "200"}))
    big = encode_batch([RecordSpec(key=None, value=b"x" * 500)])
    assert wire.produce("small-messages", big, acks=-1).error_code == ErrorCode.message_too_large
    small = encode_batch([RecordSpec(key=None, value=b"x" * 10)])
    assert wire.produce("small-messages", small, acks=-1).error_code == ErrorCode.none


def test_min_insync_replicas_above_the_isr(admin: AdminClient, wire: KafkaWire) -> None:
    create(admin, NewTopic("needs-two", num_partitions=1, config={"min.insync.replicas": "2"}))
    batch = encode_batch([RecordSpec(key=None, value=b"x")])
    assert wire.produce("needs-two", batch, acks=-1).error_code == ErrorCode.not_enough_replicas
    assert wire.produce("needs-two", batch, acks=1).error_code == ErrorCode.none


def test_timestamps_outside_the_topic_window(admin: AdminClient, wire: KafkaWire) -> None:
    window = {"message.timestamp.before.max.ms": "60000", "message.timestamp.after.max.ms": "60000"}
    create(admin, NewTopic("recent-only", num_partitions=1, config=window))
    now = int(time.time() * 1000)
    for timestamp in (now - 3_600_000, now + 3_600_000):
        stale = encode_batch([RecordSpec(key=None, value=b"x", timestamp=timestamp)])
        assert wire.produce("recent-only", stale).error_code == ErrorCode.invalid_timestamp
    fresh = encode_batch([RecordSpec(key=None, value=b"x", timestamp=now)])
    assert wire.produce("recent-only", fresh).error_code == ErrorCode.none


# -- DeleteRecords, ListOffsets, DescribeCluster, OffsetForLeaderEpoch ------------------------------


def test_delete_records_and_list_offsets(admin: AdminClient, bootstrap: str) -> None:
    create(admin, NewTopic("trimmed", num_partitions=1))
    now = int(time.time() * 1000)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(10):
        producer.produce("trimmed", value=b"%d" % i, timestamp=now - 10_000 + i * 1000)
    assert producer.flush(10) == 0
    tp = TopicPartition("trimmed", 0)

    def offsets(spec: OffsetSpec) -> int:
        return admin.list_offsets({tp: spec})[tp].result().offset

    assert offsets(OffsetSpec.earliest()) == 0
    assert offsets(OffsetSpec.latest()) == 10
    assert offsets(OffsetSpec.max_timestamp()) == 9
    assert offsets(OffsetSpec.for_timestamp(now - 10_000 + 4500)) == 5
    assert offsets(OffsetSpec.for_timestamp(now + 60_000)) == -1

    deleted = admin.delete_records([TopicPartition("trimmed", 0, 4)])[tp].result()
    assert deleted.low_watermark == 4
    assert offsets(OffsetSpec.earliest()) == 4
    with pytest.raises(KafkaException) as excinfo:
        admin.delete_records([TopicPartition("trimmed", 0, 11)])[tp].result()
    assert excinfo.value.args[0].code() == KafkaError.OFFSET_OUT_OF_RANGE


def test_describe_cluster(admin: AdminClient, broker: BrokerProcess) -> None:
    cluster = admin.describe_cluster().result()
    assert cluster.cluster_id
    assert cluster.controller.id == 0
    assert [(n.id, n.host, n.port) for n in cluster.nodes] == [(0, "127.0.0.1", broker.port)]


def test_offset_for_leader_epoch(admin: AdminClient, bootstrap: str, wire: KafkaWire) -> None:
    create(admin, NewTopic("epochs", num_partitions=1))
    produce_values(bootstrap, "epochs", [b"1", b"2", b"3"])

    def request(epoch: int, current: int = -1) -> object:
        response = wire.request(
            ofle4.OffsetForLeaderEpochRequest(
                replica_id=-1,
                topics=(
                    ofle4.OffsetForLeaderTopic(
                        topic="epochs",
                        partitions=(
                            ofle4.OffsetForLeaderPartition(
                                partition=0, current_leader_epoch=current, leader_epoch=epoch
                            ),
                        ),
                    ),
                ),
            )
        )
        return response.topics[0].partitions[0]

    current = request(0)
    assert (current.error_code, current.leader_epoch, current.end_offset) == (ErrorCode.none, 0, 3)
    assert request(0, current=5).error_code == ErrorCode.unknown_leader_epoch

    # One leader epoch, the same in Metadata, ListOffsets, OffsetForLeaderEpoch and the stored batches.
    (partition,) = wire.metadata("epochs").topics[0].partitions
    listed = (
        wire.request(
            list_offsets7.ListOffsetsRequest(
                replica_id=-1,
                isolation_level=0,
                topics=(
                    list_offsets7.ListOffsetsTopic(
                        name="epochs",
                        partitions=(list_offsets7.ListOffsetsPartition(partition_index=0, timestamp=-1),),
                    ),
                ),
            )
        )
        .topics[0]
        .partitions[0]
    )
    stored = {b.header.partition_leader_epoch for b in decode_batches(wire.fetch("epochs", 0).records)}
    assert partition.leader_epoch == listed.leader_epoch == current.leader_epoch == 0
    assert stored == {0}


# -- Idempotent producers -----------------------------------------------------------------------------


def test_idempotent_sequences(admin: AdminClient, wire: KafkaWire) -> None:
    create(admin, NewTopic("sequenced", num_partitions=1))

    def batch(seq: int, epoch: int = 0, n: int = 2) -> bytes:
        specs = [RecordSpec(key=None, value=b"%d" % (seq + i)) for i in range(n)]
        return encode_batch(specs, producer_id=4242, producer_epoch=epoch, base_sequence=seq)

    first = wire.produce("sequenced", batch(0), acks=-1)
    assert (first.error_code, first.base_offset) == (ErrorCode.none, 0)
    assert wire.produce("sequenced", batch(2), acks=-1).base_offset == 2
    duplicate = wire.produce("sequenced", batch(0), acks=-1)
    assert (duplicate.error_code, duplicate.base_offset) == (ErrorCode.none, 0)
    assert wire.produce("sequenced", batch(7), acks=-1).error_code == ErrorCode.out_of_order_sequence_number
    assert wire.produce("sequenced", batch(0, epoch=1), acks=-1).base_offset == 4
    assert (
        wire.produce("sequenced", batch(4, epoch=0), acks=-1).error_code == ErrorCode.invalid_producer_epoch
    )
    assert wire.fetch("sequenced", 0, max_wait_ms=10).high_watermark == 6


# -- Errors of the data path ----------------------------------------------------------------------------


def test_produce_to_unknown_partition(admin: AdminClient, wire: KafkaWire) -> None:
    create(admin, NewTopic("one-partition", num_partitions=1))
    batch = encode_batch([RecordSpec(key=None, value=b"x")])
    assert (
        wire.produce("one-partition", batch, partition=3, acks=-1).error_code
        == ErrorCode.unknown_topic_or_partition
    )


def test_fetch_out_of_range(admin: AdminClient, bootstrap: str, wire: KafkaWire) -> None:
    create(admin, NewTopic("ranged", num_partitions=1))
    produce_values(bootstrap, "ranged", [b"only"])
    assert wire.fetch("ranged", 5, max_wait_ms=10).error_code == ErrorCode.offset_out_of_range
    assert (
        wire.fetch("ranged", 1, max_wait_ms=10).error_code == ErrorCode.none
    )  # at the LEO: empty, not an error
