"""The broker's configuration: Kafka's server.properties keys, defaults and validation.

Configuration comes from a Java .properties file (``load_properties``) and ``--override key=value``
pairs; overrides win. Keys fall in three groups:

* keys Strom implements, with Kafka 4.1's names, types, defaults and validation (a few defaults differ
  because Strom is a single node: see docs/CONFIGURATION.md);
* keys Kafka knows that Strom accepts without acting on them (thread counts, the KRaft inter-broker
  listener, ...): they are validated like Kafka does and otherwise ignored;
* unknown keys (including KRaft's process.roles and controller.quorum.*): one warning each, ignored.

An invalid value of a known key raises ConfigError with a one-line message in Kafka's words.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from strom.storage.cleaner import CleanerConfig
from strom.storage.log_config import (
    BROKER_SYNONYMS,
    CONFIG_TYPE_UNKNOWN,
    INT_MAX,
    ConfigEntry,
    ConfigSource,
    ConfigSynonym,
    ConfigType,
    InvalidConfigError,
    LogConfig,
    OneOf,
    Range,
    Validator,
    Value,
    parse_value,
    render_value,
)

log = logging.getLogger(__name__)

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SUPPORTED_SECURITY_PROTOCOLS = ("PLAINTEXT",)
DEFAULT_SECURITY_PROTOCOL_MAP = ",".join(f"{p}:{p}" for p in SECURITY_PROTOCOLS)


class ConfigError(InvalidConfigError):
    """An invalid broker configuration; str() is one line naming the key and the problem."""


@dataclass(frozen=True, slots=True)
class Listener:
    """One entry of ``listeners``/``advertised.listeners``; an empty host means all interfaces."""

    name: str
    host: str
    port: int
    security_protocol: str

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.name}://{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class BrokerConfigDef:
    """A broker config key. ``default`` is the value as Kafka renders it (None: no default).

    ``dynamic``: Kafka changes it at runtime (AlterConfigs on a broker or the cluster default) and so
    can Strom, so DescribeConfigs reports read_only=false. Kafka's listener keys are dynamic in Kafka
    but not here: Strom cannot rebind its listeners without a restart.
    ``effect``: Strom acts on it; keys with effect=False are accepted for compatibility only.
    """

    name: str
    type: ConfigType
    default: str | None
    validator: Validator | None
    doc: str
    dynamic: bool = False
    effect: bool = True


T = ConfigType


def _key(
    name: str,
    type_: ConfigType,
    default: Value,
    validator: Validator | None,
    doc: str,
    *,
    dynamic: bool = False,
    effect: bool = True,
) -> BrokerConfigDef:
    return BrokerConfigDef(name, type_, render_value(default, type_), validator, doc, dynamic, effect)


# Keys Strom implements (besides the topic-default keys below, derived from the topic config table).
_IMPLEMENTED = (
    _key("broker.id", T.INT, -1, Range(-1), "The broker's id; a synonym of node.id (-1: unset)."),
    _key(
        "node.id",
        T.INT,
        -1,
        Range(-1),
        "The node's id; Strom uses 0 when neither node.id nor broker.id is set.",
    ),
    _key(
        "listeners",
        T.STRING,
        "PLAINTEXT://:9092",
        None,
        "Comma-separated NAME://host:port listeners; an empty host binds all interfaces.",
    ),
    _key(
        "advertised.listeners",
        T.STRING,
        None,
        None,
        "The listeners given to clients in metadata, if different from listeners.",
    ),
    _key(
        "listener.security.protocol.map",
        T.STRING,
        DEFAULT_SECURITY_PROTOCOL_MAP,
        None,
        "Listener name to security protocol (NAME:PROTOCOL,...).",
    ),
    _key(
        "controller.listener.names",
        T.STRING,
        None,
        None,
        "Names of KRaft controller listeners; Strom has no controller and does not serve them.",
    ),
    _key("log.dirs", T.STRING, None, None, "Comma-separated data directories; log.dir is used if unset."),
    _key("log.dir", T.STRING, "/tmp/kafka-logs", None, "The data directory when log.dirs is not set."),
    _key("num.partitions", T.INT, 1, Range(1), "Partitions of a topic created without a partition count."),
    _key("default.replication.factor", T.INT, 1, None, "Replication factor of topics created without one."),
    _key(
        "auto.create.topics.enable",
        T.BOOLEAN,
        True,
        None,
        "Create a topic when a client asks for its metadata and the topic does not exist.",
    ),
    _key("delete.topic.enable", T.BOOLEAN, True, None, "Allow DeleteTopics."),
    _key(
        "log.retention.check.interval.ms",
        T.LONG,
        300000,
        Range(1),
        "How often the broker checks logs for segments to delete by retention.",
    ),
    _key(
        "log.flush.offset.checkpoint.interval.ms",
        T.INT,
        60000,
        Range(0),
        "How often the recovery point of each log is written to disk.",
    ),
    _key("socket.request.max.bytes", T.INT, 100 * 1024 * 1024, Range(1), "The largest request accepted."),
    _key(
        "socket.send.buffer.bytes", T.INT, 100 * 1024, None, "SO_SNDBUF of client sockets (-1: OS default)."
    ),
    _key(
        "socket.receive.buffer.bytes",
        T.INT,
        100 * 1024,
        None,
        "SO_RCVBUF of client sockets (-1: OS default).",
    ),
    _key(
        "connections.max.idle.ms",
        T.LONG,
        600000,
        None,
        "Close connections idle this long (bytes of a request still arriving are not activity).",
    ),
    _key(
        "queued.max.requests",
        T.INT,
        500,
        Range(1),
        "Requests one connection may have queued behind the one in flight before it stops reading.",
    ),
    # Kafka's default is -1 (unbounded); Strom bounds request memory by default (docs/CONFIGURATION.md).
    _key(
        "queued.max.request.bytes",
        T.LONG,
        256 * 1024 * 1024,
        None,
        "Bytes of requests received and not yet answered, across all connections, before connections "
        "stop reading (<= 0: unbounded).",
    ),
    _key(
        "max.connections", T.INT, INT_MAX, Range(0), "The most connections the broker accepts.", dynamic=True
    ),
    _key(
        "max.connections.per.ip",
        T.INT,
        INT_MAX,
        Range(0),
        "The most connections from one address.",
        dynamic=True,
    ),
    _key(
        "max.connections.per.ip.overrides",
        T.STRING,
        "",
        None,
        "Per-address exceptions to max.connections.per.ip, as host:count pairs separated by commas.",
        dynamic=True,
    ),
    _key(
        "max.incremental.fetch.session.cache.slots",
        T.INT,
        1000,
        Range(0),
        "The most incremental fetch sessions (KIP-227) the broker keeps.",
    ),
    _key(
        "max.request.partition.size.limit",
        T.INT,
        2000,
        Range(1),
        "The most partitions one DescribeTopicPartitions response describes (KIP-966).",
    ),
    _key(
        "fetch.max.bytes",
        T.INT,
        55 * 1024 * 1024,
        Range(1024),
        "The most bytes one fetch response returns (KIP-541), whatever the request asks.",
    ),
    _key("offsets.topic.num.partitions", T.INT, 50, Range(1), "Partitions of __consumer_offsets."),
    _key(
        "group.initial.rebalance.delay.ms",
        T.INT,
        3000,
        None,
        "How long a new classic group waits for more members before its first rebalance.",
    ),
    _key("group.min.session.timeout.ms", T.INT, 6000, None, "The smallest session timeout a member may use."),
    _key(
        "group.max.session.timeout.ms", T.INT, 1800000, None, "The largest session timeout a member may use."
    ),
    _key("group.max.size", T.INT, INT_MAX, Range(1), "The most members a classic group may have."),
    _key(
        "offsets.retention.minutes",
        T.INT,
        7 * 24 * 60,
        Range(1),
        "How long committed offsets of an empty group are kept.",
    ),
    _key(
        "offsets.topic.segment.bytes",
        T.INT,
        100 * 1024 * 1024,
        # The topic's own segment.bytes minimum: a smaller value could never create the topic.
        Range(1024 * 1024),
        "segment.bytes of __consumer_offsets.",
    ),
    _key(
        "offsets.commit.timeout.ms",
        T.INT,
        5000,
        Range(1),
        "How long a write to __consumer_offsets (a commit, a group's assignment) waits for the ISR.",
    ),
    _key(
        "offsets.retention.check.interval.ms",
        T.LONG,
        600000,
        Range(1),
        "How often expired offsets are looked for.",
    ),
    _key(
        "offset.metadata.max.bytes", T.INT, 4096, None, "The largest metadata string of a committed offset."
    ),
    _key(
        "metrics.listener",
        T.STRING,
        None,
        None,
        "Where the broker serves its metrics in Prometheus' text format: http://host:port (GET "
        "/metrics); an empty host binds all interfaces, port 0 a free port. Unset: no endpoint.",
    ),
    # Consumer lag sampling (strom.broker.metrics.lag), when metrics.listener is set.
    _key(
        "metrics.lag.sample.interval.ms",
        T.LONG,
        10000,
        Range(1),
        "How often the lag of the groups this broker coordinates is sampled for the metrics endpoint.",
    ),
    _key(
        "metrics.lag.max.partitions",
        T.INT,
        10000,
        Range(1),
        "The most partitions with committed offsets one lag sample covers (groups in name order).",
    ),
    _key(
        "metrics.lag.window.samples",
        T.INT,
        10,
        Range(2),
        "How many samples of a partition's lag a group's status is judged on (Burrow's window).",
    ),
    _key(
        "log.cleaner.enable",
        T.BOOLEAN,
        True,
        None,
        "Run the log cleaner, which compacts topics with cleanup.policy=compact (deprecated in Kafka 4.1).",
    ),
    _key(
        "log.cleaner.backoff.ms",
        T.LONG,
        15000,
        Range(0),
        "How long the cleaner waits between passes over the compacted logs.",
    ),
    # Kafka checks the dedupe buffer only against log.cleaner.threads (more than 1 MiB per thread,
    # in KafkaConfig's validation), and has no range for the next three: Strom adds the bounds
    # without which a cleaner would map nothing, read nothing, or sleep for ages.
    _key(
        "log.cleaner.dedupe.buffer.size",
        T.LONG,
        128 * 1024 * 1024,
        None,
        "Memory for a cleaning round's key-to-offset map; when it fills, the round stops there.",
        dynamic=True,
    ),
    _key(
        "log.cleaner.io.buffer.load.factor",
        T.DOUBLE,
        0.9,
        Range(0, 1, above_min=True),
        "The fraction of log.cleaner.dedupe.buffer.size the map may fill.",
        dynamic=True,
    ),
    _key(
        "log.cleaner.io.buffer.size",
        T.INT,
        512 * 1024,
        Range(1),
        "Bytes the cleaner reads from a segment, and buffers for a cleaned one, at a time.",
        dynamic=True,
    ),
    _key(
        "log.cleaner.io.max.bytes.per.second",
        T.DOUBLE,
        sys.float_info.max,
        Range(1),
        "The cleaner's read plus write rate limit.",
        dynamic=True,
    ),
)


# A cluster on ZooKeeper (zookeeper.connect set): membership, the controller, replication.
# Without zookeeper.connect the broker is a cluster of one and these have no effect.
_CLUSTER = (
    _key(
        "zookeeper.connect",
        T.STRING,
        None,
        None,
        "ZooKeeper's host:port list with an optional chroot (host:port,host:port/strom); "
        "unset, the broker runs alone with its embedded control plane.",
    ),
    _key("zookeeper.session.timeout.ms", T.INT, 18000, Range(1), "The broker's ZooKeeper session timeout."),
    _key(
        "zookeeper.connection.timeout.ms",
        T.INT,
        None,
        None,
        "How long to wait for a connection to ZooKeeper (unset: zookeeper.session.timeout.ms).",
    ),
    _key("broker.rack", T.STRING, None, None, "The broker's rack; replica assignment spreads over racks."),
    _key(
        "inter.broker.listener.name",
        T.STRING,
        None,
        None,
        "The listener brokers use among themselves (unset: the one named after "
        "security.inter.broker.protocol, else the first); with more than one listener, connections on "
        "it are exempt from max.connections (KIP-402).",
    ),
    _key(
        "security.inter.broker.protocol",
        T.STRING,
        "PLAINTEXT",
        OneOf(SECURITY_PROTOCOLS),
        "The security protocol brokers use among themselves; names the inter-broker listener when "
        "inter.broker.listener.name is unset.",
    ),
    _key(
        "replica.lag.time.max.ms",
        T.LONG,
        30000,
        Range(1),
        "A follower that has not caught up to the leader's log end for this long leaves the ISR.",
    ),
    _key("replica.fetch.max.bytes", T.INT, 1048576, Range(0), "Bytes a follower asks per partition."),
    _key("replica.fetch.min.bytes", T.INT, 1, Range(1), "Bytes a follower's fetch waits for."),
    _key("replica.fetch.wait.max.ms", T.INT, 500, Range(0), "How long a follower's fetch may wait."),
    _key("replica.fetch.backoff.ms", T.INT, 1000, Range(0), "A follower's pause after a failed fetch."),
    _key(
        "replica.fetch.response.max.bytes",
        T.INT,
        10485760,
        Range(0),
        "Bytes a follower asks for in one fetch response.",
    ),
    _key("replica.socket.timeout.ms", T.INT, 30000, None, "Timeout of a follower's fetch requests."),
    _key(
        "replica.high.watermark.checkpoint.interval.ms",
        T.LONG,
        5000,
        Range(1),
        "How often high watermarks are written to replication-offset-checkpoint.",
    ),
    _key(
        "num.replica.fetchers",
        T.INT,
        1,
        Range(1),
        "Fetcher connections per source broker (partitions are spread over them).",
        dynamic=True,
    ),
    _key(
        "unclean.leader.election.enable",
        T.BOOLEAN,
        False,
        None,
        "Elect a leader outside the ISR when no ISR member lives (losing committed data).",
        dynamic=True,
    ),
    _key("controlled.shutdown.enable", T.BOOLEAN, True, None, "Move leadership away before shutting down."),
    _key(
        "controlled.shutdown.max.retries",
        T.INT,
        3,
        None,
        "Attempts of a controlled shutdown; after the last one the broker stops anyway.",
    ),
    _key("controlled.shutdown.retry.backoff.ms", T.LONG, 5000, None, "Pause between those attempts."),
    _key(
        "controller.socket.timeout.ms",
        T.INT,
        30000,
        None,
        "How long one attempt of a controlled shutdown waits for the controller's answer.",
    ),
    _key(
        "auto.leader.rebalance.enable",
        T.BOOLEAN,
        True,
        None,
        "Move leadership back to preferred replicas when the imbalance passes its threshold.",
    ),
    _key(
        "leader.imbalance.check.interval.seconds",
        T.LONG,
        300,
        Range(1),
        "How often the controller checks leadership imbalance.",
    ),
    _key(
        "leader.imbalance.per.broker.percentage",
        T.INT,
        10,
        None,
        "Share of a broker's partitions not led by their preferred replica that triggers a rebalance.",
    ),
    _key(
        "offsets.topic.replication.factor",
        T.SHORT,
        3,
        Range(1),
        "Replication factor of __consumer_offsets (a single node keeps one replica).",
    ),
    _key(
        "transaction.state.log.replication.factor",
        T.SHORT,
        3,
        Range(1),
        "Replication factor of __transaction_state (a single node keeps one replica).",
    ),
    _key(
        "transaction.state.log.min.isr",
        T.INT,
        2,
        Range(1),
        "min.insync.replicas of __transaction_state (at most its replication factor).",
    ),
    _key("transaction.state.log.num.partitions", T.INT, 50, Range(1), "Partitions of __transaction_state."),
    _key(
        "transaction.state.log.segment.bytes",
        T.INT,
        100 * 1024 * 1024,
        Range(1024 * 1024),
        "segment.bytes of __transaction_state.",
    ),
    _key(
        "transactional.id.expiration.ms",
        T.INT,
        7 * 24 * 3_600_000,
        Range(1),
        "How long a transactional id with no transaction is kept.",
    ),
    _key("transaction.max.timeout.ms", T.INT, 900000, Range(1), "The largest transaction timeout allowed."),
    _key(
        "transaction.abort.timed.out.transaction.cleanup.interval.ms",
        T.INT,
        10000,
        Range(1),
        "How often the coordinator aborts transactions that passed their timeout.",
    ),
    _key(
        "request.timeout.ms",
        T.INT,
        30000,
        Range(1),
        "Timeout of the broker's own requests (transaction log writes, transaction markers).",
    ),
    _key(
        "transaction.remove.expired.transaction.cleanup.interval.ms",
        T.INT,
        3600000,
        Range(1),
        "How often the coordinator removes expired transactional ids.",
    ),
)


# Keys of a stock Kafka server.properties (and their neighbours) that Strom accepts but does not act on.
def _accepted(
    name: str,
    type_: ConfigType,
    default: Value,
    validator: Validator | None,
    doc: str,
    *,
    dynamic: bool = False,
) -> BrokerConfigDef:
    return _key(name, type_, default, validator, doc, dynamic=dynamic, effect=False)


_ACCEPTED = (
    _accepted(
        "num.recovery.threads.per.data.dir",
        T.INT,
        2,
        Range(1),
        "Threads per data directory for log recovery at startup (Strom recovers logs one at a time).",
        dynamic=True,
    ),
    _accepted(
        "num.network.threads",
        T.INT,
        3,
        Range(1),
        "Network threads (Strom runs one event loop).",
        dynamic=True,
    ),
    _accepted(
        "num.io.threads",
        T.INT,
        8,
        Range(1),
        "Request handler threads (Strom runs one event loop).",
        dynamic=True,
    ),
    _accepted("background.threads", T.INT, 10, Range(1), "Background task threads.", dynamic=True),
    _accepted(
        "share.coordinator.state.topic.replication.factor",
        T.SHORT,
        3,
        Range(1),
        "Replication factor of the share-group state topic (share groups are not implemented).",
    ),
    _accepted(
        "share.coordinator.state.topic.min.isr",
        T.SHORT,
        2,
        Range(1),
        "min.insync.replicas of the share-group state topic.",
    ),
    _accepted(
        "log.cleaner.threads",
        T.INT,
        1,
        # Kafka's validator says at least 0, but its config check then divides by the count.
        Range(1),
        "Log cleaner threads (Strom cleans one log at a time, on one worker thread).",
        dynamic=True,
    ),
    _accepted(
        "log.flush.start.offset.checkpoint.interval.ms",
        T.INT,
        60000,
        Range(0),
        "How often log start offsets are written to disk.",
    ),
    _accepted("socket.listen.backlog.size", T.INT, 50, Range(1), "The listen backlog of server sockets."),
    _accepted(
        "producer.id.expiration.ms",
        T.INT,
        86400000,
        Range(1),
        "How long an idle producer id's state is kept.",
        dynamic=True,
    ),
)


def _topic_default_keys() -> tuple[BrokerConfigDef, ...]:
    keys = []
    for name, (topic, synonym) in BROKER_SYNONYMS.items():
        doc = f"Broker default of the topic config {topic.name}: {topic.doc}"
        keys.append(
            BrokerConfigDef(
                name, synonym.type, synonym.default, synonym.validator, doc, synonym.dynamic, topic.effect
            )
        )
    return tuple(keys)


BROKER_CONFIGS: Mapping[str, BrokerConfigDef] = {
    d.name: d
    for d in sorted(_IMPLEMENTED + _CLUSTER + _ACCEPTED + _topic_default_keys(), key=lambda d: d.name)
}

# Broker keys that are synonyms of each other, in precedence order (log.retention.ms > .minutes > .hours).
_SYNONYM_GROUPS: Mapping[str, tuple[str, ...]] = {
    s.name: tuple(x.name for x in topic.synonyms) for topic, s in BROKER_SYNONYMS.values()
}


# --- Java .properties ---

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_WHITESPACE = " \t\f"


def _unescape(text: str, where: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c != "\\" or i + 1 == len(text):
            # A trailing lone backslash (end of file) is dropped, as Java does.
            out.append(c if c != "\\" else "")
            i += 1
            continue
        e = text[i + 1]
        if e == "u":
            digits = text[i + 2 : i + 6]
            if len(digits) != 4 or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise ConfigError(f"Malformed \\uxxxx encoding in {where}")
            out.append(chr(int(digits, 16)))
            i += 6
        else:
            out.append(_ESCAPES.get(e, e))
            i += 2
    return "".join(out)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Join continued natural lines; drop blank and comment lines. Yields (first line number, text)."""
    lines = re.split(r"\r\n|\r|\n", text)
    result = []
    i = 0
    while i < len(lines):
        number, line = i + 1, lines[i].lstrip(_WHITESPACE)
        i += 1
        if not line or line[0] in "#!":
            continue  # comment lines never continue, even when they end in a backslash
        while (len(line) - len(line.rstrip("\\"))) % 2 == 1 and i < len(lines):
            line = line[:-1] + lines[i].lstrip(_WHITESPACE)
            i += 1
        result.append((number, line))
    return result


def parse_properties(text: str, source: str = "<properties>") -> dict[str, str]:
    """Parse Java .properties text: '#'/'!' comments, '=', ':' or whitespace between key and value,
    backslash line continuation and escapes (\\t \\n \\r \\f \\uXXXX, \\x for any other x). Later keys win."""
    props: dict[str, str] = {}
    for number, line in _logical_lines(text):
        key_end = 0
        while key_end < len(line):
            c = line[key_end]
            if c == "\\":
                key_end += 2
                continue
            if c in "=:" or c in _WHITESPACE:
                break
            key_end += 1
        rest = line[key_end:].lstrip(_WHITESPACE)
        if rest[:1] in ("=", ":"):
            rest = rest[1:].lstrip(_WHITESPACE)
        where = f"{source} line {number}"
        props[_unescape(line[:key_end], where)] = _unescape(rest, where)
    return props


def load_properties(path: str | Path) -> dict[str, str]:
    """Read a server.properties file. Kafka reads ISO-8859-1; Strom reads UTF-8 and falls back to it."""
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("iso-8859-1")
    return parse_properties(text, str(path))


# --- listeners ---

_LISTENER = re.compile(r"(.*)://\[?([0-9a-zA-Z\-%._:]*)\]?:(-?[0-9]+)")


def _invalid(name: str, value: str, reason: str) -> ConfigError:
    return ConfigError(f"Invalid value {value} for configuration {name}: {reason}")


def _csv(text: str) -> list[str]:
    return [item for item in re.split(r"\s*,\s*", text.strip()) if item]


def parse_security_protocol_map(text: str) -> dict[str, str]:
    key = "listener.security.protocol.map"
    result: dict[str, str] = {}
    for entry in _csv(text):
        name, sep, protocol = entry.partition(":")
        if not sep or not name.strip() or ":" in protocol:
            raise _invalid(
                key, text, f"Map entry '{entry}' is not of the form LISTENER_NAME:SECURITY_PROTOCOL"
            )
        protocol = protocol.strip().upper()
        if protocol not in SECURITY_PROTOCOLS:
            raise _invalid(
                key, text, f"Unknown security protocol {protocol} (one of {', '.join(SECURITY_PROTOCOLS)})"
            )
        result[name.strip().upper()] = protocol
    return result


def parse_listeners(
    key: str, text: str, protocols: Mapping[str, str], controllers: frozenset[str]
) -> list[Listener]:
    """Parse NAME://host:port entries. Controller listeners with no protocol mapping default to PLAINTEXT."""
    listeners: list[Listener] = []
    for entry in _csv(text):
        match = _LISTENER.fullmatch(entry)
        if match is None or not match.group(1):
            raise _invalid(key, text, f"Unable to parse {entry} to a listener (expected NAME://host:port)")
        name, host, port = match.group(1).upper(), match.group(2), int(match.group(3))
        if not 0 <= port <= 65535:
            raise _invalid(key, text, f"Port {port} of listener {name} is not in 0..65535")
        protocol = protocols.get(name)
        if protocol is None:
            if name not in controllers:
                raise _invalid(key, text, f"No security protocol defined for listener {name}")
            protocol = "PLAINTEXT"
        if name not in controllers and protocol not in SUPPORTED_SECURITY_PROTOCOLS:
            raise _invalid(
                key,
                text,
                f"Listener {name} uses security protocol {protocol}; Strom supports only PLAINTEXT for now",
            )
        if any(existing.name == name for existing in listeners):
            raise _invalid(key, text, f"Each listener must have a different name; {name} appears twice")
        listeners.append(Listener(name, host, port, protocol))
    return listeners


_METRICS_LISTENER = re.compile(r"http://\[?([0-9a-zA-Z\-%._:]*)\]?:([0-9]+)/?")


def parse_metrics_listener(text: str) -> tuple[str, int] | None:
    """``metrics.listener``'s (host, port); None when unset. An empty host binds all interfaces."""
    text = text.strip()
    if not text:
        return None
    match = _METRICS_LISTENER.fullmatch(text)
    if match is None:
        raise _invalid("metrics.listener", text, "Unable to parse it (expected http://host:port)")
    port = int(match.group(2))
    if port > 65535:
        raise _invalid("metrics.listener", text, f"Port {port} is not in 0..65535")
    return match.group(1), port


# --- the configuration ---


class KafkaConfig:
    """The broker's effective configuration. Attributes are Kafka's key names with '.' -> '_'."""

    def __init__(
        self,
        supplied: Mapping[str, str],
        dynamic_default: Mapping[str, str] | None = None,
        dynamic_broker: Mapping[str, str] | None = None,
    ) -> None:
        """``supplied``: server.properties and --override; ``dynamic_default`` and ``dynamic_broker``:
        the dynamic configs of the cluster default and of this broker (AlterConfigs). Kafka's
        precedence: this broker's dynamic value, the cluster default's, the static one, the default."""
        self._supplied = dict(supplied)
        self._dynamic_default = dict(dynamic_default or {})
        self._dynamic_broker = dict(dynamic_broker or {})
        self._effective = {**self._supplied, **self._dynamic_default, **self._dynamic_broker}
        for layer in (self._dynamic_default, self._dynamic_broker):
            # Each dynamic layer is valid on its own: a value another layer hides is still checked.
            for name, raw in layer.items():
                if name in BROKER_CONFIGS:
                    self._parse(BROKER_CONFIGS[name], raw)
            try:
                LogConfig.from_props({}, {n: raw for n, raw in layer.items() if n in BROKER_SYNONYMS})
            except InvalidConfigError as exc:
                raise ConfigError(str(exc)) from None
        self._values: dict[str, Value] = {}
        for name, raw in self._effective.items():
            definition = BROKER_CONFIGS.get(name)
            if definition is None:
                log.warning(
                    "unknown configuration '%s' was supplied but isn't a known config; ignoring it", name
                )
                continue
            if not definition.effect:
                log.debug("configuration '%s' is accepted for compatibility and has no effect in Strom", name)
            self._values[name] = self._parse(definition, raw)

        self.node_id: int = self._node_id()

        self.controller_listener_names: list[str] = [
            n.upper() for n in _csv(self._str("controller.listener.names"))
        ]
        controllers = frozenset(self.controller_listener_names)
        self.listener_security_protocol_map: dict[str, str] = parse_security_protocol_map(
            self._str("listener.security.protocol.map")
        )
        protocols = self.listener_security_protocol_map
        self.listeners: list[Listener] = parse_listeners(
            "listeners", self._str("listeners"), protocols, controllers
        )
        served = self.client_listeners()
        if not served:
            raise _invalid(
                "listeners",
                self._str("listeners"),
                "No listener is left once controller listeners (controller.listener.names) are removed",
            )
        ports = [listener.port for listener in self.listeners if listener.port]  # port 0: any free port
        if len(set(ports)) != len(ports):
            raise _invalid("listeners", self._str("listeners"), "Each listener must have a different port")
        skipped = [listener.name for listener in self.listeners if listener.name in controllers]
        if skipped:
            log.warning(
                "listener(s) %s named in controller.listener.names are KRaft controller listeners; "
                "Strom runs no controller and does not serve them",
                ", ".join(skipped),
            )
        self.advertised_listeners: list[Listener] = self._advertised(served, protocols, controllers)
        self.inter_broker_listener_name: str = self._inter_broker_listener_name()

        self.log_dirs: list[str] = self._log_dirs()
        self.num_partitions: int = self._int("num.partitions")
        self.default_replication_factor: int = self._int("default.replication.factor")
        self.auto_create_topics_enable: bool = self._bool("auto.create.topics.enable")
        self.delete_topic_enable: bool = self._bool("delete.topic.enable")

        # The topic defaults, resolved through Kafka's synonyms (log.retention.ms > .minutes > .hours).
        try:
            self.default_log_config: LogConfig = LogConfig.from_props({}, self.log_config_defaults())
        except InvalidConfigError as exc:
            raise ConfigError(str(exc)) from None
        defaults = self.default_log_config
        self.log_segment_bytes: int = defaults.segment_bytes
        self.log_roll_ms: int = defaults.segment_ms
        self.log_roll_jitter_ms: int = defaults.segment_jitter_ms
        self.log_retention_ms: int = defaults.retention_ms
        self.log_retention_bytes: int = defaults.retention_bytes
        self.log_index_interval_bytes: int = defaults.index_interval_bytes
        self.log_index_size_max_bytes: int = defaults.segment_index_bytes
        self.log_flush_interval_messages: int = defaults.flush_messages
        self.log_flush_interval_ms: int = defaults.flush_ms
        self.log_message_timestamp_type: str = defaults.message_timestamp_type
        self.log_message_timestamp_before_max_ms: int = defaults.message_timestamp_before_max_ms
        self.log_message_timestamp_after_max_ms: int = defaults.message_timestamp_after_max_ms
        self.log_cleanup_policy: list[str] = list(defaults.cleanup_policy)
        self.message_max_bytes: int = defaults.max_message_bytes
        self.compression_type: str = defaults.compression_type
        self.compression_gzip_level: int = defaults.compression_gzip_level
        self.compression_lz4_level: int = defaults.compression_lz4_level
        self.compression_zstd_level: int = defaults.compression_zstd_level
        self.min_insync_replicas: int = defaults.min_insync_replicas

        self.log_retention_check_interval_ms: int = self._int("log.retention.check.interval.ms")
        self.log_flush_scheduler_interval_ms: int = self._int("log.flush.scheduler.interval.ms")
        self.log_flush_offset_checkpoint_interval_ms: int = self._int(
            "log.flush.offset.checkpoint.interval.ms"
        )
        self.socket_request_max_bytes: int = self._int("socket.request.max.bytes")
        self.socket_send_buffer_bytes: int = self._int("socket.send.buffer.bytes")
        self.socket_receive_buffer_bytes: int = self._int("socket.receive.buffer.bytes")
        self.connections_max_idle_ms: int = self._int("connections.max.idle.ms")
        self.queued_max_requests: int = self._int("queued.max.requests")
        self.queued_max_request_bytes: int = self._int("queued.max.request.bytes")
        self.max_connections: int = self._int("max.connections")
        self.max_connections_per_ip: int = self._int("max.connections.per.ip")
        self.max_connections_per_ip_overrides: dict[str, int] = self._ip_overrides()
        self.fetch_max_bytes: int = self._int("fetch.max.bytes")
        self.max_request_partition_size_limit: int = self._int("max.request.partition.size.limit")
        self.max_incremental_fetch_session_cache_slots: int = self._int(
            "max.incremental.fetch.session.cache.slots"
        )
        if 0 < self.queued_max_request_bytes < self.socket_request_max_bytes:
            raise ConfigError("queued.max.request.bytes must be larger or equal to socket.request.max.bytes")
        if self.max_connections_per_ip == 0 and not self.max_connections_per_ip_overrides:
            raise ConfigError(
                "max.connections.per.ip can be set to zero only if max.connections.per.ip.overrides property is set."
            )
        self.offsets_topic_num_partitions: int = self._int("offsets.topic.num.partitions")
        self.group_initial_rebalance_delay_ms: int = self._int("group.initial.rebalance.delay.ms")
        self.group_min_session_timeout_ms: int = self._int("group.min.session.timeout.ms")
        self.group_max_session_timeout_ms: int = self._int("group.max.session.timeout.ms")
        self.group_max_size: int = self._int("group.max.size")
        self.offsets_retention_minutes: int = self._int("offsets.retention.minutes")
        self.log_cleaner_enable: bool = self._bool("log.cleaner.enable")
        if self._int("log.cleaner.dedupe.buffer.size") // self._int("log.cleaner.threads") <= 1024 * 1024:
            raise ConfigError("log.cleaner.dedupe.buffer.size must be at least 1MB per cleaner thread.")
        self.cleaner_config: CleanerConfig = CleanerConfig(
            dedupe_buffer_size=self._int("log.cleaner.dedupe.buffer.size"),
            io_buffer_load_factor=self._float("log.cleaner.io.buffer.load.factor"),
            io_buffer_size=self._int("log.cleaner.io.buffer.size"),
            io_max_bytes_per_second=self._float("log.cleaner.io.max.bytes.per.second"),
            backoff_ms=self._int("log.cleaner.backoff.ms"),
        )
        self.offsets_retention_check_interval_ms: int = self._int("offsets.retention.check.interval.ms")
        self.offsets_commit_timeout_ms: int = self._int("offsets.commit.timeout.ms")
        self.offsets_topic_segment_bytes: int = self._int("offsets.topic.segment.bytes")
        self.offset_metadata_max_bytes: int = self._int("offset.metadata.max.bytes")
        self.metrics_listener: tuple[str, int] | None = parse_metrics_listener(self._str("metrics.listener"))
        self.metrics_lag_sample_interval_ms: int = self._int("metrics.lag.sample.interval.ms")
        self.metrics_lag_max_partitions: int = self._int("metrics.lag.max.partitions")
        self.metrics_lag_window_samples: int = self._int("metrics.lag.window.samples")

        self.zookeeper_connect: str | None = self._str("zookeeper.connect") or None
        self.zookeeper_session_timeout_ms: int = self._int("zookeeper.session.timeout.ms")
        self.zookeeper_connection_timeout_ms: int = (
            self._int("zookeeper.connection.timeout.ms")
            if self._value("zookeeper.connection.timeout.ms") is not None
            else self.zookeeper_session_timeout_ms
        )
        self.broker_rack: str | None = self._str("broker.rack") or None
        self.replica_lag_time_max_ms: int = self._int("replica.lag.time.max.ms")
        self.replica_fetch_max_bytes: int = self._int("replica.fetch.max.bytes")
        self.replica_fetch_min_bytes: int = self._int("replica.fetch.min.bytes")
        self.replica_fetch_wait_max_ms: int = self._int("replica.fetch.wait.max.ms")
        self.replica_fetch_backoff_ms: int = self._int("replica.fetch.backoff.ms")
        self.replica_fetch_response_max_bytes: int = self._int("replica.fetch.response.max.bytes")
        self.replica_socket_timeout_ms: int = self._int("replica.socket.timeout.ms")
        self.replica_high_watermark_checkpoint_interval_ms: int = self._int(
            "replica.high.watermark.checkpoint.interval.ms"
        )
        self.num_replica_fetchers: int = self._int("num.replica.fetchers")
        self.unclean_leader_election_enable: bool = self._bool("unclean.leader.election.enable")
        self.controlled_shutdown_enable: bool = self._bool("controlled.shutdown.enable")
        self.controlled_shutdown_max_retries: int = self._int("controlled.shutdown.max.retries")
        self.controlled_shutdown_retry_backoff_ms: int = self._int("controlled.shutdown.retry.backoff.ms")
        self.controller_socket_timeout_ms: int = self._int("controller.socket.timeout.ms")
        if self.replica_fetch_wait_max_ms > self.replica_socket_timeout_ms:
            raise ConfigError(
                "replica.socket.timeout.ms should always be at least replica.fetch.wait.max.ms "
                "to prevent unnecessary socket timeouts"
            )
        if self.replica_fetch_wait_max_ms > self.replica_lag_time_max_ms:
            raise ConfigError(
                "replica.fetch.wait.max.ms should always be less than or equal to replica.lag.time.max.ms "
                "to prevent frequent changes in ISR"
            )
        self.auto_leader_rebalance_enable: bool = self._bool("auto.leader.rebalance.enable")
        self.leader_imbalance_check_interval_seconds: int = self._int(
            "leader.imbalance.check.interval.seconds"
        )
        self.leader_imbalance_per_broker_percentage: int = self._int("leader.imbalance.per.broker.percentage")
        self.offsets_topic_replication_factor: int = self._int("offsets.topic.replication.factor")
        self.transaction_state_log_replication_factor: int = self._int(
            "transaction.state.log.replication.factor"
        )
        self.transaction_state_log_min_isr: int = self._int("transaction.state.log.min.isr")
        self.transaction_state_log_num_partitions: int = self._int("transaction.state.log.num.partitions")
        self.transaction_state_log_segment_bytes: int = self._int("transaction.state.log.segment.bytes")
        self.transactional_id_expiration_ms: int = self._int("transactional.id.expiration.ms")
        self.transaction_max_timeout_ms: int = self._int("transaction.max.timeout.ms")
        self.request_timeout_ms: int = self._int("request.timeout.ms")
        self.transaction_abort_timed_out_interval_ms: int = self._int(
            "transaction.abort.timed.out.transaction.cleanup.interval.ms"
        )
        self.transaction_remove_expired_interval_ms: int = self._int(
            "transaction.remove.expired.transaction.cleanup.interval.ms"
        )

    @property
    def in_cluster(self) -> bool:
        """zookeeper.connect is set: the broker is a member of a cluster coordinated by ZooKeeper."""
        return self.zookeeper_connect is not None

    def with_dynamic(
        self, dynamic_default: Mapping[str, str], dynamic_broker: Mapping[str, str]
    ) -> KafkaConfig:
        """This static configuration under other dynamic configs; ConfigError if they are invalid."""
        return KafkaConfig(self._supplied, dynamic_default, dynamic_broker)

    def dynamic_configs(self, cluster_default: bool) -> dict[str, str]:
        """The dynamic configs set on the cluster default, or on this broker."""
        return dict(self._dynamic_default if cluster_default else self._dynamic_broker)

    def adopt(self, other: KafkaConfig) -> None:
        """Take ``other``'s values in place: whoever holds this object sees the new configuration."""
        state = vars(self)
        state.clear()
        state.update(vars(other))

    @classmethod
    def from_sources(
        cls, properties: Mapping[str, str] | None = None, overrides: Mapping[str, str] | None = None
    ) -> KafkaConfig:
        """The configuration from server.properties content and --override pairs (overrides win)."""
        return cls({**(properties or {}), **(overrides or {})})

    # --- access ---

    def get(self, name: str) -> str | None:
        """The raw value in effect for ``name`` (known or not), else the key's default, else None."""
        if name in self._effective:
            return self._effective[name]
        definition = BROKER_CONFIGS.get(name)
        return definition.default if definition else None

    def client_listeners(self) -> list[Listener]:
        """The listeners Strom serves: ``listeners`` minus the controller listeners."""
        controllers = set(self.controller_listener_names)
        return [listener for listener in self.listeners if listener.name not in controllers]

    def advertised_client_listener(self, listener_name: str | None = None) -> Listener:
        """The endpoint advertised to clients of ``listener_name`` (default: of the first client listener).

        Its host may be empty and its port 0 when listeners say so; the server then fills in its host name
        and bound port.
        """
        wanted = listener_name.upper() if listener_name else self.client_listeners()[0].name
        for listener in self.advertised_listeners:
            if listener.name == wanted:
                return listener
        return self.advertised_listeners[0]

    def log_config_defaults(self) -> dict[str, str]:
        """The broker keys set explicitly (statically or dynamically) that supply topic defaults;
        what LogConfig.from_props takes."""
        return {name: raw.strip() for name, raw in self._effective.items() if name in BROKER_SYNONYMS}

    def log_config_sources(self) -> dict[str, ConfigSource]:
        """Where each key of ``log_config_defaults`` comes from, as DescribeConfigs reports it."""
        return {name: self._source(name) for name in self.log_config_defaults()}

    def _source(self, name: str) -> ConfigSource:
        if name in self._dynamic_broker:
            return ConfigSource.DYNAMIC_BROKER_CONFIG
        if name in self._dynamic_default:
            return ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG
        return ConfigSource.STATIC_BROKER_CONFIG

    @property
    def offsets_retention_ms(self) -> int:
        return self.offsets_retention_minutes * 60_000

    # --- DescribeConfigs ---

    def describe(self) -> list[ConfigEntry]:
        """DescribeConfigs for this broker's BROKER resource: every known key plus any unknown supplied key.

        Values set on this broker dynamically have source DYNAMIC_BROKER_CONFIG, on the cluster default
        DYNAMIC_DEFAULT_BROKER_CONFIG, in server.properties/--override STATIC_BROKER_CONFIG, the rest
        DEFAULT_CONFIG; unknown keys are reported as Kafka does, as sensitive values of unknown type.
        """
        entries = [self._describe_known(d) for d in BROKER_CONFIGS.values()]
        for name in sorted(set(self._supplied) - set(BROKER_CONFIGS)):
            synonym = ConfigSynonym(name, None, ConfigSource.STATIC_BROKER_CONFIG)
            entries.append(
                ConfigEntry(
                    name,
                    None,
                    ConfigSource.STATIC_BROKER_CONFIG,
                    True,
                    True,
                    CONFIG_TYPE_UNKNOWN,
                    None,
                    (synonym,),
                )
            )
        return entries

    def describe_cluster_default(self) -> list[ConfigEntry]:
        """DescribeConfigs of the cluster-default BROKER resource (name ""): as Kafka, only the keys set
        there, each with its cluster-default synonyms."""
        entries = []
        for name in sorted(self._dynamic_default):
            definition = BROKER_CONFIGS[name]
            group = _SYNONYM_GROUPS.get(name, (name,))
            synonyms = [
                ConfigSynonym(
                    n, self._render(n, self._dynamic_default[n]), ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG
                )
                for n in group
                if n in self._dynamic_default
            ]
            while synonyms[0].name != name:
                synonyms.pop(0)
            sensitive = definition.type is ConfigType.PASSWORD
            entries.append(
                ConfigEntry(
                    name=name,
                    value=None if sensitive else synonyms[0].value,
                    source=ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG,
                    is_sensitive=sensitive,
                    read_only=not definition.dynamic,
                    config_type=definition.type.id,
                    documentation=definition.doc,
                    synonyms=tuple(synonyms),
                )
            )
        return entries

    @staticmethod
    def _render(name: str, raw: str) -> str:
        definition = BROKER_CONFIGS[name]
        return render_value(parse_value(name, raw, definition.type), definition.type) or ""

    def _describe_known(self, definition: BrokerConfigDef) -> ConfigEntry:
        name = definition.name
        group = _SYNONYM_GROUPS.get(name, (name,))
        supplied = dict(self._values)
        static = {n: self._render(n, raw) for n, raw in self._supplied.items() if n in BROKER_CONFIGS}
        if "node.id" in supplied or "broker.id" in supplied:
            # Kafka copies node.id and broker.id into each other: both report the id in use.
            supplied["node.id"] = supplied["broker.id"] = self.node_id
            static["node.id"] = static["broker.id"] = str(self.node_id)
        value = render_value(supplied[name], definition.type) if name in supplied else definition.default
        if name in ("node.id", "broker.id"):
            value = str(self.node_id)  # -1 (unset) means 0 in Strom
        # As Kafka lists them: every synonym set on this broker dynamically, then on the cluster
        # default, then statically, then the defaults.
        layers = (
            (
                {n: self._render(n, raw) for n, raw in self._dynamic_broker.items()},
                ConfigSource.DYNAMIC_BROKER_CONFIG,
            ),
            (
                {n: self._render(n, raw) for n, raw in self._dynamic_default.items()},
                ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG,
            ),
            (static, ConfigSource.STATIC_BROKER_CONFIG),
        )
        synonyms = [
            ConfigSynonym(n, layer[n], source) for layer, source in layers for n in group if n in layer
        ]
        synonyms += [
            ConfigSynonym(n, BROKER_CONFIGS[n].default, ConfigSource.DEFAULT_CONFIG)
            for n in group
            if BROKER_CONFIGS[n].default is not None
        ]
        while synonyms and synonyms[0].name != name:
            synonyms.pop(0)  # as Kafka: a key's synonyms start at the key itself
        sensitive = definition.type is ConfigType.PASSWORD
        return ConfigEntry(
            name=name,
            value=None if sensitive else value,
            source=synonyms[0].source if synonyms else ConfigSource.DEFAULT_CONFIG,
            is_sensitive=sensitive,
            read_only=not definition.dynamic,
            config_type=definition.type.id,
            documentation=definition.doc,
            synonyms=tuple(synonyms),
        )

    # --- helpers ---

    @staticmethod
    def _parse(definition: BrokerConfigDef, raw: str) -> Value:
        try:
            value = parse_value(definition.name, raw, definition.type)
            if definition.validator is not None:
                definition.validator.check(definition.name, value)
        except InvalidConfigError as exc:
            raise ConfigError(str(exc)) from None
        return value

    def _value(self, name: str) -> Value:
        if name in self._values:
            return self._values[name]
        definition = BROKER_CONFIGS[name]
        return None if definition.default is None else parse_value(name, definition.default, definition.type)

    def _int(self, name: str) -> int:
        value = self._value(name)
        assert isinstance(value, int) and not isinstance(value, bool), name
        return value

    def _float(self, name: str) -> float:
        value = self._value(name)
        assert isinstance(value, float), name
        return value

    def _bool(self, name: str) -> bool:
        value = self._value(name)
        assert isinstance(value, bool), name
        return value

    def _str(self, name: str) -> str:
        value = self._value(name)
        assert value is None or isinstance(value, str), name
        return value or ""

    def _ip_overrides(self) -> dict[str, int]:
        """max.connections.per.ip.overrides: ``host:count`` pairs separated by commas."""
        overrides: dict[str, int] = {}
        for entry in (e.strip() for e in self._str("max.connections.per.ip.overrides").split(",")):
            host, sep, count = entry.rpartition(":")
            if not entry:
                continue
            if not sep or not host.strip() or not count.strip().isdigit():
                raise ConfigError(
                    f"Invalid value {entry} for configuration max.connections.per.ip.overrides: "
                    "expected host:count"
                )
            overrides[host.strip().strip("[]")] = int(count)
        return overrides

    def _node_id(self) -> int:
        node_id, broker_id = self._int("node.id"), self._int("broker.id")
        if node_id >= 0 and broker_id >= 0 and node_id != broker_id:
            raise ConfigError(
                f"Invalid value {broker_id} for configuration broker.id: "
                f"it must be equal to node.id ({node_id}) when both are set"
            )
        # A single node needs no id assignment: Strom uses 0 when neither is set.
        return max(node_id, broker_id, 0)

    def _advertised(
        self, served: list[Listener], protocols: Mapping[str, str], controllers: frozenset[str]
    ) -> list[Listener]:
        text = self._str("advertised.listeners")
        if not text.strip():
            return list(served)
        parsed = parse_listeners("advertised.listeners", text, protocols, controllers)
        advertised = [listener for listener in parsed if listener.name not in controllers]
        if not advertised:
            raise _invalid(
                "advertised.listeners", text, "No listener is left once controller listeners are removed"
            )
        served_names = {listener.name for listener in served}
        for listener in advertised:
            if listener.name not in served_names:
                raise _invalid(
                    "advertised.listeners",
                    text,
                    f"Listener {listener.name} is not one of the listeners "
                    f"({', '.join(sorted(served_names))})",
                )
            if listener.host == "0.0.0.0":
                raise _invalid(
                    "advertised.listeners",
                    text,
                    "advertised.listeners cannot use the nonroutable meta-address 0.0.0.0. "
                    "Use a routable IP address.",
                )
        return advertised

    def _inter_broker_listener_name(self) -> str:
        advertised = [listener.name for listener in self.advertised_listeners]
        explicit = self._str("inter.broker.listener.name").strip().upper()
        if explicit:
            if explicit not in advertised:
                raise _invalid(
                    "inter.broker.listener.name",
                    explicit,
                    "inter.broker.listener.name must be a listener name defined in advertised.listeners. "
                    f"The valid options based on currently configured listeners are {','.join(advertised)}",
                )
            return explicit
        by_protocol = self._str("security.inter.broker.protocol").upper()
        return by_protocol if by_protocol in advertised else advertised[0]

    def _log_dirs(self) -> list[str]:
        key = "log.dirs" if self._str("log.dirs").strip() else "log.dir"
        dirs = _csv(self._str(key))
        if not dirs:
            raise _invalid(
                key, self._str(key), "At least one log directory must be defined via log.dirs or log.dir"
            )
        if len(set(dirs)) != len(dirs):
            raise _invalid(key, self._str(key), "Duplicate log directory found")
        return dirs

    def __repr__(self) -> str:
        return f"KafkaConfig(node_id={self.node_id}, listeners={[str(x) for x in self.listeners]})"
