"""The strom data source's options: Spark Kafka connector names, defaults and refusals."""

from __future__ import annotations

import pytest

from strom.client.cluster import TopicPartition
from strom.spark.offsets import OffsetRangeLimit
from strom.spark.options import (
    Assign,
    OptionError,
    Subscribe,
    SubscribePattern,
    parse_sink_options,
    parse_source_options,
)

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "a"}


def test_defaults_follow_the_kafka_connector() -> None:
    stream = parse_source_options(BASE, streaming=True)
    batch = parse_source_options(BASE, streaming=False)
    assert stream.starting == OffsetRangeLimit.latest()
    assert batch.starting == OffsetRangeLimit.earliest()
    assert batch.ending == OffsetRangeLimit.latest()
    assert stream.fail_on_data_loss is True
    assert stream.include_headers is False
    assert stream.max_offsets_per_trigger is None
    assert stream.max_trigger_delay_ms == 15 * 60 * 1000
    assert stream.group_id is None
    assert stream.group_id_prefix == "strom-spark"


def test_strategies() -> None:
    assert parse_source_options(BASE, streaming=True).strategy == Subscribe(("a",))
    both = {"kafka.bootstrap.servers": "b:1", "subscribe": " a, b ,a,"}
    assert parse_source_options(both, streaming=True).strategy == Subscribe(("a", "b"))
    pattern = {"kafka.bootstrap.servers": "b:1", "subscribePattern": "t-.*"}
    assert parse_source_options(pattern, streaming=True).strategy == SubscribePattern("t-.*")
    assign = {"kafka.bootstrap.servers": "b:1", "assign": '{"b": [1, 0], "a": [2]}'}
    assert parse_source_options(assign, streaming=True).strategy == Assign(
        (TopicPartition("a", 2), TopicPartition("b", 0), TopicPartition("b", 1))
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"kafka.bootstrap.servers": "b:1"}, "One of the options 'subscribe', 'subscribePattern' and 'assign'"),
        ({**BASE, "assign": '{"a": [0]}'}, "Only one of the options"),
        ({"subscribe": "a"}, "'kafka.bootstrap.servers' must be specified"),
        ({**BASE, "subscribe": " , "}, "no topics to subscribe to"),
        ({"kafka.bootstrap.servers": "b:1", "subscribePattern": "("}, "not a regular expression"),
        ({"kafka.bootstrap.servers": "b:1", "assign": '{"a": 0}'}, "option \"assign\" must be like"),
        ({**BASE, "kafka.auto.offset.reset": "earliest"}, "'auto.offset.reset' is not supported: set the source option 'startingOffsets'"),
        ({**BASE, "kafka.enable.auto.commit": "true"}, "'enable.auto.commit' is not supported"),
        ({**BASE, "kafka.key.deserializer": "x"}, "'key.deserializer' is not supported: keys are always read as bytes"),
        ({**BASE, "kafka.value.deserializer": "x"}, "'value.deserializer' is not supported"),
        ({**BASE, "kafka.interceptor.classes": "x"}, "'interceptor.classes' is not supported"),
        ({**BASE, "kafka.no.such.config": "1"}, "unknown Kafka consumer config(s) kafka.no.such.config"),
        ({**BASE, "maxOffsetsPerTrigger": "0"}, "'maxOffsetsPerTrigger' must be a positive integer"),
        ({**BASE, "minPartitions": "x"}, "'minPartitions' must be a positive integer"),
        ({**BASE, "failOnDataLoss": "maybe"}, "'failOnDataLoss' must be true or false"),
        ({**BASE, "maxTriggerDelay": "soon"}, "'maxTriggerDelay' must be a duration"),
        ({**BASE, "startingOffsets": "{bad"}, "takes 'earliest', 'latest' or JSON"),
        ({**BASE, "startingOffsets": '{"a": {"0": -3}}'}, "is negative"),
        ({**BASE, "startingOffsetsByTimestampStrategy": "guess"}, "must be 'error' or 'latest'"),
        ({**BASE, "endingOffsets": "latest"}, "'endingOffsets' is for batch queries only"),
    ],
)
def test_refusals_name_the_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError) as raised:
        parse_source_options(options, streaming=True)
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"startingOffsets": "latest"}, "starting offset can't be latest for batch queries"),
        ({"startingOffsets": '{"a": {"0": -1}}'}, "starting offset for a-0 can't be latest"),
        ({"endingOffsets": "earliest"}, "ending offset can't be earliest for batch queries"),
        ({"endingOffsets": '{"a": {"1": -2}}'}, "ending offset for a-1 can't be earliest"),
    ],
)
def test_batch_reads_need_a_fixed_range(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_source_options({**BASE, **options}, streaming=False)


def test_offset_options_and_their_precedence() -> None:
    parsed = parse_source_options({**BASE, "startingOffsets": '{"a": {"1": 5, "0": -2}}'}, streaming=True)
    assert parsed.starting == OffsetRangeLimit.specific({TopicPartition("a", 0): -2, TopicPartition("a", 1): 5})
    # A global timestamp wins over per-partition timestamps, which win over offsets.
    parsed = parse_source_options(
        {
            **BASE,
            "startingOffsets": "earliest",
            "startingOffsetsByTimestamp": '{"a": {"0": 1000}}',
            "startingTimestamp": "2000",
            "startingOffsetsByTimestampStrategy": "LATEST",
        },
        streaming=True,
    )
    assert parsed.starting == OffsetRangeLimit.global_timestamp(2000, "latest")
    parsed = parse_source_options(
        {**BASE, "startingOffsets": "earliest", "startingOffsetsByTimestamp": '{"a": {"0": 1000}}'}, streaming=True
    )
    assert parsed.starting == OffsetRangeLimit.by_timestamp({TopicPartition("a", 0): 1000}, "error")
    ending = parse_source_options({**BASE, "endingTimestamp": "3000"}, streaming=False).ending
    assert ending == OffsetRangeLimit.global_timestamp(3000, "latest")


def test_kafka_params_pass_through_by_client_kind() -> None:
    parsed = parse_source_options(
        {
            **BASE,
            "KAFKA.max.poll.records": "7",
            "kafka.request.timeout.ms": "1234",
            "kafka.group.id": "mine",
            "kafka.isolation.level": "read_committed",
            "maxOffsetsPerTrigger": "10",
            "minOffsetsPerTrigger": "3",
            "maxTriggerDelay": "30s",
            "includeHeaders": "TRUE",
        },
        streaming=True,
    )
    assert parsed.consumer_config == {
        "max.poll.records": "7",
        "request.timeout.ms": "1234",
        "isolation.level": "read_committed",
    }
    assert parsed.admin_config == {"request.timeout.ms": "1234"}
    assert parsed.client_config("admin") == {"bootstrap.servers": "127.0.0.1:9092", "request.timeout.ms": "1234"}
    assert parsed.group_id == "mine"
    assert parsed.read_committed is True
    assert (parsed.max_offsets_per_trigger, parsed.min_offsets_per_trigger) == (10, 3)
    assert parsed.max_trigger_delay_ms == 30_000
    assert parsed.include_headers is True


def test_sink_options() -> None:
    sink = parse_sink_options({"kafka.bootstrap.servers": "b:1", "topic": "out", "kafka.linger.ms": "20"})
    assert sink.topic == "out"
    assert sink.client_config() == {"bootstrap.servers": "b:1", "linger.ms": "20"}
    assert parse_sink_options({"kafka.bootstrap.servers": "b:1"}).topic is None
    with pytest.raises(OptionError, match=r"'value\.serializer' is not supported"):
        parse_sink_options({"kafka.bootstrap.servers": "b:1", "kafka.value.serializer": "x"})
    with pytest.raises(OptionError, match="unknown Kafka producer config"):
        parse_sink_options({"kafka.bootstrap.servers": "b:1", "kafka.max.poll.records": "5"})
    with pytest.raises(OptionError, match=r"'kafka\.bootstrap\.servers' must be specified for configuring the Kafka producer"):
        parse_sink_options({"topic": "x"})
