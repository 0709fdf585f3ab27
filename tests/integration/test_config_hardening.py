"""Config values and admin requests that used to lose data or stop a broker from stopping, on one
real broker: out-of-bounds dynamic broker configs and NaN topic configs are refused before anything
is stored; the internal topics cannot be deleted; a topic's configs survive the loss of the
control plane's metadata file (or its retention waits for an operator); a throttled cleaner does
not hold up SIGTERM; a bad static value ends `strom serve` with one line.

The module's broker is stopped and started again; a broker left down by a failed test is restarted.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from kio.schema.create_topics.v7 import request as create_topics7
from kio.schema.delete_topics.v6 import request as delete_topics6
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12 import request as metadata12

from brokerproc import HOST, STROM, BrokerProcess, free_port
from kafka_wire import EARLIEST, REQUEST_TIMEOUT, ZERO_UUID, GroupWire, KafkaWire, kio_request
from strom.records.codec import RecordSpec, encode_batch

pytestmark = pytest.mark.usefixtures("running_broker")

# A 1 s broker default retention: a topic that lost its own (longer) retention loses its records
# within a few retention checks, unless that retention is held.
BROKER_CONFIG = {"log.retention.ms": "1000", "log.cleaner.backoff.ms": "200"}
METADATA_FILE = "__strom_metadata.json"
TOPIC_CONFIGS_COPY = "topic-configs.json"
BROKER, TOPIC = 4, 2


def alter(wire: KafkaWire, resource_type: int, name: str, configs: dict[str, str]) -> tuple[int, str | None]:
    """IncrementalAlterConfigs SET of ``configs``; the resource's error code and message."""
    m = kio_request("incremental_alter_configs", 1)
    response = wire.request(
        m.IncrementalAlterConfigsRequest(
            resources=(
                m.AlterConfigsResource(
                    resource_type=resource_type,
                    resource_name=name,
                    configs=tuple(
                        m.AlterableConfig(name=k, config_operation=0, value=v) for k, v in configs.items()
                    ),
                ),
            ),
            validate_only=False,
        )
    )
    (result,) = response.responses
    return result.error_code, result.error_message


def describe(wire: KafkaWire, resource_type: int, name: str) -> dict[str, Any]:
    m = kio_request("describe_configs", 4)
    response = wire.request(
        m.DescribeConfigsRequest(
            resources=(
                m.DescribeConfigsResource(
                    resource_type=resource_type, resource_name=name, configuration_keys=None
                ),
            ),
            include_synonyms=False,
            include_documentation=False,
        )
    )
    (result,) = response.results
    assert result.error_code == ErrorCode.none, result.error_message
    return {c.name: c.value for c in result.configs}


def create(wire: KafkaWire, name: str, configs: dict[str, str]) -> tuple[int, str | None]:
    response = wire.request(
        create_topics7.CreateTopicsRequest(
            topics=(
                create_topics7.CreatableTopic(
                    name=name,
                    num_partitions=2,
                    replication_factor=1,
                    assignments=(),
                    configs=tuple(
                        create_topics7.CreatableTopicConfig(name=k, value=v) for k, v in configs.items()
                    ),
                ),
            ),
            timeout=REQUEST_TIMEOUT,
        )
    )
    (result,) = response.topics
    return result.error_code, result.error_message


def delete(wire: KafkaWire, name: str) -> tuple[int, str | None]:
    response = wire.request(
        delete_topics6.DeleteTopicsRequest(
            topics=(delete_topics6.DeleteTopicState(name=name, topic_id=ZERO_UUID),), timeout=REQUEST_TIMEOUT
        )
    )
    (result,) = response.responses
    return result.error_code, result.error_message


def exists(wire: KafkaWire, name: str) -> bool:
    response = wire.request(
        metadata12.MetadataRequest(
            topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
        )
    )
    return name in {t.name for t in response.topics}


def produce(wire: KafkaWire, topic: str, count: int, *, partition: int = 0, keyed: bool = False) -> None:
    for i in range(count):
        key = b"k%d" % (i % 3) if keyed else None
        wire.produce_ok(topic, encode_batch([RecordSpec(key=key, value=b"v%d" % i)]), partition=partition)


@pytest.fixture()
def wire(broker: BrokerProcess) -> Iterator[KafkaWire]:
    with KafkaWire.connect(broker.bootstrap) as conn:
        yield conn


# --- item 9: dynamic broker configs out of bounds ----------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("log.cleaner.io.max.bytes.per.second", "0.001"),
        ("log.cleaner.io.max.bytes.per.second", "1e-300"),
        ("log.cleaner.dedupe.buffer.size", "-1"),
        ("log.cleaner.io.buffer.load.factor", "NaN"),
        ("log.cleaner.io.buffer.size", "0"),
        ("log.cleaner.threads", "0"),
        ("num.replica.fetchers", "2147483647"),
    ],
)
@pytest.mark.parametrize("entity", ["", "0"], ids=["cluster-default", "broker"])
def test_an_out_of_bounds_dynamic_broker_config_is_refused_and_not_stored(
    wire: KafkaWire, entity: str, key: str, value: str
) -> None:
    error, message = alter(wire, BROKER, entity, {key: value})
    assert error == ErrorCode.invalid_request, message
    assert key in (message or "") or "thread" in (message or "").lower(), message
    assert key not in describe(wire, BROKER, "")
    assert describe(wire, BROKER, "0")[key] != value


# --- item 16: topic config values ----------------------------------------------------------------


@pytest.mark.parametrize("value", ["NaN", "Infinity"])
def test_a_non_finite_topic_config_is_refused_and_creates_nothing(wire: KafkaWire, value: str) -> None:
    name = f"nan-ratio-{value.lower()}"
    error, message = create(wire, name, {"min.cleanable.dirty.ratio": value})
    assert error == ErrorCode.invalid_config, message
    assert not exists(wire, name)
    assert create(wire, name, {}) == (ErrorCode.none, None)
    error, message = alter(wire, TOPIC, name, {"min.cleanable.dirty.ratio": value})
    assert error == ErrorCode.invalid_config, message
    assert describe(wire, TOPIC, name)["min.cleanable.dirty.ratio"] == "0.5"


# --- item 2: internal topics ---------------------------------------------------------------------


def test_the_offsets_topic_cannot_be_deleted_and_commits_stay(wire: KafkaWire, broker: BrokerProcess) -> None:
    assert create(wire, "committed", {}) == (ErrorCode.none, None)
    with GroupWire.connect(broker.bootstrap) as group:
        assert group.find_coordinator("keeper").coordinators[0].error_code == ErrorCode.none
        assert group.offset_commit("keeper", {("committed", 0): (3, None)}) == {
            ("committed", 0): ErrorCode.none
        }
    error, message = delete(wire, "__consumer_offsets")
    assert error == ErrorCode.invalid_request, message
    assert "internal" in (message or "")
    assert exists(wire, "__consumer_offsets")
    with GroupWire.connect(broker.bootstrap) as group:
        fetched = group.offset_fetch({"keeper": {"committed": [0]}})
        assert fetched.groups[0].topics[0].partitions[0].committed_offset == 3


# --- item 5: topic configs and the lost metadata file --------------------------------------------


def test_a_compacted_topic_stays_compacted_when_the_metadata_file_is_lost(broker: BrokerProcess) -> None:
    with KafkaWire.connect(broker.bootstrap) as wire:
        configs = {"cleanup.policy": "compact", "retention.ms": "-1", "min.insync.replicas": "1"}
        assert create(wire, "compacted-kept", configs) == (ErrorCode.none, None)
        produce(wire, "compacted-kept", 6, keyed=True)
    broker.stop()
    (broker.data_dir / METADATA_FILE).unlink()
    broker.start()
    with KafkaWire.connect(broker.bootstrap) as wire:
        described = describe(wire, TOPIC, "compacted-kept")
        assert described["cleanup.policy"] == "compact"
        assert described["retention.ms"] == "-1"
        assert wire.list_offset("compacted-kept", EARLIEST) == 0


def test_without_a_copy_of_its_configs_a_rebuilt_topic_keeps_its_records_until_an_operator_confirms(
    broker: BrokerProcess,
) -> None:
    with KafkaWire.connect(broker.bootstrap) as wire:
        assert create(wire, "forever", {"retention.ms": "-1"}) == (ErrorCode.none, None)
        produce(wire, "forever", 5)
        time.sleep(2)  # older than the broker's 1 s default retention
    broker.stop()
    (broker.data_dir / METADATA_FILE).unlink()
    (broker.data_dir / "forever-0" / TOPIC_CONFIGS_COPY).unlink(missing_ok=True)
    broker.start()
    with KafkaWire.connect(broker.bootstrap) as wire:
        time.sleep(3)  # ten retention checks at the 1 s default
        assert wire.list_offset("forever", EARLIEST) == 0, "retention ran on defaults the topic never had"
    assert "retention and compaction of the topic are held" in broker.log_path.read_text()

    # The operator confirms the defaults: retention resumes, and the 1 s default applies.
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        "forever",
        incremental_configs=[
            ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE)
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=10)
    with KafkaWire.connect(broker.bootstrap) as wire:
        deadline = time.monotonic() + 30
        while wire.list_offset("forever", EARLIEST) == 0:
            assert time.monotonic() < deadline, "retention did not resume once the configs were confirmed"
            time.sleep(0.3)


# --- item 9: no setting may stop a broker from stopping ------------------------------------------


def test_a_throttled_cleaner_does_not_hold_up_shutdown(broker: BrokerProcess) -> None:
    with KafkaWire.connect(broker.bootstrap) as wire:
        # One byte per second: a cleaning round would take hours.
        assert alter(wire, BROKER, "", {"log.cleaner.io.max.bytes.per.second": "1"}) == (ErrorCode.none, None)
        configs = {"cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01"}
        assert create(wire, "throttled", configs) == (ErrorCode.none, None)
        for _ in range(10):
            produce(wire, "throttled", 3, keyed=True)
            time.sleep(0.15)  # segments roll by time: the dirty ones become cleanable
        time.sleep(3)  # several cleaner passes: a round is under way, throttled
    started = time.monotonic()
    assert broker.stop(timeout=60) == 0
    assert time.monotonic() - started < 20
    broker.start()
    with KafkaWire.connect(broker.bootstrap) as wire:
        m = kio_request("incremental_alter_configs", 1)
        wire.request(
            m.IncrementalAlterConfigsRequest(
                resources=(
                    m.AlterConfigsResource(
                        resource_type=BROKER,
                        resource_name="",
                        configs=(
                            m.AlterableConfig(
                                name="log.cleaner.io.max.bytes.per.second", config_operation=1, value=None
                            ),
                        ),
                    ),
                ),
                validate_only=False,
            )
        )


def test_a_bad_static_value_ends_serve_with_one_line(tmp_path: Any) -> None:
    result = subprocess.run(
        [
            str(STROM),
            "serve",
            "--override",
            f"listeners=PLAINTEXT://{HOST}:{free_port()}",
            "--override",
            f"log.dirs={tmp_path}",
            "--override",
            "log.cleaner.io.max.bytes.per.second=0.001",
        ],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "log.cleaner.io.max.bytes.per.second" in lines[0], result.stderr


def test_a_negative_idle_timeout_closes_no_connection(tmp_path: Any) -> None:
    port = free_port()
    broker = BrokerProcess(tmp_path, port=port, overrides={"connections.max.idle.ms": "-1"})
    with broker, KafkaWire.connect(broker.bootstrap) as wire:
        time.sleep(1.0)  # twenty idle checks
        assert not wire.is_closed_by_peer(timeout=0.5)
        assert create(wire, "still-served", {}) == (ErrorCode.none, None)
