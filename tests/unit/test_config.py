"""Broker configuration (server.properties, --override) and per-topic log configuration."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from strom.broker.config import (
    BROKER_CONFIGS,
    ConfigError,
    KafkaConfig,
    Listener,
    load_properties,
    parse_properties,
)
from strom.storage.log_config import (
    BROKER_SYNONYMS,
    LONG_MAX,
    TOPIC_CONFIGS,
    ConfigSource,
    ConfigSynonym,
    ConfigType,
    InvalidConfigError,
    LogConfig,
    describe_topic_config,
)

# Kafka 4.x's stock config/server.properties, shared with the `strom serve` integration test.
STOCK_KRAFT_SERVER_PROPERTIES = (Path(__file__).parents[1] / "data" / "kafka-4-server.properties").read_text()


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


# --- .properties syntax ---


def test_properties_separators_comments_and_whitespace() -> None:
    text = (
        "# a comment\n"
        "! another comment\n"
        "   \n"
        "a=1\n"
        "b : 2\n"
        "c 3\n"
        "  d\t=\t4  \n"  # leading whitespace dropped, trailing kept (Java keeps it)
        "e=\n"
        "f\n"
        "g==x\n"
        "h=a=b:c\n"
    )
    assert parse_properties(text) == {
        "a": "1",
        "b": "2",
        "c": "3",
        "d": "4  ",
        "e": "",
        "f": "",
        "g": "=x",
        "h": "a=b:c",
    }


def test_properties_continuation_and_escapes() -> None:
    text = (
        "fruits = apple, \\\n"
        "         banana, \\\n"
        "\tpear\n"
        "even\\\\=backslash-is-literal\\\\\n"
        "next=1\n"
        "tab=a\\tb\\nc\n"
        "uni=caf\\u00e9\n"
        "key\\ with\\ spaces=v\n"
        "key\\=eq\\:col=w\n"
        "other=\\q\n"
        "# comment ending in backslash does not continue \\\n"
        "after=comment\n"
    )
    props = parse_properties(text)
    assert props["fruits"] == "apple, banana, pear"
    assert props["even\\"] == "backslash-is-literal\\"
    assert props["next"] == "1"
    assert props["tab"] == "a\tb\nc"
    assert props["uni"] == "café"
    assert props["key with spaces"] == "v"
    assert props["key=eq:col"] == "w"
    assert props["other"] == "q"
    assert props["after"] == "comment"


def test_properties_crlf_duplicates_and_malformed_unicode(tmp_path: Path) -> None:
    path = tmp_path / "server.properties"
    path.write_bytes(b"a=1\r\nb=2\ra=3\n")
    assert load_properties(path) == {"a": "3", "b": "2"}
    with pytest.raises(ConfigError, match=r"Malformed \\uxxxx encoding in .* line 2"):
        parse_properties("ok=1\nbad=\\u12g4\n", "server.properties")


# --- broker defaults, overrides and synonyms ---


def test_defaults_follow_kafka() -> None:
    cfg = KafkaConfig.from_sources({}, {})
    assert cfg.node_id == 0  # no node.id/broker.id: a single node is node 0
    assert cfg.listeners == [Listener("PLAINTEXT", "", 9092, "PLAINTEXT")]
    assert cfg.advertised_listeners == cfg.listeners
    assert cfg.log_dirs == ["/tmp/kafka-logs"]
    assert cfg.num_partitions == 1
    assert cfg.default_replication_factor == 1
    assert cfg.auto_create_topics_enable and cfg.delete_topic_enable
    assert cfg.log_segment_bytes == 1024**3
    assert cfg.log_roll_ms == cfg.log_retention_ms == 7 * 24 * 3600 * 1000
    assert cfg.log_retention_bytes == -1
    assert cfg.log_flush_interval_messages == cfg.log_flush_interval_ms == LONG_MAX
    assert cfg.log_message_timestamp_after_max_ms == 3600000
    assert cfg.message_max_bytes == 1048588
    assert cfg.socket_request_max_bytes == 104857600
    assert cfg.connections_max_idle_ms == 600000
    assert cfg.compression_type == "producer"
    assert cfg.offsets_topic_num_partitions == 50
    assert cfg.group_initial_rebalance_delay_ms == 3000
    assert cfg.offsets_retention_ms == 7 * 24 * 3600 * 1000
    assert cfg.socket_send_buffer_bytes == cfg.socket_receive_buffer_bytes == 102400
    # Kafka's 3 / 3 / 2 (a single node, without zookeeper.connect, keeps one replica whatever they say).
    assert cfg.offsets_topic_replication_factor == 3
    assert cfg.get("transaction.state.log.replication.factor") == "3"
    assert cfg.get("transaction.state.log.min.isr") == "2"
    assert cfg.replica_lag_time_max_ms == 30000
    assert cfg.zookeeper_session_timeout_ms == 18000
    assert not cfg.unclean_leader_election_enable
    assert not cfg.in_cluster
    assert cfg.default_log_config == LogConfig()


def test_overrides_win_over_properties() -> None:
    cfg = KafkaConfig.from_sources(
        {"num.partitions": "3", "log.dirs": "/a,/b", "delete.topic.enable": "true"},
        {"num.partitions": "6", "delete.topic.enable": "FALSE"},
    )
    assert cfg.num_partitions == 6
    assert cfg.delete_topic_enable is False
    assert cfg.log_dirs == ["/a", "/b"]
    assert cfg.get("num.partitions") == "6"
    assert cfg.get("num.io.threads") == "8"  # default of a known key
    assert cfg.get("no.such.key") is None


def test_log_dirs_over_log_dir() -> None:
    assert KafkaConfig.from_sources({"log.dir": "/x"}).log_dirs == ["/x"]
    assert KafkaConfig.from_sources({"log.dir": "/x", "log.dirs": " /y , /z "}).log_dirs == ["/y", "/z"]
    with pytest.raises(ConfigError, match="Duplicate log directory"):
        KafkaConfig.from_sources({"log.dirs": "/y,/y"})


@pytest.mark.parametrize(
    ("props", "expected_ms"),
    [
        ({"log.retention.hours": "2"}, 2 * 3600000),
        ({"log.retention.hours": "2", "log.retention.minutes": "5"}, 5 * 60000),
        ({"log.retention.hours": "2", "log.retention.minutes": "5", "log.retention.ms": "1234"}, 1234),
        ({"log.retention.hours": "-1"}, -1),
        ({"log.retention.ms": "-7"}, -1),  # any negative time means no limit
    ],
)
def test_retention_synonym_precedence(props: dict[str, str], expected_ms: int) -> None:
    cfg = KafkaConfig.from_sources(props)
    assert cfg.log_retention_ms == expected_ms
    assert LogConfig.from_props({}, cfg.log_config_defaults()).retention_ms == expected_ms
    # A topic override beats every broker synonym.
    assert LogConfig.from_props({"retention.ms": "99"}, cfg.log_config_defaults()).retention_ms == 99


def test_roll_and_flush_synonyms() -> None:
    cfg = KafkaConfig.from_sources({"log.roll.hours": "1", "log.roll.jitter.hours": "1"})
    assert (cfg.log_roll_ms, cfg.log_roll_jitter_ms) == (3600000, 3600000)
    cfg = KafkaConfig.from_sources({"log.roll.hours": "1", "log.roll.ms": "500"})
    assert cfg.log_roll_ms == 500
    cfg = KafkaConfig.from_sources({"log.flush.scheduler.interval.ms": "2000"})
    assert cfg.log_flush_interval_ms == 2000  # flush.ms falls back to the scheduler interval
    assert cfg.log_flush_scheduler_interval_ms == 2000
    cfg = KafkaConfig.from_sources({"log.flush.scheduler.interval.ms": "2000", "log.flush.interval.ms": "10"})
    assert cfg.log_flush_interval_ms == 10


def test_log_config_defaults_are_the_explicit_topic_default_keys() -> None:
    cfg = KafkaConfig.from_sources(
        {"log.segment.bytes": " 2097152 ", "num.partitions": "4", "message.max.bytes": "2000000"}
    )
    assert cfg.log_config_defaults() == {"log.segment.bytes": "2097152", "message.max.bytes": "2000000"}
    log_config = LogConfig.from_props({}, cfg.log_config_defaults())
    assert (log_config.segment_bytes, log_config.max_message_bytes) == (2097152, 2000000)
    assert cfg.message_max_bytes == 2000000


# --- invalid values: one line, Kafka's words ---


@pytest.mark.parametrize(
    ("props", "message"),
    [
        (
            {"num.partitions": "abc"},
            "Invalid value abc for configuration num.partitions: Not a number of type INT",
        ),
        (
            {"num.partitions": "0"},
            "Invalid value 0 for configuration num.partitions: Value must be at least 1",
        ),
        ({"num.partitions": "2147483648"}, "Not a number of type INT"),
        ({"log.retention.check.interval.ms": "1.5"}, "Not a number of type LONG"),
        ({"offsets.topic.replication.factor": "40000"}, "Not a number of type SHORT"),
        ({"auto.create.topics.enable": "yes"}, "Expected value to be either true or false"),
        (
            {"compression.type": "brotli"},
            "String must be one of: uncompressed, zstd, lz4, snappy, gzip, producer",
        ),
        ({"log.cleanup.policy": "delete,shred"}, "Invalid value shred for configuration log.cleanup.policy"),
        ({"log.segment.bytes": "1000"}, "log.segment.bytes: Value must be at least 1048576"),
        ({"compression.gzip.level": "0"}, "Value must be between 1 and 9, or -1"),
        ({"log.roll.ms": "0"}, "Invalid value 0 for configuration log.roll.ms: Value must be at least 1"),
        ({"num.io.threads": "many"}, "num.io.threads: Not a number of type INT"),  # accepted keys are checked
        (
            {"listeners": "PLAINTEXT://:9092,SSL://:9093"},
            "uses security protocol SSL; Strom supports only PLAINTEXT",
        ),
        ({"listeners": "FOO://:9092"}, "No security protocol defined for listener FOO"),
        ({"listeners": "localhost:9092"}, "Unable to parse localhost:9092 to a listener"),
        ({"listeners": "PLAINTEXT://:70000"}, "Port 70000"),
        (
            {"listeners": "A://:1,B://:1", "listener.security.protocol.map": "A:PLAINTEXT,B:PLAINTEXT"},
            "Each listener must have a different port",
        ),
        ({"listeners": "PLAINTEXT://:1,plaintext://:2"}, "Each listener must have a different name"),
        ({"listener.security.protocol.map": "PLAINTEXT:TLS"}, "Unknown security protocol TLS"),
        (
            {
                "advertised.listeners": "OTHER://h:1",
                "listener.security.protocol.map": "OTHER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            },
            "Listener OTHER is not one of the listeners (PLAINTEXT)",
        ),
        ({"advertised.listeners": "PLAINTEXT://0.0.0.0:9092"}, "nonroutable meta-address 0.0.0.0"),
        (
            {"listeners": "CONTROLLER://:9093", "controller.listener.names": "CONTROLLER"},
            "No listener is left",
        ),
        ({"node.id": "1", "broker.id": "2"}, "must be equal to node.id (1)"),
        ({"log.dirs": " , "}, "At least one log directory must be defined"),
        (
            {"queued.max.request.bytes": "1024"},
            "queued.max.request.bytes must be larger or equal to socket.request.max.bytes",
        ),
        ({"max.connections.per.ip": "0"}, "can be set to zero only if max.connections.per.ip.overrides"),
        ({"max.connections.per.ip.overrides": "host-without-count"}, "expected host:count"),
    ],
)
def test_invalid_values_give_one_line_config_error(props: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        KafkaConfig.from_sources(props, {})
    text = str(info.value)
    assert message in text
    assert "\n" not in text
    assert isinstance(info.value, ValueError)


def test_unknown_keys_warn_once_each(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="strom.broker.config")
    KafkaConfig.from_sources(
        {"process.roles": "broker", "controller.quorum.voters": "1@localhost:9093", "num.io.threads": "4"},
        {"process.roles": "broker,controller", "foo.bar": "1"},
    )
    warnings = warnings_of(caplog)
    assert len(warnings) == 3
    for key in ("process.roles", "controller.quorum.voters", "foo.bar"):
        assert sum(f"'{key}'" in w and "isn't a known config" in w for w in warnings) == 1
    assert not any("num.io.threads" in w for w in warnings)  # known to Kafka: accepted quietly


def test_stock_kraft_server_properties_loads(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "server.properties"
    path.write_text(STOCK_KRAFT_SERVER_PROPERTIES)
    caplog.set_level(logging.WARNING, logger="strom.broker.config")
    cfg = KafkaConfig.from_sources(load_properties(path), {})
    assert cfg.node_id == 1
    assert [str(x) for x in cfg.listeners] == ["PLAINTEXT://:9092", "CONTROLLER://:9093"]
    assert cfg.client_listeners() == [Listener("PLAINTEXT", "", 9092, "PLAINTEXT")]
    assert cfg.advertised_listeners == [Listener("PLAINTEXT", "localhost", 9092, "PLAINTEXT")]
    assert cfg.controller_listener_names == ["CONTROLLER"]
    assert cfg.log_dirs == ["/tmp/kraft-combined-logs"]
    assert cfg.get("num.recovery.threads.per.data.dir") == "1"
    assert cfg.log_retention_ms == 168 * 3600000
    warnings = warnings_of(caplog)
    # Exactly: the two KRaft-only keys, and one note about the controller listener.
    assert len(warnings) == 3
    assert any("'process.roles'" in w for w in warnings)
    assert any("'controller.quorum.bootstrap.servers'" in w for w in warnings)
    assert any("CONTROLLER" in w and "controller listener" in w for w in warnings)


def test_listener_hosts_and_names() -> None:
    cfg = KafkaConfig.from_sources(
        {
            "listeners": "plaintext://127.0.0.1:0,INTERNAL://[::1]:9094",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,internal:plaintext",
            "advertised.listeners": "PLAINTEXT://broker.example:9092",
        }
    )
    assert cfg.listeners == [
        Listener("PLAINTEXT", "127.0.0.1", 0, "PLAINTEXT"),
        Listener("INTERNAL", "::1", 9094, "PLAINTEXT"),
    ]
    assert str(cfg.listeners[1]) == "INTERNAL://[::1]:9094"
    assert cfg.advertised_listeners == [Listener("PLAINTEXT", "broker.example", 9092, "PLAINTEXT")]
    # INTERNAL is not advertised: its clients are told the first advertised endpoint.
    assert (
        cfg.advertised_client_listener()
        == cfg.advertised_client_listener("internal")
        == Listener("PLAINTEXT", "broker.example", 9092, "PLAINTEXT")
    )
    both = KafkaConfig.from_sources(
        {
            "listeners": "A://:1,B://:2",
            "advertised.listeners": "A://a:1,B://b:2",
            "listener.security.protocol.map": "A:PLAINTEXT,B:PLAINTEXT",
        }
    )
    assert both.advertised_client_listener("B") == Listener("B", "b", 2, "PLAINTEXT")


def test_broker_describe_sources_and_synonyms() -> None:
    cfg = KafkaConfig.from_sources(
        {"log.retention.minutes": "30", "node.id": "3"}, {"process.roles": "broker"}
    )
    entries = {e.name: e for e in cfg.describe()}
    assert set(BROKER_CONFIGS) <= set(entries)

    minutes = entries["log.retention.minutes"]
    assert (minutes.value, minutes.source, minutes.read_only) == (
        "30",
        ConfigSource.STATIC_BROKER_CONFIG,
        True,
    )
    assert minutes.synonyms == (
        ConfigSynonym("log.retention.minutes", "30", ConfigSource.STATIC_BROKER_CONFIG),
        ConfigSynonym("log.retention.hours", "168", ConfigSource.DEFAULT_CONFIG),
    )
    unset_ms = entries["log.retention.ms"]
    assert (unset_ms.value, unset_ms.source, unset_ms.read_only) == (None, ConfigSource.DEFAULT_CONFIG, False)

    io_threads = entries["num.io.threads"]
    assert (io_threads.value, io_threads.source, io_threads.config_type) == (
        "8",
        ConfigSource.DEFAULT_CONFIG,
        3,
    )
    assert entries["listeners"].value == "PLAINTEXT://:9092"
    assert entries["log.cleanup.policy"].config_type == 7
    assert entries["broker.id"].value == entries["node.id"].value == "3"
    assert entries["broker.id"].source == ConfigSource.STATIC_BROKER_CONFIG

    unknown = entries["process.roles"]
    assert (unknown.value, unknown.is_sensitive, unknown.config_type) == (None, True, 0)


# --- topic configs ---


def test_topic_config_table_covers_kafka_41() -> None:
    expected = {
        "cleanup.policy",
        "compression.gzip.level",
        "compression.lz4.level",
        "compression.type",
        "compression.zstd.level",
        "delete.retention.ms",
        "file.delete.delay.ms",
        "flush.messages",
        "flush.ms",
        "follower.replication.throttled.replicas",
        "index.interval.bytes",
        "leader.replication.throttled.replicas",
        "local.retention.bytes",
        "local.retention.ms",
        "max.compaction.lag.ms",
        "max.message.bytes",
        "message.timestamp.after.max.ms",
        "message.timestamp.before.max.ms",
        "message.timestamp.type",
        "min.cleanable.dirty.ratio",
        "min.compaction.lag.ms",
        "min.insync.replicas",
        "preallocate",
        "remote.log.copy.disable",
        "remote.log.delete.on.disable",
        "remote.storage.enable",
        "retention.bytes",
        "retention.ms",
        "segment.bytes",
        "segment.index.bytes",
        "segment.jitter.ms",
        "segment.ms",
        "unclean.leader.election.enable",
    }
    assert set(TOPIC_CONFIGS) == expected
    assert [s.name for s in TOPIC_CONFIGS["retention.ms"].synonyms] == [
        "log.retention.ms",
        "log.retention.minutes",
        "log.retention.hours",
    ]
    assert [s.name for s in TOPIC_CONFIGS["max.message.bytes"].synonyms] == ["message.max.bytes"]
    assert [s.name for s in TOPIC_CONFIGS["segment.bytes"].synonyms] == ["log.segment.bytes"]
    assert [s.name for s in TOPIC_CONFIGS["min.cleanable.dirty.ratio"].synonyms] == [
        "log.cleaner.min.cleanable.ratio"
    ]
    assert TOPIC_CONFIGS["remote.storage.enable"].synonyms == ()
    assert TOPIC_CONFIGS["cleanup.policy"].type == "LIST"  # ConfigType compares as Kafka's type name
    assert TOPIC_CONFIGS["cleanup.policy"].default_string() == "delete"
    assert [
        ConfigType(t).id
        for t in ("BOOLEAN", "STRING", "INT", "SHORT", "LONG", "DOUBLE", "LIST", "CLASS", "PASSWORD")
    ] == list(range(1, 10))
    # Every LogConfig field is a topic config and vice versa.
    assert {d.attribute for d in TOPIC_CONFIGS.values()} == {f.name for f in dataclasses.fields(LogConfig)}
    # Every broker synonym is a known broker key.
    assert set(BROKER_SYNONYMS) <= set(BROKER_CONFIGS)


def test_log_config_defaults_match_the_table() -> None:
    log_config = LogConfig.from_props({})
    for definition in TOPIC_CONFIGS.values():
        assert getattr(log_config, definition.attribute) == definition.default, definition.name
    assert log_config == LogConfig()


def test_log_config_parses_every_type() -> None:
    log_config = LogConfig.from_props(
        {
            "cleanup.policy": " compact , delete ",
            "min.cleanable.dirty.ratio": "0.25",
            "preallocate": "TRUE",
            "retention.bytes": "-1",
            "segment.bytes": "1048576",
            "leader.replication.throttled.replicas": "0:1, 1:2",
            "follower.replication.throttled.replicas": "*",
            "compression.type": "zstd",
            "compression.zstd.level": "-5",
            "message.timestamp.type": "LogAppendTime",
            "min.compaction.lag.ms": "10",
            "max.compaction.lag.ms": "10",
        }
    )
    assert log_config.cleanup_policy == ("compact", "delete")
    assert log_config.compact and log_config.delete
    assert log_config.min_cleanable_dirty_ratio == 0.25
    assert log_config.preallocate is True
    assert log_config.segment_bytes == 1048576
    assert log_config.leader_replication_throttled_replicas == ("0:1", "1:2")
    assert log_config.follower_replication_throttled_replicas == ("*",)
    assert (log_config.compression_type, log_config.compression_zstd_level) == ("zstd", -5)
    assert log_config.message_timestamp_type == "LogAppendTime"
    assert LogConfig.from_props({"cleanup.policy": ""}).cleanup_policy == ()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"foo": "1"}, "Unknown topic config name: foo"),
        (
            {"retention.ms": "abc"},
            "Invalid value abc for configuration retention.ms: Not a number of type LONG",
        ),
        (
            {"retention.ms": "-2"},
            "Invalid value -2 for configuration retention.ms: Value must be at least -1",
        ),
        ({"segment.bytes": "1048575"}, "segment.bytes: Value must be at least 1048576"),
        ({"min.cleanable.dirty.ratio": "1.5"}, "Value must be no more than 1"),
        ({"min.cleanable.dirty.ratio": "x"}, "Not a number of type DOUBLE"),
        ({"cleanup.policy": "compact,forever"}, "Invalid value forever for configuration cleanup.policy"),
        ({"compression.type": "GZIP"}, "String must be one of"),  # case-sensitive, like Kafka
        ({"compression.lz4.level": "18"}, "Value must be no more than 17"),
        ({"preallocate": "1"}, "Expected value to be either true or false"),
        ({"leader.replication.throttled.replicas": "0-1"}, "must be the literal '*' or a list of replicas"),
        (
            {"min.compaction.lag.ms": "5", "max.compaction.lag.ms": "4"},
            "conflict topic config setting min.compaction.lag.ms (5) > max.compaction.lag.ms (4)",
        ),
        ({"remote.storage.enable": "true"}, "Tiered Storage functionality is disabled in the broker"),
        ({"message.timestamp.type": "BrokerTime"}, "String must be one of: CreateTime, LogAppendTime"),
    ],
)
def test_topic_config_validation(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidConfigError) as info:
        LogConfig.from_props(overrides, {})
    assert message in str(info.value)


def test_invalid_broker_synonym_is_reported_under_the_broker_key() -> None:
    with pytest.raises(
        InvalidConfigError, match=r"for configuration log\.retention\.hours: Not a number of type INT"
    ):
        LogConfig.from_props({}, {"log.retention.hours": "week"})
    # Only the synonyms of configs the topic does not override are consulted (KafkaConfig rejects such a
    # broker value at startup anyway).
    assert LogConfig.from_props({"retention.ms": "5"}, {"log.retention.hours": "week"}).retention_ms == 5


def test_describe_topic_config_sources_and_synonyms() -> None:
    broker = {"log.retention.minutes": "30", "log.segment.bytes": "2097152", "num.partitions": "3"}
    entries = {e.name: e for e in describe_topic_config({"cleanup.policy": "compact,delete"}, broker)}
    assert set(entries) == set(TOPIC_CONFIGS)
    assert list(entries) == sorted(entries)

    policy = entries["cleanup.policy"]
    assert (policy.value, policy.source, policy.config_type) == (
        "compact,delete",
        ConfigSource.TOPIC_CONFIG,
        7,
    )
    assert policy.synonyms == (
        ConfigSynonym("cleanup.policy", "compact,delete", ConfigSource.TOPIC_CONFIG),
        ConfigSynonym("log.cleanup.policy", "delete", ConfigSource.DEFAULT_CONFIG),
    )

    retention = entries["retention.ms"]
    assert (retention.value, retention.source) == ("1800000", ConfigSource.STATIC_BROKER_CONFIG)
    assert retention.synonyms == (
        ConfigSynonym("log.retention.minutes", "30", ConfigSource.STATIC_BROKER_CONFIG),
        ConfigSynonym("log.retention.hours", "168", ConfigSource.DEFAULT_CONFIG),
    )

    segment = entries["segment.bytes"]
    assert (segment.value, segment.source) == ("2097152", ConfigSource.STATIC_BROKER_CONFIG)

    ratio = entries["min.cleanable.dirty.ratio"]
    assert (ratio.value, ratio.source, ratio.config_type) == ("0.5", ConfigSource.DEFAULT_CONFIG, 6)
    flush = entries["flush.ms"]
    assert flush.value == str(LONG_MAX)
    assert flush.synonyms == (
        ConfigSynonym("log.flush.scheduler.interval.ms", str(LONG_MAX), ConfigSource.DEFAULT_CONFIG),
    )
    remote = entries["remote.storage.enable"]
    assert (remote.value, remote.source, remote.synonyms) == ("false", ConfigSource.DEFAULT_CONFIG, ())
    assert all(not e.read_only and not e.is_sensitive and e.documentation for e in entries.values())


def test_connection_limits_are_read() -> None:
    config = KafkaConfig.from_sources(
        {
            "queued.max.requests": "7",
            "queued.max.request.bytes": "-1",
            "max.connections": "100",
            "max.connections.per.ip": "0",
            "max.connections.per.ip.overrides": "127.0.0.1:5, [::1]:6",
            "fetch.max.bytes": "4096",
        },
        {},
    )
    assert config.queued_max_requests == 7 and config.queued_max_request_bytes == -1
    assert config.max_connections == 100 and config.max_connections_per_ip == 0
    assert config.max_connections_per_ip_overrides == {"127.0.0.1": 5, "::1": 6}
    assert config.fetch_max_bytes == 4096
    # Kafka's default is unbounded; Strom's bounds request memory (docs/CONFIGURATION.md).
    assert KafkaConfig.from_sources({}, {}).queued_max_request_bytes == 256 << 20
