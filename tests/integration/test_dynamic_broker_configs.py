"""Dynamic broker configs on a real broker: DescribeConfigs' sources and read_only as Kafka 4.1 reports
them, AlterConfigs/IncrementalAlterConfigs on the broker and on the cluster default (kafka-python and
confluent-kafka), the live effect on a topic without an override, refusals, and persistence."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from kio.schema.errors import ErrorCode

from brokerproc import BrokerProcess
from kafka_wire import KafkaWire, kio_request

TOPIC = "dyn-configs"
DYNAMIC_BROKER, DYNAMIC_DEFAULT, STATIC, DEFAULT = 2, 3, 4, 5


@pytest.fixture(scope="module")
def wire(broker: BrokerProcess) -> Iterator[KafkaWire]:
    with KafkaWire.connect(broker.bootstrap) as conn:
        assert conn.create_topic(TOPIC) == ErrorCode.none
        yield conn


def describe(wire: KafkaWire, resource_type: int, name: str) -> dict[str, Any]:
    m = kio_request("describe_configs", 4)
    response = wire.request(
        m.DescribeConfigsRequest(
            resources=(
                m.DescribeConfigsResource(
                    resource_type=resource_type, resource_name=name, configuration_keys=None
                ),
            ),
            include_synonyms=True,
            include_documentation=False,
        )
    )
    (result,) = response.results
    assert result.error_code == ErrorCode.none, result.error_message
    return {c.name: c for c in result.configs}


def incremental(wire: KafkaWire, name: str, ops: list[tuple[str, int, str | None]]) -> tuple[int, str | None]:
    m = kio_request("incremental_alter_configs", 1)
    response = wire.request(
        m.IncrementalAlterConfigsRequest(
            resources=(
                m.AlterConfigsResource(
                    resource_type=4,
                    resource_name=name,
                    configs=tuple(
                        m.AlterableConfig(name=k, config_operation=op, value=v) for k, op, v in ops
                    ),
                ),
            ),
            validate_only=False,
        )
    )
    (r,) = response.responses
    return r.error_code, r.error_message


def test_sources_and_read_only_of_a_broker(wire: KafkaWire) -> None:
    configs = describe(wire, 4, "0")
    assert (configs["num.partitions"].config_source, configs["num.partitions"].read_only) == (STATIC, True)
    assert (configs["log.dirs"].config_source, configs["log.dirs"].read_only) == (STATIC, True)
    assert (configs["log.retention.ms"].config_source, configs["log.retention.ms"].read_only) == (
        DEFAULT,
        False,
    )
    assert configs["log.retention.hours"].read_only  # only the first synonym is dynamic in Kafka
    assert configs["listeners"].read_only  # Strom cannot rebind its listeners live
    assert not configs["max.connections"].read_only and not configs["log.cleaner.io.buffer.size"].read_only
    assert describe(wire, 4, "") == {}  # nothing set on the cluster default yet


def test_cluster_default_then_a_broker_override_with_real_clients(wire: KafkaWire, bootstrap: str) -> None:
    # Neither kafka-python nor confluent-kafka names the cluster default (""): raw IncrementalAlterConfigs.
    assert incremental(wire, "", [("log.retention.ms", 0, "7200000")]) == (ErrorCode.none, None)
    default = describe(wire, 4, "")
    assert list(default) == ["log.retention.ms"]
    entry = default["log.retention.ms"]
    assert (entry.value, entry.config_source, entry.read_only) == ("7200000", DYNAMIC_DEFAULT, False)
    mine = describe(wire, 4, "0")["log.retention.ms"]
    assert (mine.value, mine.config_source) == ("7200000", DYNAMIC_DEFAULT)
    # Live: the topic without an override takes the new default at once.
    retention = describe(wire, 2, TOPIC)["retention.ms"]
    assert (retention.value, retention.config_source) == ("7200000", DYNAMIC_DEFAULT)

    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(
        ConfigResource.Type.BROKER,
        "0",
        incremental_configs=[
            ConfigEntry("log.retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=10)
    described = admin.describe_configs([ConfigResource(ConfigResource.Type.BROKER, "0")])
    (future,) = described.values()
    entry = future.result(timeout=10)["log.retention.ms"]
    assert (entry.value, entry.source, entry.is_read_only) == ("3600000", DYNAMIC_BROKER, False)
    mine = describe(wire, 4, "0")["log.retention.ms"]
    assert (mine.value, mine.config_source) == ("3600000", DYNAMIC_BROKER)
    assert [(s.name, s.value, s.source) for s in mine.synonyms][:3] == [
        ("log.retention.ms", "3600000", DYNAMIC_BROKER),
        ("log.retention.ms", "7200000", DYNAMIC_DEFAULT),
        ("log.retention.hours", "168", DEFAULT),
    ]
    assert describe(wire, 2, TOPIC)["retention.ms"].value == "3600000"


def test_refusals_are_invalid_request_with_kafkas_message(wire: KafkaWire) -> None:
    assert incremental(wire, "0", [("log.dirs", 0, "/elsewhere")]) == (
        ErrorCode.invalid_request,
        "Cannot update these configs dynamically: Set(log.dirs)",
    )
    error, message = incremental(wire, "", [("log.retention.ms", 0, "soon")])
    assert error == ErrorCode.invalid_request and "log.retention.ms" in (message or "")
    assert incremental(wire, "7", [("log.retention.ms", 0, "1")]) == (
        ErrorCode.invalid_request,
        "Unexpected broker id, expected 0, but received 7",
    )


def test_connection_limit_on_the_cluster_default(wire: KafkaWire) -> None:
    assert incremental(wire, "", [("max.connections", 0, "500")]) == (ErrorCode.none, None)
    entry = describe(wire, 4, "0")["max.connections"]
    assert (entry.value, entry.config_source, entry.read_only) == ("500", DYNAMIC_DEFAULT, False)


def test_dynamic_configs_survive_a_restart(wire: KafkaWire, broker: BrokerProcess) -> None:
    broker.restart()
    with KafkaWire.connect(broker.bootstrap) as conn:
        mine = describe(conn, 4, "0")
        assert (mine["log.retention.ms"].value, mine["log.retention.ms"].config_source) == (
            "3600000",
            DYNAMIC_BROKER,
        )
        assert describe(conn, 4, "")["max.connections"].value == "500"
        assert describe(conn, 2, TOPIC)["retention.ms"].value == "3600000"
        # Deleting the broker's value falls back to the cluster default.
        assert incremental(conn, "0", [("log.retention.ms", 1, None)]) == (ErrorCode.none, None)
        assert describe(conn, 2, TOPIC)["retention.ms"].value == "7200000"
