"""Client configs: the Java client's names and defaults, values as strings or typed, unknown keys refused."""

from __future__ import annotations

import pytest

from strom.client.config import ADMIN, CONSUMER, PRODUCER, resolve
from strom.client.errors import ConfigException

BOOTSTRAP = {"bootstrap.servers": "127.0.0.1:9092"}


def test_defaults_are_the_java_clients() -> None:
    producer = resolve(PRODUCER, BOOTSTRAP, "producer")
    assert producer["acks"] == "all"
    assert producer["linger.ms"] == 5
    assert producer["batch.size"] == 16384
    assert producer["buffer.memory"] == 32 * 1024 * 1024
    assert producer["enable.idempotence"] is True
    assert producer["max.in.flight.requests.per.connection"] == 5
    consumer = resolve(CONSUMER, BOOTSTRAP, "consumer")
    assert consumer["auto.offset.reset"] == "latest"
    assert consumer["session.timeout.ms"] == 45000
    assert consumer["max.poll.records"] == 500
    assert consumer["partition.assignment.strategy"] == ["range", "cooperative-sticky"]
    assert consumer["group.id"] is None


def test_strings_are_parsed_to_the_keys_types() -> None:
    config = resolve(
        PRODUCER,
        {**BOOTSTRAP, "linger.ms": "20", "enable.idempotence": "FALSE", "acks": "1"},
        "producer",
    )
    assert config["linger.ms"] == 20
    assert config["enable.idempotence"] is False
    consumer = resolve(
        CONSUMER,
        {"bootstrap.servers": ["a:1", "b:2"], "partition.assignment.strategy": "range, roundrobin"},
        "consumer",
    )
    assert consumer["bootstrap.servers"] == ["a:1", "b:2"]
    assert consumer["partition.assignment.strategy"] == ["range", "roundrobin"]


def test_client_ids_are_numbered_per_kind_unless_given() -> None:
    first = resolve(ADMIN, BOOTSTRAP, "adminclient")["client.id"]
    second = resolve(ADMIN, BOOTSTRAP, "adminclient")["client.id"]
    assert first.startswith("adminclient-") and second.startswith("adminclient-") and first != second
    assert resolve(ADMIN, {**BOOTSTRAP, "client.id": "mine"}, "adminclient")["client.id"] == "mine"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"lingr.ms": 5}, "unknown configuration lingr.ms"),
        ({"linger.ms": "soon"}, "invalid value 'soon' for configuration linger.ms"),
        ({"linger.ms": -1}, "invalid value -1 for configuration linger.ms"),
        ({"linger.ms": 1.5}, "linger.ms"),
        ({"enable.idempotence": "yes"}, "enable.idempotence"),
        ({"acks": "2"}, "one of all, -1, 0, 1"),
        ({"compression.type": "brotli"}, "compression.type"),
    ],
)
def test_bad_configs_raise_config_exception(values: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigException, match=message):
        resolve(PRODUCER, {**BOOTSTRAP, **values}, "producer")


def test_bootstrap_servers_are_required() -> None:
    with pytest.raises(ConfigException, match=r"bootstrap\.servers"):
        resolve(CONSUMER, {}, "consumer")
    with pytest.raises(ConfigException, match=r"bootstrap\.servers"):
        resolve(CONSUMER, {"bootstrap.servers": " , "}, "consumer")
