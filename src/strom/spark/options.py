"""The data source's options: Spark's Kafka connector's names, defaults and refusals.

A Spark user's Kafka code ports by changing the format name, so options mean what they
mean there: ``kafka.``-prefixed keys are Kafka client configs passed through (minus the
ones the connector manages itself, refused with its reasons), one of ``subscribe``,
``subscribePattern`` and ``assign`` picks the partitions, and the offset options say
where reading starts and (batch reads only) ends. Spark hands a data source its options
case-insensitively; keys here are compared in lower case.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from strom.client.cluster import TopicPartition
from strom.client.config import ADMIN, CONSUMER, PRODUCER
from strom.spark.offsets import (
    EARLIEST,
    LATEST,
    OffsetRangeLimit,
    OffsetsFormatError,
    assignment_from_json,
    from_json_dict,
)

KAFKA_PREFIX = "kafka."
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000
DEFAULT_POLL_TIMEOUT_MS = 120_000
DEFAULT_GROUP_PREFIX = "strom-spark"
DEFAULT_LEDGER_TOPIC = "strom-spark-ledger"
# The broker's default transaction.max.timeout.ms: the longest a micro-batch's transactions may stay open.
DEFAULT_TRANSACTION_TIMEOUT_MS = 15 * 60 * 1000

_CONSUMER_KEYS = {key.name for key in CONSUMER}
_ADMIN_KEYS = {key.name for key in ADMIN}
_PRODUCER_KEYS = {key.name for key in PRODUCER}

# Client configs the connector sets itself: why a user may not (Spark's reasons).
_SOURCE_MANAGED = {
    "auto.offset.reset": (
        "set the source option 'startingOffsets' to 'earliest' or 'latest' instead: the query tracks its own "
        "offsets in its checkpoint, so that no data is missed when partitions are added, and 'startingOffsets' "
        "applies only when a new query starts (a restarted query resumes where it left off)"
    ),
    "enable.auto.commit": (
        "the query tracks the offsets it consumed in its checkpoint and never commits through the consumer; "
        "finished micro-batches are committed to the query's consumer group by the driver"
    ),
    "key.deserializer": (
        "keys are always read as bytes; use DataFrame operations (e.g. CAST(key AS STRING)) to deserialize them"
    ),
    "value.deserializer": (
        "values are always read as bytes; use DataFrame operations (e.g. CAST(value AS STRING)) to "
        "deserialize them"
    ),
    "interceptor.classes": "consumer interceptors would see the raw byte records Spark reads, not rows",
}
_SINK_MANAGED = {
    "key.serializer": (
        "keys are always written as bytes; use DataFrame operations to serialize them to a string or binary column"
    ),
    "value.serializer": (
        "values are always written as bytes; use DataFrame operations to serialize them to a string or "
        "binary column"
    ),
    "interceptor.classes": "producer interceptors would see the raw byte records Spark writes, not rows",
    "transactional.id": (
        "with exactlyOnce=true each task's transactional id is derived from the query id and the task's "
        "partition (strom-spark-<query id>-<partition>), so that a retried task fences the attempt before it"
    ),
}

_TIMESTAMP_STRATEGIES = ("error", "latest")


class OptionError(ValueError):
    """An option the data source refuses; the message says which and why."""


@dataclass(frozen=True)
class Subscribe:
    topics: tuple[str, ...]


@dataclass(frozen=True)
class SubscribePattern:
    pattern: str


@dataclass(frozen=True)
class Assign:
    partitions: tuple[TopicPartition, ...]


Strategy = Subscribe | SubscribePattern | Assign


@dataclass(frozen=True)
class SourceOptions:
    bootstrap_servers: str
    strategy: Strategy
    starting: OffsetRangeLimit
    ending: OffsetRangeLimit
    consumer_config: dict[str, str] = field(default_factory=dict)
    admin_config: dict[str, str] = field(default_factory=dict)
    group_id: str | None = None
    group_id_prefix: str = DEFAULT_GROUP_PREFIX
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS
    read_committed: bool = False

    def client_config(self, kind: str) -> dict[str, str]:
        """The config of a consumer ("consumer") or admin client ("admin") reading for the source."""
        base = self.consumer_config if kind == "consumer" else self.admin_config
        return {"bootstrap.servers": self.bootstrap_servers, **base}


@dataclass(frozen=True)
class SinkOptions:
    bootstrap_servers: str
    topic: str | None
    producer_config: dict[str, str] = field(default_factory=dict)
    exactly_once: bool = False
    ledger_topic: str = DEFAULT_LEDGER_TOPIC
    checkpoint_location: str | None = None  # Spark's own option, where an exactly-once sink finds the query id

    def client_config(self) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap_servers, **self.producer_config}

    def transactional_config(self, transactional_id: str) -> dict[str, str]:
        """A task's transactional producer: the sink's default timeout unless kafka.transaction.timeout.ms."""
        return {
            "transaction.timeout.ms": str(DEFAULT_TRANSACTION_TIMEOUT_MS),
            **self.client_config(),
            "transactional.id": transactional_id,
        }


def parse_source_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    opts = {key.lower(): value for key, value in options.items()}
    bootstrap, params = _kafka_params(opts, role="source")
    for key, reason in _SOURCE_MANAGED.items():
        if key in params:
            raise OptionError(f"Kafka option '{key}' is not supported: {reason}.")
    group_id = params.pop("group.id", None)
    unknown = sorted(set(params) - _CONSUMER_KEYS - _ADMIN_KEYS)
    if unknown:
        raise OptionError(
            f"unknown Kafka consumer config(s) {', '.join(KAFKA_PREFIX + k for k in unknown)}; "
            "the source passes kafka.* options to Strom's Kafka client, which does not know them"
        )
    consumer_config = {k: v for k, v in params.items() if k in _CONSUMER_KEYS}
    admin_config = {k: v for k, v in params.items() if k in _ADMIN_KEYS}
    strategy = _strategy(opts)
    if streaming:
        for key in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
            if key.lower() in opts:
                raise OptionError(f"option '{key}' is for batch queries only: a streaming query has no end")
    timestamp_strategy = opts.get("startingoffsetsbytimestampstrategy", "error").lower()
    if timestamp_strategy not in _TIMESTAMP_STRATEGIES:
        raise OptionError(
            f"option 'startingOffsetsByTimestampStrategy' must be 'error' or 'latest', got {timestamp_strategy!r}"
        )
    starting = _offset_limit(
        opts,
        offsets_key="startingOffsets",
        timestamp_key="startingTimestamp",
        timestamps_key="startingOffsetsByTimestamp",
        default=OffsetRangeLimit.latest() if streaming else OffsetRangeLimit.earliest(),
        strategy=timestamp_strategy,
    )
    # An ending timestamp without a matching offset reads to the end, as Spark's connector does.
    ending = _offset_limit(
        opts,
        offsets_key="endingOffsets",
        timestamp_key="endingTimestamp",
        timestamps_key="endingOffsetsByTimestamp",
        default=OffsetRangeLimit.latest(),
        strategy="latest",
    )
    if not streaming:
        _check_batch_limits(starting, ending)
    isolation = params.get("isolation.level", "read_uncommitted")
    return SourceOptions(
        bootstrap_servers=bootstrap,
        strategy=strategy,
        starting=starting,
        ending=ending,
        consumer_config=consumer_config,
        admin_config=admin_config,
        group_id=group_id,
        group_id_prefix=opts.get("groupidprefix", DEFAULT_GROUP_PREFIX),
        max_offsets_per_trigger=_positive_int(opts, "maxoffsetspertrigger", "maxOffsetsPerTrigger"),
        min_offsets_per_trigger=_positive_int(opts, "minoffsetspertrigger", "minOffsetsPerTrigger"),
        max_trigger_delay_ms=_duration_ms(opts.get("maxtriggerdelay"), DEFAULT_MAX_TRIGGER_DELAY_MS),
        min_partitions=_positive_int(opts, "minpartitions", "minPartitions"),
        fail_on_data_loss=_boolean(opts, "failondataloss", "failOnDataLoss", True),
        include_headers=_boolean(opts, "includeheaders", "includeHeaders", False),
        poll_timeout_ms=_positive_int(opts, "kafkaconsumer.polltimeoutms", "kafkaConsumer.pollTimeoutMs")
        or DEFAULT_POLL_TIMEOUT_MS,
        read_committed=isolation == "read_committed",
    )


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    opts = {key.lower(): value for key, value in options.items()}
    bootstrap, params = _kafka_params(opts, role="sink")
    for key, reason in _SINK_MANAGED.items():
        if key in params:
            raise OptionError(f"Kafka option '{key}' is not supported: {reason}.")
    unknown = sorted(set(params) - _PRODUCER_KEYS)
    if unknown:
        raise OptionError(
            f"unknown Kafka producer config(s) {', '.join(KAFKA_PREFIX + k for k in unknown)}; "
            "the sink passes kafka.* options to Strom's Kafka producer, which does not know them"
        )
    topic = opts.get("topic")
    if topic is not None and not topic.strip():
        raise OptionError("option 'topic' is empty")
    ledger_topic = opts.get("exactlyonceledgertopic", DEFAULT_LEDGER_TOPIC).strip()
    if not ledger_topic:
        raise OptionError("option 'exactlyOnceLedgerTopic' is empty")
    return SinkOptions(
        bootstrap_servers=bootstrap,
        topic=topic,
        producer_config=params,
        exactly_once=_boolean(opts, "exactlyonce", "exactlyOnce", False),
        ledger_topic=ledger_topic,
        checkpoint_location=opts.get("checkpointlocation"),
    )


def _kafka_params(opts: Mapping[str, str], role: str) -> tuple[str, dict[str, str]]:
    params = {key[len(KAFKA_PREFIX) :]: value for key, value in opts.items() if key.startswith(KAFKA_PREFIX)}
    bootstrap = params.pop("bootstrap.servers", None)
    if not bootstrap:
        kind = "consumer" if role == "source" else "producer"
        raise OptionError(f"option 'kafka.bootstrap.servers' must be specified for configuring the Kafka {kind}")
    return bootstrap, params


def _strategy(opts: Mapping[str, str]) -> Strategy:
    given = [key for key in ("subscribe", "subscribepattern", "assign") if key in opts]
    if len(given) != 1:
        which = "Only one of" if given else "One of"
        raise OptionError(
            f"{which} the options 'subscribe', 'subscribePattern' and 'assign' must be specified "
            f"for the strom source{' (got ' + ', '.join(given) + ')' if given else ''}"
        )
    key = given[0]
    value = opts[key]
    if key == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in value.split(",") if t.strip()))
        if not topics:
            raise OptionError(f"no topics to subscribe to in option 'subscribe' ({value!r})")
        return Subscribe(topics)
    if key == "subscribepattern":
        if not value.strip():
            raise OptionError("option 'subscribePattern' is empty")
        try:
            re.compile(value)
        except re.error as error:
            raise OptionError(f"option 'subscribePattern' is not a regular expression: {error}") from error
        return SubscribePattern(value)
    try:
        partitions = assignment_from_json(value)
    except OffsetsFormatError as error:
        raise OptionError(str(error)) from error
    if not partitions:
        raise OptionError(f"no partitions to assign in option 'assign' ({value!r})")
    return Assign(tuple(partitions))


def _offset_limit(
    opts: Mapping[str, str],
    *,
    offsets_key: str,
    timestamp_key: str,
    timestamps_key: str,
    default: OffsetRangeLimit,
    strategy: str,
) -> OffsetRangeLimit:
    """Keys are given as documented (camelCase), for messages; options are looked up in lower case."""
    # Spark's precedence: one timestamp for all partitions, then per-partition timestamps, then offsets.
    if timestamp_key.lower() in opts:
        try:
            timestamp = int(opts[timestamp_key.lower()])
        except ValueError as error:
            raise OptionError(f"option '{timestamp_key}' must be a timestamp in milliseconds") from error
        return OffsetRangeLimit.global_timestamp(timestamp, strategy)
    if timestamps_key.lower() in opts:
        try:
            timestamps = from_json_dict(opts[timestamps_key.lower()], f"option '{timestamps_key}'")
        except OffsetsFormatError as error:
            raise OptionError(str(error)) from error
        return OffsetRangeLimit.by_timestamp(timestamps, strategy)
    value = opts.get(offsets_key.lower())
    if value is None:
        return default
    if value.strip().lower() == "earliest":
        return OffsetRangeLimit.earliest()
    if value.strip().lower() == "latest":
        return OffsetRangeLimit.latest()
    try:
        offsets = from_json_dict(value, f"option '{offsets_key}'")
    except OffsetsFormatError as error:
        raise OptionError(
            f"{error}; option '{offsets_key}' takes 'earliest', 'latest' or JSON like "
            '{"topicA": {"0": 23, "1": -1}} (-2 = earliest, -1 = latest)'
        ) from error
    for tp, offset in offsets.items():
        if offset < EARLIEST:
            raise OptionError(f"option '{offsets_key}': offset {offset} of {tp} is negative (-2 and -1 only)")
    return OffsetRangeLimit.specific(offsets)


def _check_batch_limits(starting: OffsetRangeLimit, ending: OffsetRangeLimit) -> None:
    """Batch reads need a fixed range: they cannot start at the end or end at the beginning."""
    if starting.kind == "latest":
        raise OptionError("starting offset can't be latest for batch queries (option 'startingOffsets')")
    for tp, offset in starting.offsets:
        if offset == LATEST:
            raise OptionError(f"starting offset for {tp} can't be latest (-1) for batch queries")
    if ending.kind == "earliest":
        raise OptionError("ending offset can't be earliest for batch queries (option 'endingOffsets')")
    for tp, offset in ending.offsets:
        if offset == EARLIEST:
            raise OptionError(f"ending offset for {tp} can't be earliest (-2) for batch queries")


def _positive_int(opts: Mapping[str, str], key: str, name: str) -> int | None:
    value = opts.get(key)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError as error:
        raise OptionError(f"option '{name}' must be a positive integer, got {value!r}") from error
    if number <= 0:
        raise OptionError(f"option '{name}' must be a positive integer, got {value!r}")
    return number


def _boolean(opts: Mapping[str, str], key: str, name: str, default: bool) -> bool:
    value = opts.get(key)
    if value is None:
        return default
    lowered = str(value).strip().lower()
    if lowered not in ("true", "false"):
        raise OptionError(f"option '{name}' must be true or false, got {value!r}")
    return lowered == "true"


_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|min|h|d)?\s*$", re.IGNORECASE)
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def _duration_ms(value: str | None, default: int) -> int:
    """A Spark time string ("15m", "30s", "500ms"; a bare number is milliseconds)."""
    if value is None:
        return default
    match = _DURATION.match(value)
    if not match:
        raise OptionError(f"option 'maxTriggerDelay' must be a duration like '15m', '30s' or '500ms', got {value!r}")
    return int(match.group(1)) * _UNIT_MS[(match.group(2) or "ms").lower()]
