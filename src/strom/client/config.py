"""Client configuration under the Java client's names, types and defaults.

A client takes a mapping such as ``{"bootstrap.servers": "127.0.0.1:9092", "linger.ms": 5}``;
values may be given typed or as strings (as a properties file or the command line has
them). An unknown key or an invalid value raises ConfigException at construction, as the
Java client does, rather than being silently ignored.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from strom.client.errors import ConfigException

Validator = Callable[[Any], bool]


@dataclass(frozen=True, slots=True)
class ConfigKey:
    name: str
    type: type[Any]  # int, float, bool, str or list (a comma-separated list of strings)
    default: Any
    valid: Validator | None = None
    choices: tuple[str, ...] = ()
    nullable: bool = False


def _at_least(minimum: float) -> Validator:
    return lambda value: value >= minimum


def _between(low: float, high: float) -> Validator:
    return lambda value: low <= value <= high


_MAX_INT = 2**31 - 1

COMMON: tuple[ConfigKey, ...] = (
    ConfigKey("bootstrap.servers", list, None),
    ConfigKey("client.id", str, ""),
    ConfigKey(
        "client.dns.lookup",
        str,
        "use_all_dns_ips",
        choices=("use_all_dns_ips", "resolve_canonical_bootstrap_servers_only"),
    ),
    ConfigKey("request.timeout.ms", int, 30_000, _at_least(0)),
    ConfigKey("metadata.max.age.ms", int, 300_000, _at_least(0)),
    ConfigKey("retry.backoff.ms", int, 100, _at_least(0)),
    ConfigKey("retry.backoff.max.ms", int, 1000, _at_least(0)),
    ConfigKey("reconnect.backoff.ms", int, 50, _at_least(0)),
    ConfigKey("reconnect.backoff.max.ms", int, 1000, _at_least(0)),
    ConfigKey("socket.connection.setup.timeout.ms", int, 10_000, _at_least(0)),
    ConfigKey("socket.connection.setup.timeout.max.ms", int, 30_000, _at_least(0)),
    ConfigKey("connections.max.idle.ms", int, 540_000),
    ConfigKey("security.protocol", str, "PLAINTEXT", choices=("PLAINTEXT",)),
)

PRODUCER: tuple[ConfigKey, ...] = (
    *COMMON,
    ConfigKey("acks", str, "all", choices=("all", "-1", "0", "1")),
    ConfigKey("linger.ms", int, 5, _at_least(0)),
    ConfigKey("batch.size", int, 16_384, _at_least(0)),
    ConfigKey("buffer.memory", int, 33_554_432, _at_least(0)),
    ConfigKey("max.block.ms", int, 60_000, _at_least(0)),
    ConfigKey("max.request.size", int, 1_048_576, _at_least(0)),
    ConfigKey("compression.type", str, "none", choices=("none", "gzip", "snappy", "lz4", "zstd")),
    ConfigKey("compression.gzip.level", int, -1, _between(-1, 9)),
    ConfigKey("compression.lz4.level", int, 9, _between(1, 17)),
    ConfigKey("compression.zstd.level", int, 3, _between(-131072, 22)),
    ConfigKey("retries", int, _MAX_INT, _at_least(0)),
    ConfigKey("delivery.timeout.ms", int, 120_000, _at_least(0)),
    ConfigKey("enable.idempotence", bool, True),
    ConfigKey("max.in.flight.requests.per.connection", int, 5, _at_least(1)),
    ConfigKey("partitioner.class", str, "default", choices=("default", "murmur2_random", "round_robin")),
    ConfigKey("partitioner.ignore.keys", bool, False),
    ConfigKey("partitioner.adaptive.partitioning.enable", bool, True),
    ConfigKey("partitioner.availability.timeout.ms", int, 0, _at_least(0)),
    ConfigKey("transactional.id", str, None, nullable=True),
    ConfigKey("transaction.timeout.ms", int, 60_000, _at_least(0)),
    ConfigKey("metadata.max.idle.ms", int, 300_000, _at_least(5000)),
    ConfigKey("allow.auto.create.topics", bool, True),
)

CONSUMER: tuple[ConfigKey, ...] = (
    *COMMON,
    ConfigKey("group.id", str, None, nullable=True),
    ConfigKey("group.instance.id", str, None, nullable=True),
    ConfigKey("group.protocol", str, "classic", choices=("classic",)),
    ConfigKey("session.timeout.ms", int, 45_000, _at_least(0)),
    ConfigKey("heartbeat.interval.ms", int, 3000, _at_least(0)),
    ConfigKey("max.poll.interval.ms", int, 300_000, _at_least(1)),
    ConfigKey("max.poll.records", int, 500, _at_least(1)),
    ConfigKey("rebalance.timeout.ms", int, None, nullable=True),
    ConfigKey(
        "partition.assignment.strategy",
        list,
        ["range", "cooperative-sticky"],
    ),
    ConfigKey("enable.auto.commit", bool, True),
    ConfigKey("auto.commit.interval.ms", int, 5000, _at_least(0)),
    ConfigKey("auto.offset.reset", str, "latest", choices=("latest", "earliest", "none")),
    ConfigKey("isolation.level", str, "read_uncommitted", choices=("read_uncommitted", "read_committed")),
    ConfigKey("fetch.min.bytes", int, 1, _at_least(0)),
    ConfigKey("fetch.max.bytes", int, 52_428_800, _at_least(0)),
    ConfigKey("fetch.max.wait.ms", int, 500, _at_least(0)),
    ConfigKey("max.partition.fetch.bytes", int, 1_048_576, _at_least(0)),
    ConfigKey("check.crcs", bool, True),
    ConfigKey("exclude.internal.topics", bool, True),
    ConfigKey("allow.auto.create.topics", bool, True),
    ConfigKey("client.rack", str, ""),
    ConfigKey("default.api.timeout.ms", int, 60_000, _at_least(0)),
)

ADMIN: tuple[ConfigKey, ...] = (
    *COMMON,
    ConfigKey("default.api.timeout.ms", int, 60_000, _at_least(0)),
    ConfigKey("retries", int, _MAX_INT, _at_least(0)),
)


def _parse(key: ConfigKey, value: Any) -> Any:
    if value is None:
        if key.nullable or key.default is None:
            return None
        raise ConfigException(f"invalid value None for configuration {key.name}")
    try:
        if key.type is bool:
            if isinstance(value, str):
                lowered = value.strip().lower()
                if lowered not in ("true", "false"):
                    raise ValueError(value)
                return lowered == "true"
            if not isinstance(value, bool):
                raise ValueError(value)
            return value
        if key.type is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError(value)
            return int(value.strip()) if isinstance(value, str) else int(value)
        if key.type is float:
            return float(value)
        if key.type is list:
            items = value.split(",") if isinstance(value, str) else list(value)
            return [str(item).strip() for item in items if str(item).strip()]
        return str(value).strip()
    except (TypeError, ValueError) as exc:
        raise ConfigException(
            f"invalid value {value!r} for configuration {key.name}: expected {key.type.__name__}"
        ) from exc


_client_numbers = itertools.count(1)


def resolve(definitions: tuple[ConfigKey, ...], values: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """Every key of ``definitions``: given values parsed and checked, the rest at their defaults.

    ``kind`` (producer, consumer, adminclient) names the client when ``client.id`` is
    not set, as ``producer-1`` in the Java client.
    """
    by_name = {key.name: key for key in definitions}
    unknown = sorted(set(values) - set(by_name))
    if unknown:
        raise ConfigException(f"unknown configuration {', '.join(unknown)}")
    resolved: dict[str, Any] = {}
    for key in definitions:
        value = _parse(key, values[key.name]) if key.name in values else key.default
        if value is not None:
            if key.choices and value not in key.choices:
                raise ConfigException(
                    f"invalid value {value!r} for configuration {key.name}: one of {', '.join(key.choices)}"
                )
            if key.valid is not None and not key.valid(value):
                raise ConfigException(f"invalid value {value!r} for configuration {key.name}")
        resolved[key.name] = value
    if not resolved.get("bootstrap.servers"):
        raise ConfigException("bootstrap.servers must name at least one broker")
    if not resolved["client.id"]:
        resolved["client.id"] = f"{kind}-{next(_client_numbers)}"
    return resolved
