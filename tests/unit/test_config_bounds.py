"""Bounds of broker and topic configs: Kafka's validators and cross-checks, plus the few bounds Strom
adds where Kafka has none and a value would stop the cleaner, the broker or its shutdown."""

from __future__ import annotations

import pytest

from strom.broker.config import ConfigError, KafkaConfig
from strom.broker.dynamic_config import DynamicConfigRefused, check_thread_counts
from strom.storage.log_config import InvalidConfigError, LogConfig

DIRS = {"log.dirs": "/tmp/strom-config-bounds"}


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("log.cleaner.io.max.bytes.per.second", "0.001", "at least 1"),
        ("log.cleaner.io.max.bytes.per.second", "1e-300", "at least 1"),
        ("log.cleaner.io.max.bytes.per.second", "NaN", "finite"),
        ("log.cleaner.io.max.bytes.per.second", "Infinity", "finite"),
        ("log.cleaner.io.buffer.load.factor", "NaN", "finite"),
        ("log.cleaner.io.buffer.load.factor", "0", "greater than 0"),
        ("log.cleaner.io.buffer.load.factor", "1.5", "no more than 1"),
        ("log.cleaner.io.buffer.size", "0", "at least 1"),
        ("log.cleaner.threads", "0", "at least 1"),
        ("log.cleaner.dedupe.buffer.size", "-1", "1MB per cleaner thread"),
        ("log.cleaner.dedupe.buffer.size", str(1024 * 1024), "1MB per cleaner thread"),
        ("num.replica.fetchers", "0", "at least 1"),
        ("max.connections", "-1", "at least 0"),
        ("log.cleaner.min.cleanable.ratio", "NaN", "finite"),
        ("replica.fetch.wait.max.ms", "40000", "replica.socket.timeout.ms should always be at least"),
    ],
)
def test_a_value_out_of_bounds_is_refused_statically_and_dynamically(
    key: str, value: str, reason: str
) -> None:
    with pytest.raises(ConfigError, match=reason):
        KafkaConfig.from_sources({**DIRS, key: value})
    static = KafkaConfig.from_sources(DIRS)
    for default, own in (({key: value}, {}), ({}, {key: value})):
        with pytest.raises(ConfigError, match=reason):
            static.with_dynamic(default, own)


def test_replica_fetch_wait_may_not_exceed_the_lag_time() -> None:
    with pytest.raises(ConfigError, match=r"less than or equal to replica\.lag\.time\.max\.ms"):
        KafkaConfig.from_sources(
            {**DIRS, "replica.fetch.wait.max.ms": "2000", "replica.lag.time.max.ms": "1000"}
        )


def test_the_dedupe_buffer_is_checked_per_cleaner_thread() -> None:
    two_mib = str(2 * 1024 * 1024)
    assert KafkaConfig.from_sources({**DIRS, "log.cleaner.dedupe.buffer.size": two_mib + "0"})
    with pytest.raises(ConfigError, match="1MB per cleaner thread"):
        KafkaConfig.from_sources(
            {**DIRS, "log.cleaner.dedupe.buffer.size": two_mib, "log.cleaner.threads": "2"}
        )


def test_bounds_still_accept_the_defaults_and_ordinary_values() -> None:
    config = KafkaConfig.from_sources(
        {
            **DIRS,
            "log.cleaner.io.max.bytes.per.second": "1048576",
            "log.cleaner.io.buffer.load.factor": "1",
            "max.connections": "0",
            "controlled.shutdown.max.retries": "0",
        }
    )
    assert config.cleaner_config.io_max_bytes_per_second == 1048576
    assert config.controller_socket_timeout_ms == 30000


@pytest.mark.parametrize(
    ("key", "before", "after", "reason"),
    [
        ("num.replica.fetchers", "1", "2147483647", "not be greater than double the current value 1"),
        ("num.replica.fetchers", "8", "3", "at least half the current value 8"),
        ("num.io.threads", "8", "17", "not be greater than double"),
        ("log.cleaner.threads", "1", "3", "more than double the current value 1"),
        ("log.cleaner.threads", "4", "1", "less than half the current value 4"),
    ],
)
def test_a_dynamic_thread_count_moves_at_most_by_half_or_double(
    key: str, before: str, after: str, reason: str
) -> None:
    old = KafkaConfig.from_sources({**DIRS, key: before})
    with pytest.raises(DynamicConfigRefused, match=reason):
        check_thread_counts(old, old.with_dynamic({key: after}, {}))
    doubled = str(int(before) * 2)
    check_thread_counts(old, old.with_dynamic({key: doubled}, {}))


@pytest.mark.parametrize("value", ["NaN", "nan", "-Infinity", "inf"])
def test_a_topic_ratio_that_is_not_a_finite_number_is_refused(value: str) -> None:
    with pytest.raises(InvalidConfigError, match="finite"):
        LogConfig.from_props({"min.cleanable.dirty.ratio": value})


def test_the_inter_broker_listener_is_exempt_from_max_connections_only() -> None:
    from strom.broker.network import ConnectionQuotas

    quotas = ConnectionQuotas(max_connections=0, max_per_ip=1)
    assert quotas.admit("10.0.0.1") is not None  # a client: refused at max.connections=0
    assert quotas.admit("10.0.0.1", protected=True) is None  # a peer on the inter-broker listener
    assert quotas.admit("10.0.0.1", protected=True) is not None  # but the per-address limit holds


def test_the_inter_broker_listener_must_be_advertised() -> None:
    two = {**DIRS, "listeners": "PLAINTEXT://:9092,INTERNAL://:9093"}
    protocols = {"listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT"}
    assert KafkaConfig.from_sources({**two, **protocols}).inter_broker_listener_name == "PLAINTEXT"
    named = KafkaConfig.from_sources({**two, **protocols, "inter.broker.listener.name": "internal"})
    assert named.inter_broker_listener_name == "INTERNAL"
    with pytest.raises(ConfigError, match=r"must be a listener name defined in advertised\.listeners"):
        KafkaConfig.from_sources({**two, **protocols, "inter.broker.listener.name": "REPLICATION"})
