"""Per-topic log configuration: Kafka 4.1's topic-level configs, their broker synonyms and defaults.

A topic's effective value of a config is, in order: the topic's override, else the first broker
synonym the broker's configuration sets (``retention.ms`` <- ``log.retention.ms``,
``log.retention.minutes``, ``log.retention.hours``), else Kafka's default. Values are parsed and
validated the way Kafka's ``ConfigDef`` does, and errors read like Kafka's.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import ClassVar, Protocol

LONG_MAX = 2**63 - 1
LONG_MIN = -(2**63)
INT_MAX = 2**31 - 1
INT_MIN = -(2**31)
SHORT_MAX = 2**15 - 1
SHORT_MIN = -(2**15)

HOUR_MS = 3_600_000
MINUTE_MS = 60_000

# A parsed config value; LIST values are tuples so that LogConfig stays hashable.
Value = bool | int | float | str | tuple[str, ...] | None


class InvalidConfigError(ValueError):
    """A config name or value Kafka would reject (INVALID_CONFIG on the wire)."""


class ConfigType(enum.StrEnum):
    """Kafka's ConfigDef.Type; ``id`` is DescribeConfigs' numeric config_type."""

    BOOLEAN = "BOOLEAN"
    STRING = "STRING"
    INT = "INT"
    SHORT = "SHORT"
    LONG = "LONG"
    DOUBLE = "DOUBLE"
    LIST = "LIST"
    CLASS = "CLASS"
    PASSWORD = "PASSWORD"

    @property
    def id(self) -> int:
        return _CONFIG_TYPE_IDS[self]


_CONFIG_TYPE_IDS = {t: i for i, t in enumerate(ConfigType, start=1)}
CONFIG_TYPE_UNKNOWN = 0


class ConfigSource(enum.IntEnum):
    """DescribeConfigs' config_source values."""

    UNKNOWN = 0
    TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5
    DYNAMIC_BROKER_LOGGER_CONFIG = 6
    CLIENT_METRICS_CONFIG = 7
    GROUP_CONFIG = 8


def _invalid(name: str, value: object, reason: str) -> InvalidConfigError:
    return InvalidConfigError(f"Invalid value {value} for configuration {name}: {reason}")


# --- validators: each checks a parsed value and knows how Kafka's docs print its valid values ---


class Validator(Protocol):
    def check(self, name: str, value: Value) -> None:
        """Raise InvalidConfigError if ``value`` (already parsed) is not allowed for config ``name``."""

    def describe(self) -> str:
        """The valid values as Kafka's documentation prints them."""


def _number_text(n: int | float) -> str:
    return str(int(n)) if isinstance(n, float) and n.is_integer() else str(n)


@dataclass(frozen=True)
class Range:
    """Kafka's Range.atLeast / Range.between; ``above_min``: the minimum itself is excluded (a
    fraction that must not be 0, where Kafka has no validator)."""

    min: int | float | None = None
    max: int | float | None = None
    above_min: bool = False

    def check(self, name: str, value: Value) -> None:
        assert isinstance(value, int | float)
        if self.min is not None and (value <= self.min if self.above_min else value < self.min):
            word = "greater than" if self.above_min else "at least"
            raise _invalid(name, value, f"Value must be {word} {_number_text(self.min)}")
        if self.max is not None and value > self.max:
            raise _invalid(name, value, f"Value must be no more than {_number_text(self.max)}")

    def describe(self) -> str:
        low = f"({_number_text(self.min or 0)}" if self.above_min else f"[{_number_text(self.min or 0)}"
        if self.max is None:
            return f"{low},...]"
        return f"{low},...,{_number_text(self.max)}]"


@dataclass(frozen=True)
class OneOf:
    """Kafka's ValidString.in (case-sensitive); applied to each element of a LIST value."""

    choices: tuple[str, ...]

    def check(self, name: str, value: Value) -> None:
        for item in value if isinstance(value, tuple) else (value,):
            if item not in self.choices:
                raise _invalid(name, item, f"String must be one of: {', '.join(self.choices)}")

    def describe(self) -> str:
        return f"[{', '.join(self.choices)}]"


@dataclass(frozen=True)
class GzipLevel:
    """gzip levels are 1..9, or -1 for zlib's default."""

    def check(self, name: str, value: Value) -> None:
        assert isinstance(value, int)
        if value != -1 and not 1 <= value <= 9:
            raise _invalid(name, value, "Value must be between 1 and 9, or -1")

    def describe(self) -> str:
        return "[1,...,9] or -1"


_THROTTLED_REPLICA = re.compile(r"([0-9]+:[0-9]+)?")


@dataclass(frozen=True)
class ThrottledReplicas:
    """'*' or a list of partitionId:brokerId pairs."""

    def check(self, name: str, value: Value) -> None:
        assert isinstance(value, tuple)
        if "".join(value) == "*" or all(_THROTTLED_REPLICA.fullmatch(v) for v in value):
            return
        raise _invalid(
            name,
            ",".join(value),
            f"{name} must be the literal '*' or a list of replicas in the following format: "
            "[partitionId]:[brokerId],[partitionId]:[brokerId],...",
        )

    def describe(self) -> str:
        return "[partitionId]:[brokerId],[partitionId]:[brokerId],..."


# --- parsing and rendering, as Kafka's ConfigDef.parseType / convertToString ---


def parse_value(name: str, raw: str, type_: ConfigType) -> Value:
    """Parse a config string the way Kafka does (surrounding whitespace is ignored)."""
    text = raw.strip()
    if type_ is ConfigType.BOOLEAN:
        if text.lower() == "true":
            return True
        if text.lower() == "false":
            return False
        raise _invalid(name, raw, "Expected value to be either true or false")
    if type_ in (ConfigType.INT, ConfigType.SHORT, ConfigType.LONG):
        bounds = {
            ConfigType.INT: (INT_MIN, INT_MAX),
            ConfigType.SHORT: (SHORT_MIN, SHORT_MAX),
            ConfigType.LONG: (LONG_MIN, LONG_MAX),
        }[type_]
        # Java's parseInt/parseLong: optional sign, ASCII digits only.
        if not re.fullmatch(r"[+-]?[0-9]+", text) or not bounds[0] <= int(text) <= bounds[1]:
            raise _invalid(name, raw, f"Not a number of type {type_}")
        return int(text)
    if type_ is ConfigType.DOUBLE:
        try:
            if "_" in text:  # Python accepts digit separators, Java does not
                raise ValueError(text)
            value = float(text)
        except ValueError:
            raise _invalid(name, raw, "Not a number of type DOUBLE") from None
        # Java parses NaN and Infinity, and no range check refuses NaN (every comparison is false):
        # Strom refuses both, so no ratio, rate or load factor is ever NaN or infinite.
        if not math.isfinite(value):
            raise _invalid(name, raw, "Value must be a finite number")
        return value
    if type_ is ConfigType.LIST:
        return tuple(re.split(r"\s*,\s*", text)) if text else ()
    if type_ is ConfigType.PASSWORD:
        return raw
    return text


def _java_double(value: float) -> str:
    """Java's Double.toString: plain notation in [1e-3, 1e7), else d.dddE±n."""
    if value == 0 or 1e-3 <= abs(value) < 1e7:
        return repr(value)
    mantissa, exponent = f"{value:.16e}".split("e")
    mantissa = mantissa.rstrip("0")
    if mantissa.endswith("."):
        mantissa += "0"
    return f"{mantissa}E{int(exponent)}"


def render_value(value: Value, type_: ConfigType) -> str | None:
    """A parsed value as Kafka renders it in DescribeConfigs."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, float):
        return _java_double(value)
    return str(value)


# --- the topic config table ---


@dataclass(frozen=True)
class BrokerSynonym:
    """A broker config that supplies a topic config's default (e.g. log.retention.hours for retention.ms).

    ``factor`` converts the broker unit to the topic's (hours -> ms); ``default`` is Kafka's default for
    the broker key as a string (None: no default); ``validator`` is the broker key's own validation.
    """

    name: str
    type: ConfigType
    default: str | None
    validator: Validator | None = None
    factor: int = 1
    dynamic: bool = False  # Kafka can change it without a restart (it reports read_only=false)


@dataclass(frozen=True)
class TopicConfigDef:
    """A topic config. ``effect``: Strom acts on it; with False it is validated and described only."""

    name: str
    type: ConfigType
    default: Value
    validator: Validator | None
    doc: str
    synonyms: tuple[BrokerSynonym, ...] = ()
    effect: bool = True

    @property
    def attribute(self) -> str:
        """The LogConfig attribute holding this config's effective value."""
        return self.name.replace(".", "_")

    def default_string(self) -> str | None:
        return render_value(self.default, self.type)

    def parse(self, name: str, raw: str) -> Value:
        value = parse_value(name, raw, self.type)
        if self.validator is not None:
            self.validator.check(name, value)
        return value


def _topic(
    name: str,
    type_: ConfigType,
    default: Value,
    validator: Validator | None,
    doc: str,
    *synonyms: BrokerSynonym,
    effect: bool = True,
) -> TopicConfigDef:
    return TopicConfigDef(name, type_, default, validator, doc, synonyms, effect)


def _same(name: str, type_: ConfigType, default: Value, validator: Validator | None) -> BrokerSynonym:
    """The first (dynamic) broker synonym, whose default equals the topic default."""
    return BrokerSynonym(name, type_, render_value(default, type_), validator, dynamic=True)


T = ConfigType
SEGMENT_BYTES_MIN = 1024 * 1024  # Kafka 4.0 raised the minimum from 14 bytes (KIP-1030)
DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024 + 12  # 1 MiB plus the log overhead (offset + size)
COMPRESSION_TYPES = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")
CLEANUP_POLICIES = ("compact", "delete")
TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")
WEEK_MS = 7 * 24 * HOUR_MS

_TOPIC_CONFIG_LIST = (
    _topic(
        "cleanup.policy",
        T.LIST,
        ("delete",),
        OneOf(CLEANUP_POLICIES),
        "What happens to old segments: 'delete' removes them by retention time or size, 'compact' keeps the "
        "latest record per key; both may be given ('delete,compact').",
        _same("log.cleanup.policy", T.LIST, ("delete",), OneOf(CLEANUP_POLICIES)),
    ),
    _topic(
        "compression.gzip.level",
        T.INT,
        -1,
        GzipLevel(),
        "The compression level when compression.type is gzip.",
        _same("compression.gzip.level", T.INT, -1, GzipLevel()),
    ),
    _topic(
        "compression.lz4.level",
        T.INT,
        9,
        Range(1, 17),
        "The compression level when compression.type is lz4.",
        _same("compression.lz4.level", T.INT, 9, Range(1, 17)),
    ),
    _topic(
        "compression.type",
        T.STRING,
        "producer",
        OneOf(COMPRESSION_TYPES),
        "The compression of stored batches: a codec (gzip, snappy, lz4, zstd), 'uncompressed', or 'producer' "
        "to keep whatever the producer used.",
        _same("compression.type", T.STRING, "producer", OneOf(COMPRESSION_TYPES)),
    ),
    _topic(
        "compression.zstd.level",
        T.INT,
        3,
        Range(-131072, 22),
        "The compression level when compression.type is zstd.",
        _same("compression.zstd.level", T.INT, 3, Range(-131072, 22)),
    ),
    _topic(
        "delete.retention.ms",
        T.LONG,
        24 * HOUR_MS,
        Range(0),
        "How long tombstones (delete markers) of a compacted topic are kept.",
        _same("log.cleaner.delete.retention.ms", T.LONG, 24 * HOUR_MS, Range(0)),
    ),
    _topic(
        "file.delete.delay.ms",
        T.LONG,
        60000,
        Range(0),
        "How long a deleted segment's files stay on disk.",
        _same("log.segment.delete.delay.ms", T.LONG, 60000, Range(0)),
    ),
    _topic(
        "flush.messages",
        T.LONG,
        LONG_MAX,
        Range(1),
        "Force an fsync after this many messages (default: leave flushing to the OS).",
        _same("log.flush.interval.messages", T.LONG, LONG_MAX, Range(1)),
    ),
    _topic(
        "flush.ms",
        T.LONG,
        LONG_MAX,
        Range(0),
        "Force an fsync when the oldest unflushed message is this old (default: leave flushing to the OS).",
        BrokerSynonym("log.flush.interval.ms", T.LONG, None, dynamic=True),
        BrokerSynonym("log.flush.scheduler.interval.ms", T.LONG, str(LONG_MAX)),
    ),
    _topic(
        "follower.replication.throttled.replicas",
        T.LIST,
        (),
        ThrottledReplicas(),
        "Replicas (partitionId:brokerId, or '*') whose follower fetches are throttled "
        "(one node: no replication).",
        effect=False,
    ),
    _topic(
        "index.interval.bytes",
        T.INT,
        4096,
        Range(0),
        "Bytes of log between two offset index entries.",
        _same("log.index.interval.bytes", T.INT, 4096, Range(0)),
    ),
    _topic(
        "leader.replication.throttled.replicas",
        T.LIST,
        (),
        ThrottledReplicas(),
        "Replicas (partitionId:brokerId, or '*') whose leader-side replication is throttled "
        "(one node: no replication).",
        effect=False,
    ),
    _topic(
        "local.retention.bytes",
        T.LONG,
        -2,
        Range(-2),
        "Tiered storage: local size limit; -2 means use retention.bytes.",
        _same("log.local.retention.bytes", T.LONG, -2, Range(-2)),
        effect=False,
    ),
    _topic(
        "local.retention.ms",
        T.LONG,
        -2,
        Range(-2),
        "Tiered storage: local time limit; -2 means use retention.ms.",
        _same("log.local.retention.ms", T.LONG, -2, Range(-2)),
        effect=False,
    ),
    _topic(
        "max.compaction.lag.ms",
        T.LONG,
        LONG_MAX,
        Range(1),
        "The longest a record may stay ineligible for compaction.",
        _same("log.cleaner.max.compaction.lag.ms", T.LONG, LONG_MAX, Range(1)),
    ),
    _topic(
        "max.message.bytes",
        T.INT,
        DEFAULT_MAX_MESSAGE_BYTES,
        Range(0),
        "The largest record batch the topic accepts (after compression). A compressed batch may "
        "decompress to at most its record count x this, and never past 64 MiB (or this, if larger).",
        _same("message.max.bytes", T.INT, DEFAULT_MAX_MESSAGE_BYTES, Range(0)),
    ),
    _topic(
        "message.timestamp.after.max.ms",
        T.LONG,
        HOUR_MS,
        Range(0),
        "With CreateTime, reject a batch whose timestamp is more than this far ahead of the broker's clock.",
        _same("log.message.timestamp.after.max.ms", T.LONG, HOUR_MS, Range(0)),
    ),
    _topic(
        "message.timestamp.before.max.ms",
        T.LONG,
        LONG_MAX,
        Range(0),
        "With CreateTime, reject a batch whose timestamp is more than this far behind the broker's clock.",
        _same("log.message.timestamp.before.max.ms", T.LONG, LONG_MAX, Range(0)),
    ),
    _topic(
        "message.timestamp.type",
        T.STRING,
        "CreateTime",
        OneOf(TIMESTAMP_TYPES),
        "CreateTime keeps the producer's timestamps; LogAppendTime stamps batches with the broker's clock.",
        _same("log.message.timestamp.type", T.STRING, "CreateTime", OneOf(TIMESTAMP_TYPES)),
    ),
    _topic(
        "min.cleanable.dirty.ratio",
        T.DOUBLE,
        0.5,
        Range(0, 1),
        "Compact a log once this fraction of it is uncompacted.",
        _same("log.cleaner.min.cleanable.ratio", T.DOUBLE, 0.5, Range(0, 1)),
    ),
    _topic(
        "min.compaction.lag.ms",
        T.LONG,
        0,
        Range(0),
        "The shortest time a record stays uncompacted.",
        _same("log.cleaner.min.compaction.lag.ms", T.LONG, 0, Range(0)),
    ),
    _topic(
        "min.insync.replicas",
        T.INT,
        1,
        Range(1),
        "With acks=all, the number of in-sync replicas a write needs to succeed.",
        _same("min.insync.replicas", T.INT, 1, Range(1)),
    ),
    _topic(
        "preallocate",
        T.BOOLEAN,
        False,
        None,
        "Preallocate a new segment's file on disk (Strom's segment files grow as they are written).",
        _same("log.preallocate", T.BOOLEAN, False, None),
        effect=False,
    ),
    _topic(
        "remote.log.copy.disable",
        T.BOOLEAN,
        False,
        None,
        "Tiered storage: stop copying segments to remote storage.",
        effect=False,
    ),
    _topic(
        "remote.log.delete.on.disable",
        T.BOOLEAN,
        False,
        None,
        "Tiered storage: delete remote data when remote storage is turned off for the topic.",
        effect=False,
    ),
    _topic(
        "remote.storage.enable",
        T.BOOLEAN,
        False,
        None,
        "Tiered storage: move old segments to remote storage.",
        effect=False,
    ),
    _topic(
        "retention.bytes",
        T.LONG,
        -1,
        None,
        "With the delete policy, the size a partition may grow to before old segments go (-1: no limit).",
        _same("log.retention.bytes", T.LONG, -1, None),
    ),
    _topic(
        "retention.ms",
        T.LONG,
        WEEK_MS,
        Range(-1),
        "With the delete policy, how long segments are kept (-1: no limit).",
        BrokerSynonym("log.retention.ms", T.LONG, None, dynamic=True),
        BrokerSynonym("log.retention.minutes", T.INT, None, factor=MINUTE_MS),
        BrokerSynonym("log.retention.hours", T.INT, "168", factor=HOUR_MS),
    ),
    _topic(
        "segment.bytes",
        T.INT,
        1024 * 1024 * 1024,
        Range(SEGMENT_BYTES_MIN),
        "The size at which a segment is rolled.",
        _same("log.segment.bytes", T.INT, 1024 * 1024 * 1024, Range(SEGMENT_BYTES_MIN)),
    ),
    _topic(
        "segment.index.bytes",
        T.INT,
        10 * 1024 * 1024,
        Range(4),
        "The most bytes a segment's offset and time indexes may hold (a full index rolls the segment).",
        _same("log.index.size.max.bytes", T.INT, 10 * 1024 * 1024, Range(4)),
    ),
    _topic(
        "segment.jitter.ms",
        T.LONG,
        0,
        Range(0),
        "The most random jitter subtracted from segment.ms, to spread segment rolls.",
        BrokerSynonym("log.roll.jitter.ms", T.LONG, None, dynamic=True),
        BrokerSynonym("log.roll.jitter.hours", T.INT, "0", Range(0), factor=HOUR_MS),
    ),
    _topic(
        "segment.ms",
        T.LONG,
        WEEK_MS,
        Range(1),
        "Roll a segment this long after its first record, even if it is not full.",
        BrokerSynonym("log.roll.ms", T.LONG, None, dynamic=True),
        BrokerSynonym("log.roll.hours", T.INT, "168", Range(1), factor=HOUR_MS),
    ),
    _topic(
        "unclean.leader.election.enable",
        T.BOOLEAN,
        False,
        None,
        "Allow a replica outside the ISR to become leader when no ISR member lives, at the cost "
        "of losing committed data (the controller decides; one node: one replica).",
        _same("unclean.leader.election.enable", T.BOOLEAN, False, None),
    ),
)

TOPIC_CONFIGS: Mapping[str, TopicConfigDef] = {d.name: d for d in _TOPIC_CONFIG_LIST}

# Broker config name -> (topic config, synonym) for every broker key that supplies a topic default.
BROKER_SYNONYMS: Mapping[str, tuple[TopicConfigDef, BrokerSynonym]] = {
    s.name: (d, s) for d in _TOPIC_CONFIG_LIST for s in d.synonyms
}

# Kafka turns a negative broker retention time (e.g. log.retention.hours=-1) into -1: no limit.
_NEGATIVE_MEANS_UNLIMITED = frozenset({"retention.ms"})


def _broker_value(definition: TopicConfigDef, broker: Mapping[str, str]) -> Value:
    """The topic default the broker's configuration supplies, if it sets any synonym."""
    for synonym in definition.synonyms:
        raw = broker.get(synonym.name)
        if raw is None:
            continue
        value = parse_value(synonym.name, raw, synonym.type)
        if synonym.validator is not None:
            synonym.validator.check(synonym.name, value)
        if synonym.factor != 1:
            assert isinstance(value, int)
            value *= synonym.factor
        if definition.name in _NEGATIVE_MEANS_UNLIMITED:
            assert isinstance(value, int)
            value = max(value, -1)
        if definition.validator is not None:
            definition.validator.check(synonym.name, value)
        return value
    return None


def _effective_values(topic_overrides: Mapping[str, str], broker: Mapping[str, str]) -> dict[str, Value]:
    for name in topic_overrides:
        if name not in TOPIC_CONFIGS:
            raise InvalidConfigError(f"Unknown topic config name: {name}")
    values: dict[str, Value] = {}
    for definition in _TOPIC_CONFIG_LIST:
        raw = topic_overrides.get(definition.name)
        if raw is not None:
            values[definition.name] = definition.parse(definition.name, raw)
            continue
        from_broker = _broker_value(definition, broker)
        values[definition.name] = definition.default if from_broker is None else from_broker
    min_lag, max_lag = values["min.compaction.lag.ms"], values["max.compaction.lag.ms"]
    assert isinstance(min_lag, int) and isinstance(max_lag, int)
    if min_lag > max_lag:
        raise InvalidConfigError(
            f"conflict topic config setting min.compaction.lag.ms ({min_lag}) > "
            f"max.compaction.lag.ms ({max_lag})"
        )
    if values["remote.storage.enable"]:
        # Strom has no remote log storage, like a Kafka broker with remote.log.storage.system.enable=false.
        raise InvalidConfigError(
            "Tiered Storage functionality is disabled in the broker. "
            "Topic cannot be configured with remote log storage."
        )
    return values


@dataclass(frozen=True, slots=True)
class LogConfig:
    """The effective configuration of one log. Attribute = Kafka topic config name with '.' -> '_'."""

    segment_bytes: int = 1024 * 1024 * 1024
    segment_ms: int = WEEK_MS
    segment_jitter_ms: int = 0
    segment_index_bytes: int = 10 * 1024 * 1024
    index_interval_bytes: int = 4096
    retention_ms: int = WEEK_MS
    retention_bytes: int = -1
    flush_messages: int = LONG_MAX
    flush_ms: int = LONG_MAX
    file_delete_delay_ms: int = 60000
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    message_timestamp_type: str = "CreateTime"
    message_timestamp_before_max_ms: int = LONG_MAX
    message_timestamp_after_max_ms: int = HOUR_MS
    compression_type: str = "producer"
    cleanup_policy: tuple[str, ...] = field(default=("delete",))
    min_insync_replicas: int = 1
    preallocate: bool = False
    compression_gzip_level: int = -1
    compression_lz4_level: int = 9
    compression_zstd_level: int = 3
    delete_retention_ms: int = 24 * HOUR_MS
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = LONG_MAX
    unclean_leader_election_enable: bool = False
    leader_replication_throttled_replicas: tuple[str, ...] = ()
    follower_replication_throttled_replicas: tuple[str, ...] = ()
    local_retention_ms: int = -2
    local_retention_bytes: int = -2
    remote_storage_enable: bool = False
    remote_log_copy_disable: bool = False
    remote_log_delete_on_disable: bool = False

    _BY_ATTRIBUTE: ClassVar[Mapping[str, str]] = {d.attribute: d.name for d in _TOPIC_CONFIG_LIST}

    @classmethod
    def from_props(
        cls, topic_overrides: Mapping[str, str], broker: Mapping[str, str] | None = None
    ) -> LogConfig:
        """The effective config of a topic.

        ``topic_overrides`` are the topic's own configs (topic config names); ``broker`` holds the broker
        configs that were set explicitly (server.properties/--override), keyed by broker config name,
        e.g. ``KafkaConfig.log_config_defaults()``. Keys of ``broker`` that are no topic synonym are ignored.
        Raises InvalidConfigError for an unknown topic config name or an invalid value.
        """
        values = _effective_values(topic_overrides, broker or {})
        return cls(**{f.name: values[cls._BY_ATTRIBUTE[f.name]] for f in fields(cls)})  # type: ignore[arg-type]

    @property
    def compression_level(self) -> int | None:
        """The level for recompressing to compression.type (KIP-390); None: the codec's default."""
        if self.compression_type == "gzip":
            return None if self.compression_gzip_level == -1 else self.compression_gzip_level
        if self.compression_type == "lz4":
            return self.compression_lz4_level
        if self.compression_type == "zstd":
            return self.compression_zstd_level
        return None

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy


@dataclass(frozen=True, slots=True)
class ConfigSynonym:
    name: str
    value: str | None
    source: int


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One config of a DescribeConfigs result."""

    name: str
    value: str | None
    source: int
    is_sensitive: bool
    read_only: bool
    config_type: int
    documentation: str | None
    synonyms: tuple[ConfigSynonym, ...] = ()


def describe_topic_config(
    topic_overrides: Mapping[str, str],
    broker: Mapping[str, str] | None = None,
    broker_sources: Mapping[str, ConfigSource] | None = None,
) -> list[ConfigEntry]:
    """DescribeConfigs for a TOPIC resource: every topic config, sorted by name.

    Synonyms are listed in Kafka's order: the topic override, then the broker synonyms the broker sets
    (by source: DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG, STATIC_BROKER_CONFIG, as
    ``broker_sources`` says; STATIC_BROKER_CONFIG when it says nothing), then the broker synonyms'
    Kafka defaults (DEFAULT_CONFIG); the entry's source is that of the first synonym, or
    DEFAULT_CONFIG when there is none.
    """
    broker = broker or {}
    sources = broker_sources or {}
    values = _effective_values(topic_overrides, broker)
    entries = []
    for definition in sorted(_TOPIC_CONFIG_LIST, key=lambda d: d.name):
        value = render_value(values[definition.name], definition.type)
        synonyms: list[ConfigSynonym] = []
        if definition.name in topic_overrides:
            synonyms.append(ConfigSynonym(definition.name, value, ConfigSource.TOPIC_CONFIG))
        set_on_broker = [
            ConfigSynonym(
                s.name, broker[s.name].strip(), sources.get(s.name, ConfigSource.STATIC_BROKER_CONFIG)
            )
            for s in definition.synonyms
            if s.name in broker
        ]
        synonyms += sorted(set_on_broker, key=lambda synonym: synonym.source)
        for s in definition.synonyms:
            if s.default is not None:
                synonyms.append(ConfigSynonym(s.name, s.default, ConfigSource.DEFAULT_CONFIG))
        entries.append(
            ConfigEntry(
                name=definition.name,
                value=value,
                source=synonyms[0].source if synonyms else ConfigSource.DEFAULT_CONFIG,
                is_sensitive=False,
                read_only=False,
                config_type=definition.type.id,
                documentation=definition.doc,
                synonyms=tuple(synonyms),
            )
        )
    return entries
